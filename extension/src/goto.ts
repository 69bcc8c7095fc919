/**
 * "cell [N], line L" in a %%tpu_profile report jumps to that cell and line.
 *
 * The report writes each such label as `<a class="ttl-goto" data-cell="N" data-line="L">` (no href: without
 * this extension it is plain text). One click (or Enter) listener on the document finds the notebook that holds
 * the clicked report, the code cell whose prompt is [N], selects it, scrolls it into view and puts the cursor
 * on line L. A cell that was re-run (its prompt changed) or deleted cannot be found: a notification says so.
 */

import { Notification } from '@jupyterlab/apputils';
import { Cell, ICodeCellModel } from '@jupyterlab/cells';
import { INotebookTracker, NotebookPanel } from '@jupyterlab/notebook';

import { parseGoto } from './model';

const FLASH_MS = 1500;

function notebookOf(tracker: INotebookTracker, node: Element): NotebookPanel | null {
  return tracker.find(panel => panel.node.contains(node)) ?? tracker.currentWidget;
}

/** Select cell [cell] of `panel`, scroll to it and put the cursor on `line`; false when no cell has that prompt. */
export async function jumpTo(panel: NotebookPanel, cell: number, line: number): Promise<boolean> {
  const nb = panel.content;
  const index = nb.widgets.findIndex(
    (c: Cell) => c.model.type === 'code' && (c.model as ICodeCellModel).executionCount === cell
  );
  if (index < 0) {
    return false;
  }
  const target = nb.widgets[index];
  nb.activeCellIndex = index;
  nb.deselectAll();
  await nb.scrollToCell(target, 'center');
  nb.mode = 'edit';
  const editor = target.editor;
  if (editor) {
    const last = Math.max(0, editor.lineCount - 1);
    editor.setCursorPosition({ line: Math.min(line - 1, last), column: 0 });
    editor.focus();
  }
  target.node.classList.add('jp-torchtpu-flash');
  setTimeout(() => target.node.classList.remove('jp-torchtpu-flash'), FLASH_MS);
  return true;
}

/** Handle clicks (and Enter) on report links in every notebook; returns the function that stops it. */
export function installGoto(tracker: INotebookTracker): () => void {
  const handle = (event: Event): void => {
    if (event instanceof KeyboardEvent && event.key !== 'Enter') {
      return;
    }
    const link = (event.target as Element | null)?.closest?.('a.ttl-goto') as HTMLElement | null;
    const where = link ? parseGoto(link.dataset.cell, link.dataset.line) : null;
    if (!link || !where) {
      return;
    }
    event.preventDefault();
    event.stopPropagation();
    const panel = notebookOf(tracker, link);
    if (!panel) {
      return;
    }
    void jumpTo(panel, where.cell, where.line).then(found => {
      if (!found) {
        Notification.warning(
          `cell [${where.cell}] is not in ${panel.context.path} any more: it was re-run (its prompt changed) or deleted`,
          { autoClose: 5000 }
        );
      }
    });
  };
  document.addEventListener('click', handle);
  document.addEventListener('keydown', handle);
  return () => {
    document.removeEventListener('click', handle);
    document.removeEventListener('keydown', handle);
  };
}
