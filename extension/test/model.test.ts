// Unit tests of the frontend model (pure functions): `npm test` compiles them to CommonJS and runs node --test.
import { strict as assert } from 'node:assert';
import { test } from 'node:test';

import {
  chartAxes,
  compileLines,
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
  assert.deepEqual(msg.status.memoryHistory[1], { t: 101, allocated: 1024 });
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
    { t: 1, allocated: 2 },
    { t: 4, allocated: 8 }
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

test('the status bar text has platform, mode, memory used / limit and hit rate', () => {
  const s = parseStatus(STATUS)!;
  assert.equal(statusBarText(s), 'tpu XLA:CPU · fused · 3.00 MiB / n/a · cache 75% (2 compiles)');
  const lines = summaryLines(s);
  assert.ok(lines.some(l => l === 'eager mode: fused'));
  assert.ok(lines.some(l => l.includes('peak 4.00 MiB')));
});

test('compilations read as what, how long, why and where', () => {
  const s = parseStatus(STATUS)!;
  assert.deepEqual(compileLines(s.compilations[0]), [
    'compile graph_1 · 4 ops · 12.3 ms',
    'first time this graph structure is seen @ cell [2], line 3: y = (x @ x).relu().sum()'
  ]);
  assert.deepEqual(compileLines(s.compilations[1]), ['recompile graph_2 · 4 ops · 1.50 s', 'input 0 changed shape']);
});

test('the profile headline', () => {
  const lines = profileLines({
    cell: 'cell [5]',
    summary: { wall_s: 0.25, device_s: 0.1, ops: 12, compiles: 1, recompiles: 0, syncs: 2, cache_hit_rate: 0.5, peak_bytes: 2048, error: null },
    text: ''
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
      { t: 0, allocated: 0 },
      { t: 1, allocated: 100 },
      { t: 2, allocated: 50 }
    ],
    200,
    80
  );
  assert.equal(pts, '0.0,80.0 100.0,0.0 200.0,40.0');
  assert.equal(memoryPolyline([{ t: 0, allocated: 5 }], 200, 80), '');
  // equal timestamps: spread evenly
  assert.equal(memoryPolyline([{ t: 1, allocated: 0 }, { t: 1, allocated: 0 }], 10, 10), '0.0,10.0 10.0,10.0');
});

test('the profile headline splits the wall time and counts disk loads apart', () => {
  const lines = profileLines({
    cell: 'cell [7]',
    summary: { wall_s: 2, python_s: 0.5, tracing_s: 0.25, compile_s: 1, wait_s: 0.25, ops: 3, compiles: 0,
      recompiles: 0, disk_loads: 2, syncs: 1, cache_hit_rate: null, peak_bytes: 10, error: null },
    text: ''
  });
  assert.equal(lines[1], 'wall 2.00 s = Python 500.0 ms + tracing 250.0 ms + compiling 1.00 s + waiting 250.0 ms');
  assert.equal(lines[2], 'ops 3 · compiles 0 (recompiles 0) · disk loads 2 · syncs 1');
});

test('a graph compile is not named "graph graph[...]", and a disk load says so', () => {
  const row = { name: 'graph[336 ops]', kind: 'graph', cause: 'c', where: '', code: '', seconds: 2.7, nOps: 336,
    recompile: false, disk: true };
  assert.equal(compileLines(row)[0], 'load from disk (first time) graph[336 ops] · 336 ops · 2.70 s');
  assert.equal(compileLines({ ...row, disk: false, kind: 'op', name: 'aten::add' })[0], 'compile op aten::add · 336 ops · 2.70 s');
});

test('the memory chart has axes: bytes up, time along', () => {
  assert.deepEqual(chartAxes([{ t: 0, allocated: 0 }, { t: 12.5, allocated: 2048 }]),
    { yTop: '2.00 KiB', yBottom: '0 B', xLeft: '-12.5 s', xRight: 'now' });
  assert.deepEqual(chartAxes([]), { yTop: '', yBottom: '', xLeft: '', xRight: '' });
});
