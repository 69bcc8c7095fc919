// Unit tests of the frontend model (pure functions): `npm test` compiles them to CommonJS and runs node --test.
import { strict as assert } from 'node:assert';
import { test } from 'node:test';

import {
  chartAxes,
  clearCacheQuestion,
  compareLines,
  compileLines,
  compilingText,
  hardwareLines,
  ownerLines,
  parseGoto,
  peakMarkers,
  programLines,
  rankLine,
  statusBarParts,
  formatBytes,
  formatRate,
  makeRequest,
  memoryPolyline,
  parseKernelMessage,
  parseStatus,
  profileLines,
  shortPlatform,
  statusBarText,
  summaryLines
} from '../src/model';

const STATUS = {
  platform: 'XLA:CPU cpu x1 (no TPU here: the tpu device runs on XLA:CPU)',
  devices: 1,
  mode: 'fused',
  memory: { allocated: 3 * 1024 * 1024, peak: 4 * 1024 * 1024, limit: null },
  compiles: 2,
  cache_hits: 6,
  cache_hit_rate: 0.75,
  syncs: 3,
  cpu_fallbacks: 0,
  pending_ops: 0,
  cache_dir: '/tmp/cache',
  cache_entries: 2,
  compilations: [
    {
      name: 'graph_1',
      kind: 'graph',
      cause: 'first time this graph structure is seen',
      where: 'cell [2], line 3',
      code: 'y = (x @ x).relu().sum()',
      seconds: 0.0123,
      n_ops: 4,
      recompile: false
    },
    { name: 'graph_2', kind: 'graph', cause: 'input 0 changed shape', where: '', seconds: 1.5, n_ops: 4, recompile: true }
  ],
  memory_history: [
    [100, 0],
    [101, 1024],
    [103, 512]
  ],
  profile: null
};

test('a status message parses into typed values', () => {
  const msg = parseKernelMessage({ v: 1, type: 'status', reason: 'cell', data: STATUS });
  assert.equal(msg.type, 'status');
  if (msg.type !== 'status') {
    return;
  }
  assert.equal(msg.status.mode, 'fused');
  assert.equal(msg.status.memory.limit, null);
  assert.equal(msg.status.compilations.length, 2);
  assert.equal(msg.status.compilations[1].recompile, true);
  assert.deepEqual(msg.status.memoryHistory[1], { t: 101, allocated: 1024, peak: null });
});

test('malformed or foreign messages are invalid, never thrown', () => {
  for (const bad of [null, 'x', 3, [], {}, { v: 2, type: 'status', data: STATUS }, { v: 1, type: 'nope' }]) {
    assert.equal(parseKernelMessage(bad).type, 'invalid', JSON.stringify(bad));
  }
  assert.equal(parseKernelMessage({ v: 1, type: 'status', data: { platform: 'x' } }).type, 'invalid');
});

test('wrong field types fall back to defaults and junk rows are dropped', () => {
  const s = parseStatus({
    mode: 'strict',
    memory: { allocated: 'lots', limit: Infinity },
    compiles: '7',
    compilations: [null, 5, { name: 42, cause: '<b>x</b>' }],
    memory_history: [[1, 2], 'x', [1], [3, null], [4, 8]],
    profile: { summary: { wall_s: 0.5, nested: { a: 1 } }, text: 7 }
  });
  assert.ok(s);
  assert.equal(s!.memory.allocated, 0);
  assert.equal(s!.memory.limit, null);
  assert.equal(s!.compiles, 0);
  assert.equal(s!.compilations.length, 1);
  assert.equal(s!.compilations[0].name, '?');
  assert.equal(s!.compilations[0].cause, '<b>x</b>'); // kept verbatim: it is rendered as text, not HTML
  assert.deepEqual(s!.memoryHistory, [
    { t: 1, allocated: 2, peak: null },
    { t: 4, allocated: 8, peak: null }
  ]);
  assert.deepEqual(s!.profile!.summary, { wall_s: 0.5 });
  assert.equal(s!.profile!.text, '');
});

test('replies and errors keep their request id', () => {
  const reply = parseKernelMessage({ v: 1, type: 'reply', id: 'a-1', command: 'set_mode', message: 'eager mode: debug' });
  assert.deepEqual(reply, { type: 'reply', id: 'a-1', command: 'set_mode', message: 'eager mode: debug', status: null });
  const err = parseKernelMessage({ v: 1, type: 'error', id: null, error: "unknown command 'rm'" });
  assert.deepEqual(err, { type: 'error', id: null, error: "unknown command 'rm'" });
  assert.deepEqual(parseKernelMessage({ v: 1, type: 'unloaded' }), { type: 'unloaded' });
});

test('requests are only the fixed commands with checked arguments', () => {
  assert.deepEqual(makeRequest('r1', 'status'), { v: 1, id: 'r1', command: 'status', args: {} });
  assert.deepEqual(makeRequest('r2', 'set_mode', 'debug'), { v: 1, id: 'r2', command: 'set_mode', args: { mode: 'debug' } });
  assert.deepEqual(makeRequest('r3', 'clear_cache'), { v: 1, id: 'r3', command: 'clear_cache', args: {} });
  assert.throws(() => makeRequest('r4', 'set_mode', 'turbo'));
  assert.throws(() => makeRequest('r5', 'exec' as any));
});

test('bytes, rates and platform names format like the kernel reports', () => {
  assert.equal(formatBytes(512), '512 B');
  assert.equal(formatBytes(1024), '1.00 KiB');
  assert.equal(formatBytes(3 * 1024 * 1024), '3.00 MiB');
  assert.equal(formatBytes(16 * 1024 ** 3), '16.00 GiB');
  assert.equal(formatBytes(null), 'n/a');
  assert.equal(formatRate(0.754), '75%');
  assert.equal(formatRate(null), 'n/a');
  assert.equal(shortPlatform(STATUS.platform), 'XLA:CPU');
  assert.equal(shortPlatform(''), '?');
});

test('the status bar text has platform, mode, memory, and the hit rate until cells were timed', () => {
  const s = parseStatus(STATUS)!;
  assert.equal(statusBarText(s), 'tpu XLA:CPU · fused · 3.00 MiB · cache 75% · 2 compiles');
  const limited = parseStatus({ ...STATUS, memory: { allocated: 1024, peak: 1024, limit: 16 * 1024 ** 3 } })!;
  assert.equal(statusBarText(limited), 'tpu XLA:CPU · fused · 1.00 KiB / 16.00 GiB · cache 75% · 2 compiles');
  const lines = summaryLines(s);
  assert.ok(lines.some(l => l === 'eager mode: fused'));
  assert.ok(lines.some(l => l.includes('peak 4.00 MiB')));
});

test('compilations read as what, how long, why and where', () => {
  const s = parseStatus(STATUS)!;
  assert.deepEqual(compileLines(s.compilations[0]), [
    'compiled fused graph of 4 ops · 12.3 ms',
    'first time this graph structure is seen @ cell [2], line 3: y = (x @ x).relu().sum()'
  ]);
  assert.deepEqual(compileLines(s.compilations[1]), ['recompiled fused graph of 4 ops · 1.50 s', 'input 0 changed shape']);
});

test('the profile headline', () => {
  const lines = profileLines({
    cell: 'cell [5]',
    summary: { wall_s: 0.25, device_s: 0.1, ops: 12, compiles: 1, recompiles: 0, syncs: 2, cache_hit_rate: 0.5, peak_bytes: 2048, error: null },
    text: '',
    views: null
  });
  assert.deepEqual(lines, [
    'last %%tpu_profile (cell [5])',
    'wall 250.0 ms, waiting 100.0 ms',
    'ops 12 · compiles 1 (recompiles 0) · disk loads 0 · syncs 2',
    'cache hit rate 50% · peak memory 2.00 KiB'
  ]);
});

test('the memory polyline spans the box, highest sample at the top', () => {
  const pts = memoryPolyline(
    [
      { t: 0, allocated: 0, peak: null },
      { t: 1, allocated: 100, peak: null },
      { t: 2, allocated: 50, peak: null }
    ],
    200,
    80
  );
  assert.equal(pts, '0.0,80.0 100.0,0.0 200.0,40.0');
  assert.equal(memoryPolyline([{ t: 0, allocated: 5, peak: null }], 200, 80), '');
  // equal timestamps: spread evenly
  assert.equal(
    memoryPolyline([{ t: 1, allocated: 0, peak: null }, { t: 1, allocated: 0, peak: null }], 10, 10),
    '0.0,10.0 10.0,10.0'
  );
});

test('the profile headline splits the wall time and counts disk loads apart', () => {
  const lines = profileLines({
    cell: 'cell [7]',
    summary: { wall_s: 2, python_s: 0.5, tracing_s: 0.25, compile_s: 1, wait_s: 0.25, ops: 3, compiles: 0,
      recompiles: 0, disk_loads: 2, syncs: 1, cache_hit_rate: null, peak_bytes: 10, error: null, overhead_s: 0.125 },
    text: '',
    views: null
  });
  assert.equal(
    lines[1],
    'wall 2.00 s = Python 500.0 ms + torchtpu_lab overhead 125.0 ms + tracing 250.0 ms + compiling 1.00 s + waiting 250.0 ms'
  );
  assert.equal(lines[2], 'ops 3 · compiles 0 (recompiles 0) · disk loads 2 · syncs 1');
});

test('compile labels say what the program is and what a disk load means', () => {
  const row = { name: 'graph[336 ops]', kind: 'graph', ops: [['mul', 200], ['add', 100], ['tanh', 30]] as [string, number][],
    cause: 'first time this graph was seen', where: '', code: '', seconds: 2.7, nOps: 336, recompile: false, disk: true };
  assert.deepEqual(compileLines(row), [
    'loaded from the disk cache: fused graph of 336 ops (mul ×200, add ×100, tanh ×30, …) · 2.70 s',
    'no XLA compile: an earlier session compiled it (first time this graph was seen)'
  ]);
  const one = { ...row, name: 'graph[1 ops]', nOps: 1, ops: [['mul', 1]] as [string, number][], disk: false };
  assert.equal(compileLines(one)[0], 'compiled fused graph of 1 op (mul) · 2.70 s');
  assert.equal(compileLines({ ...row, disk: false, kind: 'op', name: 'aten::add' })[0], 'compiled op aten::add · 2.70 s');
  assert.equal(
    compileLines({ ...row, disk: false, kind: 'compiled', name: 'compiled forward [12 ops]' })[0],
    'compiled compiled forward [12 ops] · 2.70 s'
  );
});

test('the memory chart has axes: bytes up, time along', () => {
  assert.deepEqual(chartAxes([{ t: 0, allocated: 0, peak: null }, { t: 12.5, allocated: 2048, peak: null }]),
    { yTop: '2.00 KiB', yBottom: '0 B', xLeft: '-12.5 s', xRight: 'now' });
  assert.deepEqual(chartAxes([]), { yTop: '', yBottom: '', xLeft: '', xRight: '' });
});

const VIEWS = {
  v: 1,
  hardware: { flops: 532479, bytes_accessed: 16388, mfu: 0.0012, peak_flops: 3.8e10, peak_bandwidth: 1.5e9,
    peak_source: 'measured: 1024x1024 float32 matmul 38.4 GFLOP/s', text: '532 kFLOP · 16.4 kB accessed · MFU 0.12% of 38.4 GFLOP/s' },
  programs: [{ name: 'graph[3 ops]', runs: 4, n_ops: 3, device_s: 0.0116, bound: 'memory', roof_fraction: 0.0012,
    source: 'cell [3], line 2', text: 'graph[3 ops] · 4 runs · 11.6 ms · memory-bound, 0.12% of its roof' }],
  programs_total: 5,
  memory_at_peak: [{ bytes: 16384, kind: 'tensor', source: 'cell [2], line 1', text: '16.00 KiB · tensor float32[64, 64]' }],
  memory_owners_total: 1,
  peak_bytes: 16388,
  compare: { before: '-1', after: 'this cell', unchanged: 3,
    rows: [{ what: 'syncs', before: '20', after: '1', change: '-19 (x0.05)', changed: true }] }
};

test('the profile views parse and read as lines with their source', () => {
  const s = parseStatus({ ...STATUS, profile: { cell: 'cell [3]', summary: {}, text: '', views: VIEWS } })!;
  const v = s.profile!.views!;
  assert.deepEqual(hardwareLines(v), [VIEWS.hardware.text, 'peaks: measured: 1024x1024 float32 matmul 38.4 GFLOP/s']);
  assert.deepEqual(programLines(v), [
    ['graph[3 ops] · 4 runs · 11.6 ms · memory-bound, 0.12% of its roof', 'cell [3], line 2'],
    ['… 4 more programs in the report', '']
  ]);
  assert.equal(v.programs[0].bound, 'memory');
  assert.deepEqual(ownerLines(v), [['16.00 KiB · tensor float32[64, 64]', 'cell [2], line 1']]);
  assert.deepEqual(compareLines(v.compare!), ['compared with -1:', 'syncs: 20 → 1 (-19 (x0.05))', '3 more unchanged']);
  // another payload version, or junk, is no views at all (never half-read)
  assert.equal(parseStatus({ ...STATUS, profile: { views: { ...VIEWS, v: 2 } } })!.profile!.views, null);
  const junk = parseStatus({ ...STATUS, profile: { views: { v: 1, programs: [null, 3, { text: 7 }], compare: 'x' } } })!;
  assert.deepEqual(junk.profile!.views!.programs.map(p => p.text), ['']);
  assert.equal(junk.profile!.views!.compare, null);
  assert.deepEqual(hardwareLines(junk.profile!.views!), []);
});

test('compile messages parse; the status bar shows compiling… N s in place of the compile share', () => {
  assert.deepEqual(parseKernelMessage({ v: 1, type: 'compile', phase: 'start', kind: 'graph', seconds: 0.3 }),
    { type: 'compile', phase: 'start', kind: 'graph', seconds: 0.3 });
  assert.equal(parseKernelMessage({ v: 1, type: 'compile', phase: 'maybe' }).type, 'invalid');
  const s = parseStatus({ ...STATUS, compile_seconds: 4.1, cell_seconds: 10, compile_share: 0.41 })!;
  assert.equal(statusBarText(s), 'tpu XLA:CPU · fused · 3.00 MiB · compile 41% of time · 2 compiles');
  assert.deepEqual(statusBarParts(s).map(p => p.optional), [false, false, false, false, true]);
  const since = 1_000_000;
  assert.equal(compilingText({ kind: 'graph', since }, since + 12_400), 'compiling… 12 s');
  assert.equal(statusBarText(s, { kind: 'graph', since }, since + 3_000), 'tpu XLA:CPU · fused · 3.00 MiB · compiling… 3 s');
  assert.ok(summaryLines(s).includes('compile time: 4.10 s of 10.00 s in cells (41%)'));
});

test('peak markers: the chart top is the true peak reached between samples', () => {
  const samples = [
    { t: 0, allocated: 100, peak: null },
    { t: 1, allocated: 50, peak: 400 }, // 400 B was reached between t=0 and t=1
    { t: 2, allocated: 200, peak: null }
  ];
  assert.equal(chartAxes(samples).yTop, '400 B');
  assert.equal(memoryPolyline(samples, 200, 80), '0.0,60.0 100.0,70.0 200.0,40.0');
  assert.deepEqual(peakMarkers(samples, 200, 80), [{ x: 50, y: 0, label: 'peak 400 B (between two samples)' }]);
  assert.deepEqual(peakMarkers(samples.slice(0, 1), 200, 80), []);
});

test('rank rows of the last launch', () => {
  const s = parseStatus({ ...STATUS, ranks: [
    { rank: 0, state: 'running', seconds: 3.25, mode: 'fused', allocated: 1024, compiles: 4, compile_seconds: 1.2,
      syncs: 12, collectives: 3, compiling: null },
    { rank: 1, state: 'starting', seconds: 0 },
    'junk'
  ] })!;
  assert.equal(s.ranks.length, 2);
  assert.equal(rankLine(s.ranks[0]), 'rank 0 · running 3.3 s · fused · 1.00 KiB · 4 compiles (1.20 s) · 12 syncs · 3 collectives');
  assert.equal(rankLine(s.ranks[1]), 'rank 1 · starting 0.0 s');
  assert.equal(rankLine({ ...s.ranks[0], compiling: 2.7 }).split(' · ')[1], 'compiling… 2 s 3.3 s');
});

test('report links and the clear-cache question', () => {
  assert.deepEqual(parseGoto('6', '10'), { cell: 6, line: 10 });
  for (const [c, l] of [['0', '1'], ['6', ''], ['x', '1'], [undefined, '2'], ['1.5', '2'], ['-3', '2'], ['1e2', '1']]) {
    assert.equal(parseGoto(c, l), null, `${c}, ${l}`);
  }
  const q = clearCacheQuestion(parseStatus(STATUS));
  assert.ok(q.includes('2 entries in /tmp/cache') && q.includes('compiles again'), q);
});
