/**
 * The status bar item and the side panel. Every piece of kernel data goes into the DOM as text
 * (textContent / SVG attributes holding numbers we computed), never as HTML.
 */

import { Dialog, showDialog } from '@jupyterlab/apputils';
import { LabIcon } from '@jupyterlab/ui-components';
import { ISignal, Signal } from '@lumino/signaling';
import { Widget } from '@lumino/widgets';

import { KernelLink } from './link';
import {
  chartAxes,
  chartTop,
  clearCacheQuestion,
  compareLines,
  compileLines,
  compilingText,
  EAGER_MODES,
  formatBytes,
  hardwareLines,
  memoryPolyline,
  ownerLines,
  peakMarkers,
  profileLines,
  programLines,
  rankLine,
  statusBarParts,
  statusBarTitle,
  summaryLines
} from './model';

/** How often a "compiling… N s" display counts on (ms). */
const TICK_MS = 500;

const SVG_NS = 'http://www.w3.org/2000/svg';

export const tpuIcon = new LabIcon({
  name: 'torchtpu-lab:chip',
  svgstr:
    '<svg xmlns="http://www.w3.org/2000/svg" width="16" height="16" viewBox="0 0 24 24">' +
    '<g class="jp-icon3" fill="#616161"><path d="M7 7h10v10H7z" fill-opacity="0.35"/>' +
    '<path d="M9 2h2v3H9zm4 0h2v3h-2zM9 19h2v3H9zm4 0h2v3h-2zM2 9h3v2H2zm0 4h3v2H2zm17-4h3v2h-3zm0 4h3v2h-3z' +
    'M5 5h14v14H5zm2 2v10h10V7z"/></g></svg>'
});

function el<K extends keyof HTMLElementTagNameMap>(tag: K, className: string, text?: string): HTMLElementTagNameMap[K] {
  const node = document.createElement(tag);
  node.className = className;
  if (text !== undefined) {
    node.textContent = text;
  }
  return node;
}

/** Follows one KernelLink at a time (the active notebook's); subclasses render it. */
abstract class LinkView extends Widget {
  get link(): KernelLink | null {
    return this._link;
  }

  setLink(link: KernelLink | null, label = ''): void {
    if (this._link === link && this._label === label) {
      return;
    }
    if (this._link && !this._link.isDisposed) {
      this._link.changed.disconnect(this._onChanged, this);
    }
    this._link = link;
    this._label = label;
    if (link) {
      link.changed.connect(this._onChanged, this);
    }
    this.render();
  }

  protected get label(): string {
    return this._label;
  }

  private _onChanged(): void {
    this.render();
  }

  protected abstract render(): void;

  /** Re-render every TICK_MS while the kernel compiles (the seconds count on), and stop after. */
  protected tickWhileCompiling(): void {
    const compiling = this._link?.compiling ?? null;
    if (compiling && this._tick === null) {
      this._tick = setInterval(() => this.render(), TICK_MS);
    } else if (!compiling && this._tick !== null) {
      clearInterval(this._tick);
      this._tick = null;
    }
  }

  dispose(): void {
    if (this._tick !== null) {
      clearInterval(this._tick);
      this._tick = null;
    }
    super.dispose();
  }

  private _link: KernelLink | null = null;
  private _label = '';
  private _tick: ReturnType<typeof setInterval> | null = null;
}

/** The status bar item: `tpu XLA:CPU · fused · 1.00 MiB / n/a · cache 50% (2 compiles)`; hidden when unloaded. */
export class TpuStatusItem extends LinkView {
  constructor() {
    super();
    this.addClass('jp-torchtpu-status');
    this.node.textContent = '';
    this.render();
  }

  get active(): boolean {
    return this.link?.status != null;
  }

  get activeStateChanged(): ISignal<this, void> {
    return this._activeStateChanged;
  }

  protected render(): void {
    const status = this.link?.status ?? null;
    const compiling = status ? (this.link?.compiling ?? null) : null;
    if (status) {
      // one inline line of parts (the item itself is a flex box that centres it vertically)
      const line = el('span', 'jp-torchtpu-status-text');
      line.append(
        ...statusBarParts(status, compiling).map((p, i) =>
          el('span', p.optional ? 'jp-torchtpu-optional' : '', (i ? ' · ' : '') + p.text)
        )
      );
      this.node.replaceChildren(line);
      this.node.title = statusBarTitle(status);
    } else {
      this.node.textContent = '';
      this.node.title = '';
    }
    this.node.classList.toggle('jp-mod-compiling', compiling !== null);
    this.tickWhileCompiling();
    if (this._wasActive !== this.active) {
      this._wasActive = this.active;
      this._activeStateChanged.emit();
    }
  }

  private _wasActive = false;
  private _activeStateChanged = new Signal<this, void>(this);
}

/** The side panel: summary, actions, memory chart, recent compilations and the last %%tpu_profile. */
export class TpuPanel extends LinkView {
  constructor() {
    super();
    this.id = 'torchtpu-lab-panel';
    this.addClass('jp-torchtpu-panel');
    this.title.icon = tpuIcon;
    this.title.caption = 'torchtpu_lab: the tpu session of the active notebook';

    const header = el('div', 'jp-torchtpu-header', 'torchtpu_lab');
    this._session = el('div', 'jp-torchtpu-session');
    this._empty = el('div', 'jp-torchtpu-empty');
    this._body = el('div', 'jp-torchtpu-body');

    this._summary = el('pre', 'jp-torchtpu-summary');
    const actions = el('div', 'jp-torchtpu-actions');
    const modeLabel = el('span', 'jp-torchtpu-label', 'eager mode:');
    actions.appendChild(modeLabel);
    for (const mode of EAGER_MODES) {
      const button = el('button', 'jp-torchtpu-button jp-torchtpu-mode', mode);
      button.dataset.mode = mode;
      button.addEventListener('click', () => this.link?.request('set_mode', mode));
      this._modeButtons.push(button);
      actions.appendChild(button);
    }
    const clear = el('button', 'jp-torchtpu-button jp-torchtpu-clear-cache', 'clear compile cache');
    clear.addEventListener('click', () => void this._confirmClear());
    const refresh = el('button', 'jp-torchtpu-button jp-torchtpu-refresh', 'refresh');
    refresh.addEventListener('click', () => this.link?.request('status'));
    const actions2 = el('div', 'jp-torchtpu-actions');
    actions2.append(clear, refresh);
    this._message = el('div', 'jp-torchtpu-message');

    this._svg = document.createElementNS(SVG_NS, 'svg');
    this._svg.setAttribute('class', 'jp-torchtpu-chart');
    this._svg.setAttribute('viewBox', `0 0 ${CHART_W} ${CHART_H}`);
    this._svg.setAttribute('preserveAspectRatio', 'none');
    this._line = document.createElementNS(SVG_NS, 'polyline');
    this._line.setAttribute('fill', 'none');
    this._line.setAttribute('stroke-width', '1.5');
    this._line.setAttribute('vector-effect', 'non-scaling-stroke');
    for (const [x1, y1, x2, y2] of [
      [0, 0, 0, CHART_H],
      [0, CHART_H, CHART_W, CHART_H]
    ]) {
      // the axes: bytes up the left side, time along the bottom
      const axis = document.createElementNS(SVG_NS, 'line');
      axis.setAttribute('class', 'jp-torchtpu-axis');
      axis.setAttribute('x1', String(x1));
      axis.setAttribute('y1', String(y1));
      axis.setAttribute('x2', String(x2));
      axis.setAttribute('y2', String(y2));
      axis.setAttribute('vector-effect', 'non-scaling-stroke');
      this._svg.appendChild(axis);
    }
    this._svg.appendChild(this._line);
    this._peaks = document.createElementNS(SVG_NS, 'g');
    this._peaks.setAttribute('class', 'jp-torchtpu-peaks');
    this._svg.appendChild(this._peaks);
    this._yTop = el('div', 'jp-torchtpu-axis-label jp-torchtpu-y-top');
    this._yBottom = el('div', 'jp-torchtpu-axis-label jp-torchtpu-y-bottom');
    this._xLeft = el('span', 'jp-torchtpu-axis-label jp-torchtpu-x-left');
    this._xRight = el('span', 'jp-torchtpu-axis-label jp-torchtpu-x-right');
    const yAxis = el('div', 'jp-torchtpu-y-axis');
    yAxis.append(this._yTop, this._yBottom);
    const chartRow = el('div', 'jp-torchtpu-chart-row');
    chartRow.append(yAxis, this._svg);
    const xAxis = el('div', 'jp-torchtpu-x-axis');
    xAxis.append(this._xLeft, this._xRight);
    this._chart = el('div', 'jp-torchtpu-chart-box');
    this._chart.append(chartRow, xAxis);
    this._chartCaption = el('div', 'jp-torchtpu-caption');

    this._compiles = el('ol', 'jp-torchtpu-compiles');
    this._profile = el('div', 'jp-torchtpu-profile');
    this._compiling = el('div', 'jp-torchtpu-compiling');
    this._ranksHead = el('h3', 'jp-torchtpu-h', 'ranks of the last launch()');
    this._ranks = el('ul', 'jp-torchtpu-ranks');

    this._body.append(
      this._compiling,
      this._summary,
      actions,
      actions2,
      this._message,
      el('h3', 'jp-torchtpu-h', 'device memory over time'),
      this._chart,
      this._chartCaption,
      this._ranksHead,
      this._ranks,
      el('h3', 'jp-torchtpu-h', 'recent compilations'),
      this._compiles,
      el('h3', 'jp-torchtpu-h', 'last %%tpu_profile'),
      this._profile
    );
    this.node.append(header, this._session, this._empty, this._body);
    this.render();
  }

  protected render(): void {
    const link = this.link;
    const status = link?.status ?? null;
    this._session.textContent = this.label ? `notebook: ${this.label}` : 'no notebook';
    if (!status) {
      this._empty.textContent = link
        ? 'torchtpu_lab is not loaded in this kernel: run %load_ext torchtpu_lab'
        : 'Open a notebook to see its tpu session.';
      this._empty.hidden = false;
      this._body.hidden = true;
      return;
    }
    this._empty.hidden = true;
    this._body.hidden = false;
    const compiling = link?.compiling ?? null;
    this._compiling.textContent = compiling ? `${compilingText(compiling, Date.now())} (${compiling.kind})` : '';
    this._compiling.hidden = compiling === null;
    this.tickWhileCompiling();
    this._summary.textContent = summaryLines(status).join('\n');
    for (const button of this._modeButtons) {
      const current = button.dataset.mode === status.mode;
      button.classList.toggle('jp-mod-current', current);
      button.disabled = current;
    }
    this._message.textContent = link?.lastMessage ?? '';

    const points = memoryPolyline(status.memoryHistory, CHART_W, CHART_H);
    this._line.setAttribute('points', points);
    const axes = chartAxes(status.memoryHistory);
    this._yTop.textContent = axes.yTop;
    this._yBottom.textContent = axes.yBottom;
    this._xLeft.textContent = axes.xLeft;
    this._xRight.textContent = axes.xRight;
    const hist = status.memoryHistory;
    this._peaks.replaceChildren();
    const markers = peakMarkers(hist, CHART_W, CHART_H);
    for (const m of markers) {
      // a short tick across the line at the peak's height, with its size as the hover text
      const mark = document.createElementNS(SVG_NS, 'line');
      mark.setAttribute('class', 'jp-torchtpu-peak');
      mark.setAttribute('x1', String(Math.max(0, m.x - 4)));
      mark.setAttribute('x2', String(Math.min(CHART_W, m.x + 4)));
      mark.setAttribute('y1', String(Math.max(1, m.y)));
      mark.setAttribute('y2', String(Math.max(1, m.y)));
      mark.setAttribute('vector-effect', 'non-scaling-stroke');
      const title = document.createElementNS(SVG_NS, 'title');
      title.textContent = m.label;
      mark.appendChild(title);
      this._peaks.appendChild(mark);
    }
    const top = hist.length ? chartTop(hist) : status.memory.allocated;
    this._chartCaption.textContent =
      `now ${formatBytes(status.memory.allocated)} · top of chart ${formatBytes(top)} · ` +
      `peak ${formatBytes(status.memory.peak)} · limit ${formatBytes(status.memory.limit)} · ${hist.length} samples` +
      (markers.length ? ` · ${markers.length} peak marker${markers.length === 1 ? '' : 's'} (reached between samples)` : '');

    this._ranks.replaceChildren();
    this._ranksHead.hidden = this._ranks.hidden = status.ranks.length === 0;
    for (const r of status.ranks) {
      this._ranks.appendChild(el('li', 'jp-torchtpu-rank', rankLine(r)));
    }

    this._compiles.replaceChildren();
    const recent = status.compilations.slice(-15).reverse();
    if (!recent.length) {
      this._compiles.appendChild(el('li', 'jp-torchtpu-none', 'no compilations yet'));
    }
    for (const c of recent) {
      const [head, why] = compileLines(c);
      const item = el('li', 'jp-torchtpu-compile');
      item.append(el('div', 'jp-torchtpu-compile-head', head), el('div', 'jp-torchtpu-compile-cause', why));
      this._compiles.appendChild(item);
    }

    this._profile.replaceChildren();
    if (status.profile) {
      this._profile.appendChild(el('pre', 'jp-torchtpu-profile-summary', profileLines(status.profile).join('\n')));
      const views = status.profile.views;
      if (views) {
        const hardware = hardwareLines(views);
        if (hardware.length) {
          this._profile.appendChild(el('pre', 'jp-torchtpu-hardware', hardware.join('\n')));
        }
        this._rows('costliest programs', 'jp-torchtpu-programs', programLines(views));
        this._rows('memory at the peak', 'jp-torchtpu-owners', ownerLines(views));
        if (views.compare) {
          this._profile.appendChild(el('pre', 'jp-torchtpu-compare', compareLines(views.compare).join('\n')));
        }
      }
      if (status.profile.text) {
        const details = el('details', 'jp-torchtpu-profile-details');
        details.append(el('summary', '', 'full report'), el('pre', 'jp-torchtpu-profile-text', status.profile.text));
        this._profile.appendChild(details);
      }
    } else {
      this._profile.appendChild(el('div', 'jp-torchtpu-none', 'no %%tpu_profile run yet'));
    }
  }

  /** A small titled list in the profile section: each row's text, then its source line (muted). */
  private _rows(title: string, className: string, rows: [string, string][]): void {
    if (!rows.length) {
      return;
    }
    const list = el('ul', `jp-torchtpu-rows ${className}`);
    for (const [text, source] of rows) {
      const item = el('li', 'jp-torchtpu-row', text);
      if (source) {
        item.appendChild(el('div', 'jp-torchtpu-row-source', source));
      }
      list.appendChild(item);
    }
    this._profile.append(el('div', 'jp-torchtpu-subhead', title), list);
  }

  /** "clear compile cache" deletes disk entries other sessions may rely on: ask first (JupyterLab's dialog). */
  private async _confirmClear(): Promise<void> {
    const link = this.link;
    if (!link) {
      return;
    }
    const result = await showDialog({
      title: 'Clear the compile cache?',
      body: clearCacheQuestion(link.status),
      buttons: [Dialog.cancelButton(), Dialog.warnButton({ label: 'Clear' })]
    });
    if (result.button.accept && this.link === link) {
      link.request('clear_cache');
    }
  }

  private _session: HTMLDivElement;
  private _empty: HTMLDivElement;
  private _body: HTMLDivElement;
  private _summary: HTMLPreElement;
  private _message: HTMLDivElement;
  private _modeButtons: HTMLButtonElement[] = [];
  private _svg: SVGSVGElement;
  private _line: SVGPolylineElement;
  private _peaks: SVGGElement;
  private _compiling: HTMLDivElement;
  private _ranksHead: HTMLHeadingElement;
  private _ranks: HTMLUListElement;
  private _chart: HTMLDivElement;
  private _yTop: HTMLDivElement;
  private _yBottom: HTMLDivElement;
  private _xLeft: HTMLSpanElement;
  private _xRight: HTMLSpanElement;
  private _chartCaption: HTMLDivElement;
  private _compiles: HTMLOListElement;
  private _profile: HTMLDivElement;
}

const CHART_W = 300;
const CHART_H = 80;
