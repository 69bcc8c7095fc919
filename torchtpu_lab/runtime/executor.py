"""Per-op execution: turn one ATen call on tpu tensors into one cached, traceable JAX function, then run it
(strict and debug modes) or record it into the lazy graph (fused mode, see :mod:`.fused`), and record its compiles.

For each call we build a *template* of the arguments and a list of the dynamic inputs (storage arrays and
scalars) with :mod:`.encode`; the template is the cache key. On a miss we (1) run the op on
meta tensors, which gives PyTorch's own output dtypes and shapes and PyTorch's own error for bad input, and
(2) jit a function that materializes the views, calls the lowering and casts to the meta dtypes. On a hit the
call costs one dict lookup plus one jitted dispatch (strict) or one graph node (fused).

Every compilation of a new signature is a telemetry event with its cause (:mod:`.compile_events`).

The public functions here (:func:`execute`, :func:`launch`, :func:`assign`, :func:`store`, :func:`value`,
:func:`materialize`) are the runtime's entry points: each holds :data:`.fused.LOCK` and passes the interrupt
checkpoint itself (:data:`.fused.entry_point`), whoever calls it. Inside, they call each other's unlocked bodies,
so the common path takes the lock once per op.
"""

from __future__ import annotations

import itertools
import time

import jax
import jax.numpy as jnp
import torch

from .. import caches, config, dtypes, platform, telemetry
from ..telemetry import SyncReason
from ..device import rng, sizes, tensor
from ..device.storage import Storage
from ..ops import error_flags as op_checks
from ..ops.random_bits import DrawKey
from ..ops.registry import Lowering, op_name
from . import compile_cache, compile_events, fast_keys, fused, layouts, op_facts, pending_errors, recording
from .encode import Encoder, cast, decode, device_from_args, meta_outputs, op_plan
from .signatures import OpSignature, Slot, Static

# part of every op signature (lowerings read it when traced); torch's own getter is a Python wrapper of this
_precision = getattr(torch._C, "_get_float32_matmul_precision", torch.get_float32_matmul_precision)
_default_dtype = torch.get_default_dtype  # also part of every op signature
_MODE = config.eager_mode  # read per op: a module global and a slot, no call
_TRACK_SOURCES = config.track_sources


def _wrap(out, meta, device_index: int, source=None, layout=None):
    """``out`` (an op's arrays or placeholders) as tpu tensors of ``meta``'s dtypes; ``layout``: where an output
    is laid out as CPU lays it out (:mod:`.layouts`), the view of its storage that the tensor is."""
    if type(meta) is torch.Tensor:  # the usual case: one output, its shape checked against PyTorch's metadata
        storage = Storage.output(out.shape, meta.dtype, device_index, out, source)
        if type(out) is fused.LazyValue:
            fused.track_new(storage)
        return tensor.make_base(storage) if layout is None else tensor.make(storage, layout)
    if out is None:
        return None
    if isinstance(out, (list, tuple)):
        metas = meta if isinstance(meta, (list, tuple)) else [None] * len(out)
        found = layout if isinstance(layout, list) else [None] * len(out)
        wrapped = [_wrap(o, m, device_index, source, v) for o, m, v in zip(out, metas, found)]
        return tuple(wrapped) if isinstance(out, tuple) else wrapped
    dtype = meta.dtype if isinstance(meta, torch.Tensor) else dtypes.to_torch(out.dtype)
    t = tensor.from_array(out, dtype, device_index)
    if isinstance(out, fused.LazyValue):
        fused.track(t.tpu_storage)
    return t


_UIDS = itertools.count()


class OpExecutable:
    """One op signature: its traceable function, the jitted version, PyTorch's output metadata, and (once
    fused mode needs them) the abstract outputs."""

    __slots__ = ("run", "jit", "_jitted", "meta", "avals", "treedef", "name", "ran_eagerly", "executable",
                 "exec_device", "from_disk", "uid", "signature", "checks", "single", "multi", "layout")

    def __init__(self, run, jit: bool, meta, name: str, checks: list | None = None, layout=None):
        self.run = run
        self.jit = jit  # whether it runs compiled (else op by op, as jnp calls)
        self._jitted = None
        self.ran_eagerly = False  # the jitted version (an XLA executable of its own) has been compiled
        self.meta = meta
        self.avals = None  # flattened output ShapeDtypeStructs, computed on first use in fused mode
        self.treedef = None
        self.name = name
        self.executable = None  # the compiled (or disk-loaded) executable strict mode calls directly
        self.exec_device = None  # the device index it was compiled for
        self.from_disk = False
        self.uid = next(_UIDS)  # stands for the signature in fused graph keys (an int hashes in no time)
        self.signature = None  # the OpSignature (set by execute on a miss)
        self.checks = checks  # an op that reports bad input: run returns (outputs, flags); see .checks
        self.single = False  # recorded before, one tensor output, no checks: fused mode's short path applies
        self.multi = False  # recorded before, several tensor outputs, no checks: the recording kernel may learn it
        self.layout = layout  # layouts.outputs(meta): outputs stored in CPU's memory order, as views (or None)

    @property
    def jitted(self):
        """``jax.jit(run)``, made on first use: fused mode records most signatures without ever calling it, and
        making one costs ~0.15 ms (a warm process's first AdamW step makes 40)."""
        if self._jitted is None:
            self._jitted = jax.jit(self.run, compiler_options=compile_cache.compiler_options("op"))
        return self._jitted


def _aval(v):
    if isinstance(v, (jax.Array, fused.LazyValue)):
        return jax.ShapeDtypeStruct(v.shape, v.dtype)
    return v


def _concrete(dyn: list, op_label: str) -> list:
    """``dyn`` with every lazy input materialized (a sync point when fused work is pending)."""
    if not fused.has_pending() or not any(isinstance(v, fused.LazyValue) for v in dyn):
        return dyn
    fused.sync(SyncReason.CONCRETE_INPUTS, detail=op_label)
    return [v.value if isinstance(v, fused.LazyValue) else v for v in dyn]


def _records(compiled: OpExecutable, has_tensor_inputs: bool, device_index: int) -> bool:
    """Whether :func:`launch` records this call into the lazy graph rather than running it (fused mode).

    A factory (``arange``, ``ones``, ``full``, ``scalar_tensor``: no tensor inputs) called while work is pending
    for its device joins that graph, so a step's masks, positions and constants are part of its program instead
    of programs of their own; one that would start a graph runs now, as before: its output is a concrete array
    the graph after it reads (a tensor made at the top of a cell is allocated where it was made, and the first
    tpu tensor of a process initialises the device)."""
    if _MODE.value != "fused" or not compiled.jit:
        return False
    return has_tensor_inputs or (fused.has_pending() and fused.PENDING.device == device_index)


def _launch(compiled: OpExecutable, key, dyn: list, device_index: int, has_tensor_inputs: bool,
            records: bool | None = None):
    """Run (strict/debug) or record (fused) one compiled signature on its dynamic inputs (``records``: the
    caller's :func:`_records` answer, when it has one)."""
    if records is None:
        records = _records(compiled, has_tensor_inputs, device_index)
    if records:
        if compiled.avals is None:
            _learn_avals(compiled, key, dyn, device_index)
        source = telemetry.user_source(3) if _TRACK_SOURCES.value or compiled.checks is not None else None
        fused.on_device(device_index)
        out = fused.record(key, compiled.run, dyn, compiled.avals, compiled.treedef, compiled.name, source,
                          compiled.uid)
        if compiled.checks is not None:
            out, flags = out
            fused.also_compute(jax.tree_util.tree_leaves(flags),
                               pending_errors.callback(compiled.checks, compiled.name, source))
        return out
    out = run_now(compiled, key, _concrete(dyn, compiled.name), device_index, has_tensor_inputs)
    mode = _MODE.value
    if compiled.checks is not None:
        out, flags = out
        pending_errors.note(jax.tree_util.tree_leaves(flags), compiled.checks, compiled.name, telemetry.user_source(3))
        if mode == "debug":
            pending_errors.raise_pending()
    if mode == "debug":
        _debug_check(compiled.name, out)
    return out


launch = fused.entry_point(_launch)


def run_now(compiled: OpExecutable, key, dyn: list, device_index: int, has_tensor_inputs: bool):
    """Run one compiled signature now on concrete inputs, in any mode (a read of a view's values cannot wait for
    a fused graph); its first run compiles it or loads it from the persistent cache."""
    exe = compiled.executable
    if exe is not None and compiled.exec_device == device_index:
        try:
            return exe(*dyn)  # the hot path: the executable itself, not jax.jit's dispatch
        except TypeError:  # inputs differ in a weak type or dtype from those it was compiled for: let jit decide
            return compiled.jitted(*dyn)
    if compiled.jit:
        return _first_run(compiled, key, dyn, device_index, has_tensor_inputs)
    if has_tensor_inputs:
        return compiled.run(*dyn)
    with jax.default_device(platform.jax_device(device_index)):
        return compiled.run(*dyn)


def _first_run(compiled: OpExecutable, key, dyn: list, device_index: int, has_tensor_inputs: bool):
    """Compile (or load from the persistent cache) the executable of ``compiled`` for ``device_index`` and run it.
    On another device than the one it holds, jit's own dispatch serves (multi-device use is rare)."""
    if compiled.executable is not None:
        return compiled.jitted(*dyn)
    device = platform.jax_device(device_index)
    if has_tensor_inputs:
        exe, disk = compile_cache.executable(compiled.run, dyn, "op", key, device, checks=compiled.checks)
        out = exe(*dyn)
    else:
        with jax.default_device(device):
            exe, disk = compile_cache.executable(compiled.run, dyn, "op", key, device, checks=compiled.checks)
            out = exe(*dyn)
    compiled.executable, compiled.exec_device, compiled.from_disk = exe, device_index, disk
    return out


_NO_AVALS = object()


def _learn_avals(compiled: OpExecutable, key, dyn: list, device_index: int) -> None:
    """Fill in ``compiled``'s abstract outputs, which fused mode records without running the op: PyTorch's
    metadata where it describes them; else the persistent cache's record of an earlier trace (an op with checks:
    :mod:`.op_facts`); else a trace.

    Zero-size inputs and complex numbers always trace (:func:`_traces_first`), so a lowering's own error for
    them is raised here, at the op, as in strict mode (PyTorch's meta kernels do not always check). An op with
    checks returns its error flags next to its outputs, which PyTorch's metadata does not describe."""
    traced = _traces_first(key)
    out = _meta_avals(compiled.meta, compiled.layout) if compiled.checks is None and not traced else _NO_AVALS
    stored = compiled.checks is not None and not traced and compiled.signature is not None
    if out is _NO_AVALS and stored:
        known = op_facts.known(compiled.signature, platform.jax_device(device_index))
        if known is not None:
            avals, compiled.treedef, compiled.checks[:] = known
            sizes.check_outputs(avals)
            compiled.avals = avals
            return
    if out is _NO_AVALS:
        out = jax.eval_shape(compiled.run, *[_aval(v) for v in dyn])
    leaves, treedef = jax.tree_util.tree_flatten(out)
    sizes.check_outputs(leaves)
    compiled.avals, compiled.treedef = leaves, treedef
    meta = compiled.meta
    compiled.single = compiled.checks is None and type(meta) is torch.Tensor
    compiled.multi = (compiled.checks is None and type(meta) in (tuple, list) and len(meta) > 1
                      and all(m is None or type(m) is torch.Tensor for m in meta)
                      and sum(m is not None for m in meta) == len(leaves) >= 1)
    if stored:
        op_facts.remember(compiled.signature, platform.jax_device(device_index), leaves, treedef, compiled.checks)


def _traces_first(key) -> bool:
    """Whether an op signature has a tensor input with no elements, or a complex Python number: lowerings check
    both (an empty reduction; a complex value written into a real tensor) where PyTorch's meta kernels do not."""
    def traced(t) -> bool:
        if isinstance(t, Slot):
            return 0 in t.shape if t.kind != "S" else t.dtype is complex
        if isinstance(t, Static):
            return t.type is complex
        return isinstance(t, tuple) and any(traced(x) for x in t)

    return isinstance(key, OpSignature) and (any(traced(a) for a in key.args)
                                             or any(traced(v) for _, v in key.kwargs))


def _meta_avals(meta, layout=None):
    """The abstract outputs of an op read off PyTorch's metadata (exact: ``cast`` makes every lowering's output
    match it; an output with a ``layout`` is stored in its memory order), so recording a new signature in fused
    mode needs no trace; ``_NO_AVALS`` where it cannot say."""
    if isinstance(meta, torch.Tensor):
        shape = tuple(meta.shape)
        if layout is not None:
            shape = tuple(shape[d] for d in layouts.storage_order(layout))
        return jax.ShapeDtypeStruct(shape, dtypes.to_jax(meta.dtype))
    if isinstance(meta, (list, tuple)):
        found = layout if isinstance(layout, list) else [None] * len(meta)
        parts = [_meta_avals(m, v) for m, v in zip(meta, found)]
        return _NO_AVALS if any(p is _NO_AVALS for p in parts) else type(meta)(parts)
    return _NO_AVALS


def _debug_check(name: str, out) -> None:
    """Debug mode: wait for the op, so errors surface here, and optionally check its outputs are finite."""
    try:
        jax.block_until_ready(out)
    except Exception as e:  # noqa: BLE001
        raise RuntimeError(f"{name} failed at {telemetry.describe(telemetry.user_source(3))}: {e}") from e
    if config.check_finite.value:
        for leaf in jax.tree_util.tree_leaves(out):
            if jnp.issubdtype(leaf.dtype, jnp.inexact) and not bool(jnp.isfinite(leaf).all()):
                raise FloatingPointError(
                    f"{name} produced NaN or Inf at {telemetry.describe(telemetry.user_source(3))} "
                    "(torchtpu_lab.debug.check_finite is on)"
                )


#: Compiled op signatures (strict/debug executables and fused-mode node functions), bounded.
OPS = caches.cache("ops", 4096, code=True)
#: The same executables by a repeated call's flat key (:mod:`.fast_keys`): found without building a template.
_FAST = fast_keys.EXECUTABLES
#: op id -> its :func:`.encode.op_plan` (ops live as long as the process; a plain dict, read once per op)
_PLANS: dict = {}
_COUNTERS = telemetry.counters
#: ``(storages grown by appends, rewrite)``: runtime/bounded.py fills it in on import (it imports this module); an
#: op runs on padded extents (``rewrite``'s result) while the first is non-empty and the rewrite applies
BOUNDED: list = [None, None]
#: Every lowered op compiled in this process (the CI conformance subset checks it covers the whole op table);
#: filled on cache misses only, so the hot path never touches it.
OPS_SEEN: set = set()


def _generator(args, kwargs) -> torch.Generator | None:
    """The ``generator=`` a random op was given (keyword or positional), or ``None``."""
    g = kwargs.get("generator") if kwargs else None
    if g is None:
        g = next((a for a in args if isinstance(a, torch.Generator)), None)
    return g


@fused.entry_point
def execute(low: Lowering, args: tuple, kwargs: dict):
    """Run ``low.op`` on ``args``/``kwargs`` (tpu tensors and Python values); return wrapped tpu results."""
    grown, rewrite = BOUNDED
    if grown and (out := rewrite(low, args, kwargs)) is not None:
        return out
    op = low.op
    plan = _PLANS.get(id(op))
    if plan is None:
        plan = _PLANS[id(op)] = op_plan(op)
    positions, names, host = plan
    precision = _precision()
    default_dtype = _default_dtype()
    fast = None if low.rng else fast_keys.key(id(op), positions, names, not low.static_scalars, args, kwargs)
    compiled = None
    if fast is not None:
        fast_key, dyn, device_index = fast
        fast_key = (fast_key, precision, default_dtype)
        compiled = _FAST.get(fast_key)
    fresh = False
    if compiled is None:  # the general path: the argument template names the executable
        enc = Encoder(low.static_scalars, host)
        encode = enc.encode
        targs = tuple([encode(a, i in positions) for i, a in enumerate(args)])
        tkwargs = tuple([(k, encode(v, k in names)) for k, v in kwargs.items()]) if kwargs else ()
        device_index = enc.device_index
        if device_index is None:
            device_index = device_from_args(args, kwargs)
        if low.rng:
            enc.dyn.extend(rng.next_seed_and_counter(device_index, _generator(args, kwargs)))
        dyn = enc.dyn
        # the in-memory key names the op by identity (OpOverloads live as long as the process, and hashing one
        # is a Python call); the OpSignature is built once, on a miss
        compiled = OPS.get((id(op), targs, tkwargs, precision, default_dtype))
        fresh = compiled is None
        if fresh:
            t0 = time.perf_counter()
            OPS_SEEN.add(op)
            compiled = _compile(low, targs, tkwargs, dyn, low.jit_for(args, kwargs))
            compiled.signature = OpSignature(op, targs, tkwargs, precision, default_dtype)
            OPS.put((id(op), targs, tkwargs, precision, default_dtype), compiled)
        if fast is not None:
            _FAST.put(fast_key, compiled)
        has_tensors = enc.device_index is not None
    else:
        has_tensors = True  # a fast key needs a tensor input
    mode = _MODE.value
    if _records(compiled, has_tensors, device_index):  # a factory only when it joins a pending graph
        if compiled.single:
            lesson = recording.lesson_pending
            if lesson is not None and lesson():  # the recording kernel keyed this call: teach it the entry
                recording.learn(op, compiled, dyn, args, kwargs, positions, names, not low.static_scalars)
            return _record_single(compiled, dyn, device_index)
        if compiled.multi:  # recorded below; the recording kernel may learn it too
            lesson = recording.lesson_pending
            if lesson is not None and lesson():
                recording.learn(op, compiled, dyn, args, kwargs, positions, names, not low.static_scalars)
    elif (mode == "strict" or (mode == "fused" and not has_tensors)) and compiled.ran_eagerly \
            and compiled.checks is None and not fused.has_pending():
        lesson = recording.lesson_pending
        if lesson is not None and compiled.exec_device == device_index and lesson():
            recording.learn_strict(op, compiled, dyn, args, kwargs, positions, names, not low.static_scalars)
        return _run_repeated(compiled, dyn, device_index, has_tensors)
    key = compiled.signature
    t_launch = time.perf_counter()
    records = _records(compiled, has_tensors, device_index)
    out = _launch(compiled, key, dyn, device_index, has_tensors, records)
    if records and compiled.checks is not None:  # recorded with its error flags (now with its avals): teachable
        lesson = recording.lesson_pending
        if lesson is not None and lesson():
            recording.learn(op, compiled, dyn, args, kwargs, positions, names, not low.static_scalars)
    # an executable ran (strict/debug) rather than being recorded (fused): its first run compiled it
    hit = None
    if not records and compiled.jit:
        hit = compiled.ran_eagerly
        if hit:
            telemetry.counters["op_cache_hits"] += 1
        else:
            compiled.ran_eagerly = True
            compile_events.note_compile("op", key, None, compile_events.op_cause(key),
                                        time.perf_counter() - (t0 if fresh else t_launch), disk=compiled.from_disk)
    result = _outputs(compiled, out, device_index, t_launch if not fresh else t0, hit)
    if fused.over_limit():
        fused.sync(SyncReason.GRAPH_LIMIT)
    return result


def _outputs(compiled: OpExecutable, out, device_index: int, t0: float, hit: bool | None, source=None,
             stack=None):
    """The end of every op the executor runs or records: its op event (batched, only while a profile records:
    :func:`telemetry.record_op`) and its outputs wrapped as tpu tensors. ``source``/``stack``: the user's line
    and stack when the caller took them already."""
    if telemetry.recorders:
        if stack is None:
            source, stack = telemetry.op_sources(3)
        telemetry.record_op(compiled.name, t0, time.perf_counter() - t0, hit, source, stack)
    return _wrap(out, compiled.meta, device_index, source, compiled.layout)


def _record_single(compiled: OpExecutable, dyn: list, device_index: int):
    """Fused mode's usual op — recorded before, one tensor output, no checks — recorded and wrapped with what
    :func:`execute`, :func:`_launch` and :func:`_wrap` do for it, without their branches for the rare cases.
    The user's line is read once and serves the graph node, the op event and the output's memory record."""
    t0 = time.perf_counter()
    if telemetry.recorders:
        source, stack = telemetry.op_sources(3)
    else:
        source, stack = (telemetry.user_source(3) if _TRACK_SOURCES.value else None), None
    if fused.PENDING.device != device_index:
        fused.on_device(device_index)
    value = fused.record_one(compiled.signature, compiled.run, dyn, compiled.avals, compiled.treedef,
                             compiled.name, source, compiled.uid)
    result = _outputs(compiled, value, device_index, t0, None, source, stack)
    if fused.over_limit():
        fused.sync(SyncReason.GRAPH_LIMIT)
    return result


def _run_repeated(compiled: OpExecutable, dyn: list, device_index: int, has_tensor_inputs: bool = True):
    """Strict mode (or a factory with no pending graph to join), an op whose executable ran before (a cache
    hit) and has no checks: run it and wrap its outputs, without :func:`execute` and :func:`_launch`'s branches
    for first runs, checks and pending work."""
    t0 = time.perf_counter()
    out = run_now(compiled, compiled.signature, dyn, device_index, has_tensor_inputs)
    _COUNTERS["op_cache_hits"] += 1
    return _outputs(compiled, out, device_index, t0, True)


def _compile(low: Lowering, targs, tkwargs, dyn, jit: bool) -> OpExecutable:
    op = low.op
    meta = meta_outputs(op, targs, tkwargs, dyn) if jit else None
    sizes.check_outputs(meta)  # before XLA sees an absurd shape (it aborts the process)
    layout = layouts.outputs(meta)

    def run(*dyn_values):
        a = [decode(t, dyn_values) for t in targs]
        k = {name: decode(t, dyn_values) for name, t in tkwargs}
        if low.rng:
            k["key"] = DrawKey(dyn_values[-2], dyn_values[-1])
        return layouts.apply(cast(op, low.fn(*a, **k), meta), layout)

    if op_checks.reporting(low.fn):
        run, statics = pending_errors.instrument(run)
        return OpExecutable(run, jit, meta, op_name(op), statics, layout)
    return OpExecutable(run, jit, meta, op_name(op), layout=layout)


def cache_size() -> int:
    return len(OPS)
