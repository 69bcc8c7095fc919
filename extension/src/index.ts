/**
 * torchtpu-lab: a status bar item and a side panel for the active notebook's torchtpu_lab session.
 *
 * Each notebook's kernel connection gets a KernelLink (the `torchtpu_lab` comm); the status bar item and the
 * panel follow the link of the notebook in focus, so switching notebooks switches what they show.
 */

import { ILabShell, JupyterFrontEnd, JupyterFrontEndPlugin } from '@jupyterlab/application';
import { INotebookTracker, NotebookPanel } from '@jupyterlab/notebook';
import { Kernel } from '@jupyterlab/services';
import { IStatusBar } from '@jupyterlab/statusbar';

import { installGoto } from './goto';
import { KernelLink } from './link';
import { TpuPanel, TpuStatusItem } from './widgets';

const links = new Map<Kernel.IKernelConnection, KernelLink>();

function linkFor(kernel: Kernel.IKernelConnection | null | undefined): KernelLink | null {
  if (!kernel || kernel.isDisposed) {
    return null;
  }
  let link = links.get(kernel);
  if (!link) {
    link = new KernelLink(kernel);
    links.set(kernel, link);
    kernel.disposed.connect(() => {
      links.get(kernel)?.dispose();
      links.delete(kernel);
    });
  }
  return link;
}

const plugin: JupyterFrontEndPlugin<void> = {
  id: 'torchtpu-lab:plugin',
  description: 'Status bar item and side panel for torchtpu_lab (the tpu device) notebook kernels.',
  autoStart: true,
  requires: [INotebookTracker],
  optional: [IStatusBar, ILabShell],
  activate: (
    app: JupyterFrontEnd,
    tracker: INotebookTracker,
    statusBar: IStatusBar | null,
    labShell: ILabShell | null
  ) => {
    const item = new TpuStatusItem();
    const panel = new TpuPanel();
    app.shell.add(panel, 'right', { rank: 900 });

    if (statusBar) {
      statusBar.registerStatusItem('torchtpu-lab:status', {
        item,
        align: 'left',
        rank: 5,
        isActive: () => item.active,
        activeStateChanged: item.activeStateChanged
      });
    }

    const follow = (): void => {
      const nb: NotebookPanel | null = tracker.currentWidget;
      const link = nb ? linkFor(nb.sessionContext.session?.kernel) : null;
      const label = nb ? nb.context.path : '';
      item.setLink(link);
      panel.setLink(link, label);
    };

    tracker.widgetAdded.connect((_, nb: NotebookPanel) => {
      // register the comm target as soon as the kernel exists, before any %load_ext can run
      const attach = (): void => {
        linkFor(nb.sessionContext.session?.kernel);
        if (tracker.currentWidget === nb) {
          follow();
        }
      };
      nb.sessionContext.kernelChanged.connect(attach);
      nb.sessionContext.ready.then(attach).catch(() => undefined);
      attach();
    });
    installGoto(tracker); // "cell [N], line L" in a report jumps to the cell
    tracker.currentChanged.connect(follow);
    labShell?.currentChanged.connect(follow);
    follow();
  }
};

export default plugin;
