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
  cause: string;
  where: string;
  code: string;
  seconds: number;
  nOps: number;
  recompile: boolean;
  disk: boolean; // loaded from the persistent cache, not compiled
}

export interface ProfileInfo {
  cell: string;
  summary: Record<string, string | number | boolean | null>;
  text: string;
}

export interface MemorySample {
  t: number; // seconds (kernel wall clock)
  allocated: number;
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
  compilations: CompileRow[];
  memoryHistory: MemorySample[];
  profile: ProfileInfo | null;
}

export type KernelMessage =
  | { type: 'status'; reason: string; status: Status }
  | { type: 'reply'; id: string | null; command: string; message: string; status: Status | null }
  | { type: 'error'; id: string | null; error: string }
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
  return {
    name: str(x.name, '?', 200),
    kind: str(x.kind, '', 50),
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
  return { cell: str(x.cell, '', 100), summary, text: str(x.text, '', 20000) };
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
        .filter((p): p is unknown[] => Array.isArray(p) && p.length === 2)
        .map(p => ({ t: num(p[0], NaN), allocated: num(p[1], NaN) }))
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
    compilations,
    memoryHistory,
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

/** The status bar text: platform · eager mode · memory used / limit · cache hit rate. */
export function statusBarText(s: Status): string {
  return [
    `tpu ${shortPlatform(s.platform)}`,
    s.mode,
    `${formatBytes(s.memory.allocated)} / ${formatBytes(s.memory.limit)}`,
    `cache ${formatRate(s.cacheHitRate)} (${s.compiles} compiles${s.diskLoads ? `, ${s.diskLoads} disk loads` : ''})`
  ].join(' · ');
}

/** The status bar tooltip (several lines). */
export function statusBarTitle(s: Status): string {
  return [
    `torchtpu_lab on ${s.platform} (${s.devices} device(s))`,
    `eager mode ${s.mode}`,
    `memory ${formatBytes(s.memory.allocated)} (peak ${formatBytes(s.memory.peak)}, limit ${formatBytes(s.memory.limit)})`,
    `compiles ${s.compiles} | disk loads ${s.diskLoads} | memory hits ${s.cacheHits} (${formatRate(s.cacheHitRate)}) | syncs ${s.syncs}`
  ].join('\n');
}

/** The panel's summary lines. */
export function summaryLines(s: Status): string[] {
  return [
    `platform: ${s.platform} (${s.devices} device(s))`,
    `eager mode: ${s.mode}`,
    `memory: ${formatBytes(s.memory.allocated)} (peak ${formatBytes(s.memory.peak)}, limit ${formatBytes(s.memory.limit)})`,
    `compiles: ${s.compiles} | disk loads: ${s.diskLoads} | memory hits: ${s.cacheHits} (${formatRate(s.cacheHitRate)})`,
    `syncs: ${s.syncs} | CPU fallbacks: ${s.cpuFallbacks} | pending fused ops: ${s.pendingOps}`,
    `compile cache: ${s.cacheDir} (${s.cacheEntries} entries)`
  ];
}

function formatSeconds(s: number): string {
  return s >= 1 ? `${s.toFixed(2)} s` : `${(s * 1000).toFixed(1)} ms`;
}

/** One compilation as two lines: what and how long, then why and where. */
export function compileLines(c: CompileRow): [string, string] {
  // the kind only where the name does not already say it ("graph[336 ops]" is not "graph graph[336 ops]")
  const kind = c.kind && !c.name.startsWith(c.kind) ? c.kind + ' ' : '';
  const what = c.disk ? `load from disk (${c.recompile ? 'new signature' : 'first time'})` : c.recompile ? 'recompile' : 'compile';
  const head = `${what} ${kind}${c.name} · ${c.nOps} ops · ${formatSeconds(c.seconds)}`;
  const where = c.where ? ` @ ${c.where}${c.code ? ': ' + c.code : ''}` : '';
  return [head, `${c.cause || '(no cause recorded)'}${where}`];
}

/** The last %%tpu_profile as headline lines (the full text report follows in the panel). */
export function profileLines(p: ProfileInfo): string[] {
  const s = p.summary;
  const n = (k: string): number | null => (typeof s[k] === 'number' ? (s[k] as number) : null);
  const lines = [`last %%tpu_profile${p.cell ? ' (' + p.cell + ')' : ''}`];
  const wall = n('wall_s');
  const device = n('device_s');
  const python = n('python_s');
  if (wall !== null && python !== null) {
    // the split adds up to the wall time: host Python, recording/dispatching ops, compiling, waiting at syncs
    lines.push(
      `wall ${formatSeconds(wall)} = Python ${formatSeconds(python)} + tracing ${formatSeconds(n('tracing_s') ?? 0)} + ` +
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

/**
 * The memory chart as SVG polyline points in a width x height box (y grows downwards, time runs left to
 * right), scaled so the highest sample touches the top; `''` with fewer than 2 samples.
 */
export function memoryPolyline(samples: MemorySample[], width: number, height: number): string {
  if (samples.length < 2) {
    return '';
  }
  const t0 = samples[0].t;
  const t1 = samples[samples.length - 1].t;
  const span = t1 > t0 ? t1 - t0 : samples.length - 1;
  const maxY = Math.max(1, ...samples.map(p => p.allocated));
  return samples
    .map((p, i) => {
      const x = t1 > t0 ? ((p.t - t0) / span) * width : (i / span) * width;
      const y = height - (p.allocated / maxY) * height;
      return `${x.toFixed(1)},${y.toFixed(1)}`;
    })
    .join(' ');
}

/** The memory chart's axis labels: bytes at the top (the highest sample) and bottom (0), and the time span
 *  (`-12.5 s` at the left, `now` at the right); empty strings with fewer than 2 samples. */
export function chartAxes(samples: MemorySample[]): { yTop: string; yBottom: string; xLeft: string; xRight: string } {
  if (samples.length < 2) {
    return { yTop: '', yBottom: '', xLeft: '', xRight: '' };
  }
  const span = samples[samples.length - 1].t - samples[0].t;
  return {
    yTop: formatBytes(Math.max(...samples.map(p => p.allocated))),
    yBottom: '0 B',
    xLeft: `-${span >= 60 ? (span / 60).toFixed(1) + ' min' : span.toFixed(1) + ' s'}`,
    xRight: 'now'
  };
}
