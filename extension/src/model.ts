/**
 * The frontend model: the comm protocol (version 1) and the pure functions that parse kernel messages and
 * turn them into text. Nothing here touches the DOM or JupyterLab, so it is unit-tested with `node --test`.
 *
 * Everything the kernel sends is treated as untrusted data: parsed into typed values with defaults, and only
 * ever rendered as text (textContent), never as HTML.
 */

export const PROTOCOL_VERSION = 1;
export const COMM_TARGET = 'torchtpu_lab';
export const EAGER_MODES = ['debug', 'strict', 'fused'] as const;
export type EagerMode = (typeof EAGER_MODES)[number];
export type Command = 'status' | 'set_mode' | 'clear_cache';

export interface MemoryInfo {
  allocated: number;
  peak: number;
  limit: number | null;
}

export interface CompileRow {
  name: string;
  kind: string;
  ops: [string, number][]; // a graph's most frequent ops (short names) and their counts
  cause: string;
  where: string;
  code: string;
  seconds: number;
  nOps: number;
  recompile: boolean;
  disk: boolean; // loaded from the persistent cache, not compiled
}

/** One costliest program of the last profile: its figures and the kernel's one-line description. */
export interface ProgramView {
  name: string;
  runs: number;
  deviceS: number;
  bound: string | null;
  roofFraction: number | null;
  source: string;
  text: string;
}

/** One owner of device memory at the peak of the last profile. */
export interface OwnerView {
  bytes: number;
  kind: string;
  source: string;
  text: string;
}

export interface CompareView {
  before: string;
  after: string;
  rows: { what: string; before: string; after: string; change: string }[];
  unchanged: number;
}

export interface HardwareView {
  flops: number;
  mfu: number | null;
  peakSource: string;
  text: string;
}

/** The panel's views of the last %%tpu_profile (the kernel's `render/panel.py`, payload version 1). */
export interface ProfileViews {
  hardware: HardwareView | null;
  programs: ProgramView[];
  programsTotal: number;
  memoryAtPeak: OwnerView[];
  memoryOwnersTotal: number;
  peakBytes: number;
  compare: CompareView | null;
}

export const VIEWS_VERSION = 1;

export interface ProfileInfo {
  cell: string;
  summary: Record<string, string | number | boolean | null>;
  text: string;
  views: ProfileViews | null;
}

export interface MemorySample {
  t: number; // seconds (kernel wall clock)
  allocated: number;
  peak: number | null; // the session peak when it rose since the previous sample (a peak between two samples)
}

/** An XLA compile running in the kernel: what kind, and since when (ms, this browser's clock). */
export interface Compiling {
  kind: string;
  since: number;
}

/** One rank of the last `torchtpu_lab.distributed.launch()` (read from the rank's progress file). */
export interface RankRow {
  rank: number;
  state: string;
  seconds: number;
  mode: string;
  allocated: number | null;
  compiles: number;
  compileSeconds: number;
  syncs: number;
  collectives: number;
  compiling: number | null;
}

export interface Status {
  platform: string;
  devices: number;
  mode: string;
  memory: MemoryInfo;
  compiles: number;
  diskLoads: number;
  cacheHits: number;
  cacheHitRate: number | null;
  syncs: number;
  cpuFallbacks: number;
  pendingOps: number;
  cacheDir: string;
  cacheEntries: number;
  compileSeconds: number;
  cellSeconds: number;
  compileShare: number | null;
  compilations: CompileRow[];
  memoryHistory: MemorySample[];
  compiling: { kind: string; seconds: number } | null;
  ranks: RankRow[];
  profile: ProfileInfo | null;
}

export type KernelMessage =
  | { type: 'status'; reason: string; status: Status }
  | { type: 'reply'; id: string | null; command: string; message: string; status: Status | null }
  | { type: 'error'; id: string | null; error: string }
  | { type: 'compile'; phase: 'start' | 'end'; kind: string; seconds: number }
  | { type: 'unloaded' }
  | { type: 'invalid'; reason: string };

export interface Request {
  v: number;
  id: string;
  command: Command;
  args: Record<string, string>;
}

// ---- parsing ------------------------------------------------------------------------------------------------

function isObject(x: unknown): x is Record<string, unknown> {
  return typeof x === 'object' && x !== null && !Array.isArray(x);
}

function str(x: unknown, fallback = '', maxLength = 2000): string {
  if (typeof x === 'string') {
    return x.length > maxLength ? x.slice(0, maxLength) + '…' : x;
  }
  return fallback;
}

function num(x: unknown, fallback = 0): number {
  return typeof x === 'number' && Number.isFinite(x) ? x : fallback;
}

function numOrNull(x: unknown): number | null {
  return typeof x === 'number' && Number.isFinite(x) ? x : null;
}

function parseCompile(x: unknown): CompileRow | null {
  if (!isObject(x)) {
    return null;
  }
  const ops = Array.isArray(x.ops)
    ? x.ops
        .slice(0, 8)
        .filter((p): p is unknown[] => Array.isArray(p) && p.length === 2)
        .map(p => [str(p[0], '?', 40), num(p[1])] as [string, number])
    : [];
  return {
    name: str(x.name, '?', 200),
    kind: str(x.kind, '', 50),
    ops,
    cause: str(x.cause, '', 500),
    where: str(x.where, '', 200),
    code: str(x.code, '', 200),
    seconds: num(x.seconds),
    nOps: num(x.n_ops),
    recompile: x.recompile === true,
    disk: x.disk === true
  };
}

function parseProfile(x: unknown): ProfileInfo | null {
  if (!isObject(x)) {
    return null;
  }
  const summary: Record<string, string | number | boolean | null> = {};
  if (isObject(x.summary)) {
    for (const [k, v] of Object.entries(x.summary)) {
      if (typeof v === 'string') {
        summary[k] = str(v, '', 500);
      } else if ((typeof v === 'number' && Number.isFinite(v)) || typeof v === 'boolean' || v === null) {
        summary[k] = v;
      }
    }
  }
  return { cell: str(x.cell, '', 100), summary, text: str(x.text, '', 20000), views: parseViews(x.views) };
}

function list<T>(x: unknown, most: number, parse: (o: Record<string, unknown>) => T): T[] {
  return Array.isArray(x) ? x.slice(0, most).filter(isObject).map(parse) : [];
}

/** The panel views of a profile; `null` when absent or of another payload version. */
export function parseViews(x: unknown): ProfileViews | null {
  if (!isObject(x) || x.v !== VIEWS_VERSION) {
    return null;
  }
  const hw = isObject(x.hardware) ? x.hardware : null;
  const cmp = isObject(x.compare) ? x.compare : null;
  return {
    hardware: hw
      ? { flops: num(hw.flops), mfu: numOrNull(hw.mfu), peakSource: str(hw.peak_source, '', 300), text: str(hw.text, '', 300) }
      : null,
    programs: list(x.programs, 10, p => ({
      name: str(p.name, '?', 200),
      runs: num(p.runs),
      deviceS: num(p.device_s),
      bound: typeof p.bound === 'string' ? str(p.bound, '', 20) : null,
      roofFraction: numOrNull(p.roof_fraction),
      source: str(p.source, '', 200),
      text: str(p.text, '', 400)
    })),
    programsTotal: num(x.programs_total),
    memoryAtPeak: list(x.memory_at_peak, 10, o => ({
      bytes: num(o.bytes),
      kind: str(o.kind, '', 100),
      source: str(o.source, '', 200),
      text: str(o.text, '', 300)
    })),
    memoryOwnersTotal: num(x.memory_owners_total),
    peakBytes: num(x.peak_bytes),
    compare: cmp
      ? {
          before: str(cmp.before, '', 100),
          after: str(cmp.after, '', 100),
          rows: list(cmp.rows, 12, r => ({
            what: str(r.what, '', 100),
            before: str(r.before, '', 50),
            after: str(r.after, '', 50),
            change: str(r.change, '', 80)
          })),
          unchanged: num(cmp.unchanged)
        }
      : null
  };
}

function parseRank(r: Record<string, unknown>): RankRow {
  return {
    rank: num(r.rank),
    state: str(r.state, '?', 40),
    seconds: num(r.seconds),
    mode: str(r.mode, '', 20),
    allocated: numOrNull(r.allocated),
    compiles: num(r.compiles),
    compileSeconds: num(r.compile_seconds),
    syncs: num(r.syncs),
    collectives: num(r.collectives),
    compiling: numOrNull(r.compiling)
  };
}

/** A status payload (the kernel's `data`) into a typed Status; `null` if it is not a status at all. */
export function parseStatus(x: unknown): Status | null {
  if (!isObject(x) || typeof x.mode !== 'string') {
    return null;
  }
  const mem = isObject(x.memory) ? x.memory : {};
  const compilations = Array.isArray(x.compilations)
    ? x.compilations.slice(-100).map(parseCompile).filter((c): c is CompileRow => c !== null)
    : [];
  const memoryHistory = Array.isArray(x.memory_history)
    ? x.memory_history
        .slice(-500)
        .filter((p): p is unknown[] => Array.isArray(p) && (p.length === 2 || p.length === 3))
        .map(p => ({ t: num(p[0], NaN), allocated: num(p[1], NaN), peak: numOrNull(p[2]) }))
        .filter(p => Number.isFinite(p.t) && Number.isFinite(p.allocated))
    : [];
  return {
    platform: str(x.platform, '?', 300),
    devices: num(x.devices),
    mode: str(x.mode, '?', 20),
    memory: { allocated: num(mem.allocated), peak: num(mem.peak), limit: numOrNull(mem.limit) },
    compiles: num(x.compiles),
    diskLoads: num(x.disk_loads),
    cacheHits: num(x.cache_hits),
    cacheHitRate: numOrNull(x.cache_hit_rate),
    syncs: num(x.syncs),
    cpuFallbacks: num(x.cpu_fallbacks),
    pendingOps: num(x.pending_ops),
    cacheDir: str(x.cache_dir, '', 500),
    cacheEntries: num(x.cache_entries),
    compileSeconds: num(x.compile_seconds),
    cellSeconds: num(x.cell_seconds),
    compileShare: numOrNull(x.compile_share),
    compilations,
    memoryHistory,
    compiling: isObject(x.compiling)
      ? { kind: str(x.compiling.kind, '', 20), seconds: num(x.compiling.seconds) }
      : null,
    ranks: list(x.ranks, 64, parseRank),
    profile: parseProfile(x.profile)
  };
}

function idOf(x: unknown): string | null {
  return typeof x === 'string' ? str(x, '', 100) : null;
}

/** A comm message's `data` from the kernel into a KernelMessage; anything unexpected is `invalid`. */
export function parseKernelMessage(data: unknown): KernelMessage {
  if (!isObject(data)) {
    return { type: 'invalid', reason: 'not an object' };
  }
  if (data.v !== PROTOCOL_VERSION) {
    return { type: 'invalid', reason: `unsupported protocol version ${JSON.stringify(data.v) ?? 'undefined'}` };
  }
  switch (data.type) {
    case 'status': {
      const status = parseStatus(data.data);
      return status
        ? { type: 'status', reason: str(data.reason, '', 50), status }
        : { type: 'invalid', reason: 'status without data' };
    }
    case 'reply':
      return {
        type: 'reply',
        id: idOf(data.id),
        command: str(data.command, '', 50),
        message: str(data.message, '', 1000),
        status: parseStatus(data.data)
      };
    case 'error':
      return { type: 'error', id: idOf(data.id), error: str(data.error, 'error', 1000) };
    case 'compile':
      if (data.phase !== 'start' && data.phase !== 'end') {
        return { type: 'invalid', reason: 'compile message without a start/end phase' };
      }
      return { type: 'compile', phase: data.phase, kind: str(data.kind, '', 20), seconds: num(data.seconds) };
    case 'unloaded':
      return { type: 'unloaded' };
    default:
      return { type: 'invalid', reason: `unknown message type ${JSON.stringify(data.type) ?? 'undefined'}` };
  }
}

// ---- requests -----------------------------------------------------------------------------------------------

/** A request the frontend may send: only the fixed commands, with validated arguments. */
export function makeRequest(id: string, command: Command, mode?: string): Request {
  if (command === 'set_mode') {
    if (!EAGER_MODES.includes(mode as EagerMode)) {
      throw new Error(`unknown eager mode ${mode}`);
    }
    return { v: PROTOCOL_VERSION, id, command, args: { mode: mode as string } };
  }
  if (command !== 'status' && command !== 'clear_cache') {
    throw new Error(`unknown command ${command}`);
  }
  return { v: PROTOCOL_VERSION, id, command, args: {} };
}

// ---- formatting ---------------------------------------------------------------------------------------------

/** Bytes as the kernel's reports write them: `512 B`, `1.00 KiB`, `3.25 MiB`; `n/a` when unknown. */
export function formatBytes(n: number | null | undefined): string {
  if (n === null || n === undefined || !Number.isFinite(n)) {
    return 'n/a';
  }
  const units = ['B', 'KiB', 'MiB', 'GiB', 'TiB'];
  let value = n;
  let i = 0;
  while (Math.abs(value) >= 1024 && i < units.length - 1) {
    value /= 1024;
    i++;
  }
  return i === 0 ? `${Math.round(value)} B` : `${value.toFixed(2)} ${units[i]}`;
}

export function formatRate(rate: number | null): string {
  return rate === null ? 'n/a' : `${Math.round(100 * rate)}%`;
}

/** The short platform name for the status bar: `XLA:CPU cpu x1 (no TPU here...)` -> `XLA:CPU`. */
export function shortPlatform(platform: string): string {
  const first = platform.trim().split(/\s+/)[0];
  return first || '?';
}

/** `compiling… 12 s` while an XLA compile runs (whole seconds: it updates twice a second). */
export function compilingText(c: Compiling, now: number): string {
  return `compiling… ${Math.max(0, Math.floor((now - c.since) / 1000))} s`;
}

/** The share of the cells' wall time spent compiling: `compile 41% of time` (a hit rate of 98% can hide
 *  compiles that take most of the time); the cache hit rate before any cell was timed. */
export function compileShareText(s: Status): string {
  return s.compileShare === null ? `cache ${formatRate(s.cacheHitRate)}` : `compile ${formatRate(s.compileShare)} of time`;
}

/** The status bar's parts: platform · eager mode · memory · compile share · compiles, or `compiling… N s` in
 *  place of the last two. `optional` parts give way first in a narrow window (the tooltip has them all). */
export function statusBarParts(
  s: Status,
  compiling: Compiling | null = null,
  now = Date.now()
): { text: string; optional: boolean }[] {
  const memory =
    s.memory.limit === null
      ? formatBytes(s.memory.allocated)
      : `${formatBytes(s.memory.allocated)} / ${formatBytes(s.memory.limit)}`;
  const parts = [
    { text: `tpu ${shortPlatform(s.platform)}`, optional: false },
    { text: s.mode, optional: false },
    { text: memory, optional: false }
  ];
  if (compiling) {
    parts.push({ text: compilingText(compiling, now), optional: false });
  } else {
    parts.push({ text: compileShareText(s), optional: false });
    parts.push({ text: `${s.compiles} compile${s.compiles === 1 ? '' : 's'}`, optional: true });
  }
  return parts;
}

/** The status bar text (all parts). */
export function statusBarText(s: Status, compiling: Compiling | null = null, now = Date.now()): string {
  return statusBarParts(s, compiling, now)
    .map(p => p.text)
    .join(' · ');
}

/** The status bar tooltip (several lines). */
export function statusBarTitle(s: Status): string {
  return [
    `torchtpu_lab on ${s.platform} (${s.devices} device(s))`,
    `eager mode ${s.mode}`,
    `memory ${formatBytes(s.memory.allocated)} (peak ${formatBytes(s.memory.peak)}, limit ${formatBytes(s.memory.limit)})`,
    compileTimeLine(s),
    `compiles ${s.compiles} | disk loads ${s.diskLoads} | memory hits ${s.cacheHits} (${formatRate(s.cacheHitRate)}) | syncs ${s.syncs}`
  ].join('\n');
}

function compileTimeLine(s: Status): string {
  const share = s.compileShare === null ? '' : ` (${formatRate(s.compileShare)})`;
  const cells = s.cellSeconds > 0 ? ` of ${formatSeconds(s.cellSeconds)} in cells${share}` : '';
  return `compile time: ${formatSeconds(s.compileSeconds)}${cells}`;
}

/** The panel's summary lines. */
export function summaryLines(s: Status): string[] {
  return [
    `platform: ${s.platform} (${s.devices} device(s))`,
    `eager mode: ${s.mode}`,
    `memory: ${formatBytes(s.memory.allocated)} (peak ${formatBytes(s.memory.peak)}, limit ${formatBytes(s.memory.limit)})`,
    `compiles: ${s.compiles} | disk loads: ${s.diskLoads} | memory hits: ${s.cacheHits} (${formatRate(s.cacheHitRate)})`,
    compileTimeLine(s),
    `syncs: ${s.syncs} | CPU fallbacks: ${s.cpuFallbacks} | pending fused ops: ${s.pendingOps}`,
    `compile cache: ${s.cacheDir} (${s.cacheEntries} entries)`
  ];
}

export function formatSeconds(s: number): string {
  return s >= 1 ? `${s.toFixed(2)} s` : `${(s * 1000).toFixed(1)} ms`;
}

const KIND_LABELS: Record<string, string> = {
  op: 'op',
  graph: 'fused graph',
  compiled: 'torch.compile graph',
  dynamo: 'Dynamo graph',
  'eager-graph': 'torch.compile graph run eagerly'
};

/** What a compiled program is, in words: `fused graph of 3 ops (mul ×2, tanh)`, `op aten::add.Tensor`. */
export function programLabel(c: CompileRow): string {
  if (c.kind === 'op') {
    return `op ${c.name}`;
  }
  if (c.kind === 'graph') {
    const n = c.nOps;
    const ops = c.ops.map(([name, k]) => (k > 1 ? `${name} ×${k}` : name)).join(', ');
    const more = c.ops.length && c.ops.reduce((a, [, k]) => a + k, 0) < n ? ', …' : '';
    return `fused graph of ${n} op${n === 1 ? '' : 's'}${ops ? ` (${ops}${more})` : ''}`;
  }
  const kind = KIND_LABELS[c.kind];
  return kind && !c.name.toLowerCase().startsWith(c.kind) ? `${kind}: ${c.name}` : c.name;
}

/** One compilation as two lines: what happened to which program and how long, then why and where. */
export function compileLines(c: CompileRow): [string, string] {
  const what = c.disk ? 'loaded from the disk cache:' : c.recompile ? 'recompiled' : 'compiled';
  const head = `${what} ${programLabel(c)} · ${formatSeconds(c.seconds)}`;
  const where = c.where ? ` @ ${c.where}${c.code ? ': ' + c.code : ''}` : '';
  const cause = c.disk
    ? `no XLA compile: an earlier session compiled it (${c.cause || 'new here'})`
    : c.cause || '(no cause recorded)';
  return [head, `${cause}${where}`];
}

/** A share with the digits a small one needs: `42.0%`, `0.12%`. */
export function formatShare(f: number | null): string {
  if (f === null) {
    return 'n/a';
  }
  return f >= 0.01 ? `${(100 * f).toFixed(1)}%` : `${(100 * f).toPrecision(2)}%`;
}

/** The last %%tpu_profile as headline lines (the views and the full text report follow in the panel). */
export function profileLines(p: ProfileInfo): string[] {
  const s = p.summary;
  const n = (k: string): number | null => (typeof s[k] === 'number' ? (s[k] as number) : null);
  const lines = [`last %%tpu_profile${p.cell ? ' (' + p.cell + ')' : ''}`];
  const wall = n('wall_s');
  const device = n('device_s');
  const python = n('python_s');
  if (wall !== null && python !== null) {
    // the split adds up to the wall time: host Python, our own host overhead, recording ops, compiling, waiting
    const overhead = n('overhead_s');
    lines.push(
      `wall ${formatSeconds(wall)} = Python ${formatSeconds(python)} + ` +
        (overhead !== null ? `torchtpu_lab overhead ${formatSeconds(overhead)} + ` : '') +
        `tracing ${formatSeconds(n('tracing_s') ?? 0)} + ` +
        `compiling ${formatSeconds(n('compile_s') ?? 0)} + waiting ${formatSeconds(n('wait_s') ?? 0)}`
    );
  } else if (wall !== null) {
    lines.push(`wall ${formatSeconds(wall)}${device !== null ? ', waiting ' + formatSeconds(device) : ''}`);
  }
  lines.push(
    `ops ${n('ops') ?? 0} · compiles ${n('compiles') ?? 0} (recompiles ${n('recompiles') ?? 0}) · ` +
      `disk loads ${n('disk_loads') ?? 0} · syncs ${n('syncs') ?? 0}`
  );
  lines.push(`cache hit rate ${formatRate(n('cache_hit_rate'))} · peak memory ${formatBytes(n('peak_bytes'))}`);
  if (typeof s.error === 'string' && s.error) {
    lines.push(`error: ${s.error}`);
  }
  return lines;
}

/** How far from the hardware: `532 kFLOP · 16.4 kB accessed · MFU 0.12% of 38.4 GFLOP/s`, then where the
 *  peaks come from; `[]` when no program with a known cost ran. */
export function hardwareLines(v: ProfileViews): string[] {
  if (!v.hardware) {
    return [];
  }
  return [v.hardware.text, `peaks: ${v.hardware.peakSource || 'unknown'}`];
}

/** The costliest programs with their bound, each with the line that ran it. */
export function programLines(v: ProfileViews): [string, string][] {
  const rows = v.programs.map((p): [string, string] => [p.text, p.source]);
  if (v.programsTotal > v.programs.length) {
    rows.push([`… ${v.programsTotal - v.programs.length} more programs in the report`, '']);
  }
  return rows;
}

/** The largest owners of device memory at the peak, each with the line that created it. */
export function ownerLines(v: ProfileViews): [string, string][] {
  const rows = v.memoryAtPeak.map((o): [string, string] => [o.text, o.source]);
  if (v.memoryOwnersTotal > v.memoryAtPeak.length) {
    rows.push([`… ${v.memoryOwnersTotal - v.memoryAtPeak.length} more owners in the report`, '']);
  }
  return rows;
}

/** The comparison with a saved profile (`%%tpu_profile --compare NAME`): the figures that changed. */
export function compareLines(c: CompareView): string[] {
  const lines = [`compared with ${c.before || 'before'}:`];
  for (const r of c.rows) {
    lines.push(`${r.what}: ${r.before} → ${r.after}${r.change ? ' (' + r.change + ')' : ''}`);
  }
  if (!c.rows.length) {
    lines.push('no headline figure changed');
  } else if (c.unchanged) {
    lines.push(`${c.unchanged} more unchanged`);
  }
  return lines;
}

/** One rank of the last launch: `rank 0 · running 3.2 s · fused · 1.00 MiB · 4 compiles (1.20 s) · 12 syncs`. */
export function rankLine(r: RankRow): string {
  const state = r.compiling !== null ? `compiling… ${Math.floor(r.compiling)} s` : r.state;
  const parts = [`rank ${r.rank}`, `${state} ${r.seconds.toFixed(1)} s`];
  if (r.mode) {
    parts.push(r.mode, formatBytes(r.allocated));
    parts.push(`${r.compiles} compiles (${formatSeconds(r.compileSeconds)})`, `${r.syncs} syncs`);
    if (r.collectives) {
      parts.push(`${r.collectives} collectives`);
    }
  }
  return parts.join(' · ');
}

/** The highest point the memory chart must reach: the highest sample or peak marker (the true peak when it was
 *  reached inside the window, not only the highest sample). */
export function chartTop(samples: MemorySample[]): number {
  return Math.max(1, ...samples.map(p => Math.max(p.allocated, p.peak ?? 0)));
}

function chartX(samples: MemorySample[], i: number, width: number): number {
  const t0 = samples[0].t;
  const t1 = samples[samples.length - 1].t;
  return t1 > t0 ? ((samples[i].t - t0) / (t1 - t0)) * width : (i / Math.max(1, samples.length - 1)) * width;
}

/**
 * The memory chart as SVG polyline points in a width x height box (y grows downwards, time runs left to
 * right), scaled so the chart's top is the highest sample or peak marker; `''` with fewer than 2 samples.
 */
export function memoryPolyline(samples: MemorySample[], width: number, height: number): string {
  if (samples.length < 2) {
    return '';
  }
  const top = chartTop(samples);
  return samples
    .map((p, i) => `${chartX(samples, i, width).toFixed(1)},${(height - (p.allocated / top) * height).toFixed(1)}`)
    .join(' ');
}

/** The peaks reached between two samples, as chart points with a label: each marker sits at the sample that
 *  first saw the new peak (the peak happened since the sample before it). */
export function peakMarkers(
  samples: MemorySample[],
  width: number,
  height: number
): { x: number; y: number; label: string }[] {
  if (samples.length < 2) {
    return [];
  }
  const top = chartTop(samples);
  const out: { x: number; y: number; label: string }[] = [];
  samples.forEach((p, i) => {
    if (p.peak !== null && p.peak > p.allocated) {
      const x = i > 0 ? (chartX(samples, i - 1, width) + chartX(samples, i, width)) / 2 : chartX(samples, i, width);
      out.push({ x, y: height - (p.peak / top) * height, label: `peak ${formatBytes(p.peak)} (between two samples)` });
    }
  });
  return out;
}

/** The memory chart's axis labels: bytes at the top (the chart's top: highest sample or peak) and bottom (0),
 *  and the time span (`-12.5 s` at the left, `now` at the right); empty strings with fewer than 2 samples. */
export function chartAxes(samples: MemorySample[]): { yTop: string; yBottom: string; xLeft: string; xRight: string } {
  if (samples.length < 2) {
    return { yTop: '', yBottom: '', xLeft: '', xRight: '' };
  }
  const span = samples[samples.length - 1].t - samples[0].t;
  return {
    yTop: formatBytes(chartTop(samples)),
    yBottom: '0 B',
    xLeft: `-${span >= 60 ? (span / 60).toFixed(1) + ' min' : span.toFixed(1) + ' s'}`,
    xRight: 'now'
  };
}

/** The confirmation before "clear compile cache" deletes anything. */
export function clearCacheQuestion(s: Status | null): string {
  const where = s ? `${s.cacheEntries} entries in ${s.cacheDir}` : 'the persistent compile cache';
  return (
    `This deletes ${where} and every executable held in memory. ` +
    'The next run of each op and graph compiles again (cold start). Other kernels sharing the directory lose ' +
    'their entries too.'
  );
}

/** A report's `cell [N], line L` link (`data-cell`, `data-line` of `a.ttl-goto`, written by the kernel's
 *  `render/cell_link.py`) as numbers; `null` unless both are positive integers. */
export function parseGoto(cell: string | undefined, line: string | undefined): { cell: number; line: number } | null {
  const c = Number(cell);
  const l = Number(line);
  return Number.isInteger(c) && Number.isInteger(l) && c > 0 && l > 0 && /^\d+$/.test(cell ?? '') && /^\d+$/.test(line ?? '')
    ? { cell: c, line: l }
    : null;
}
