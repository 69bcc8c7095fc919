"""Per-op execution: turn one ATen call on tpu tensors into one cached, traceable JAX function, then run it
(strict and debug modes) or record it into the lazy graph (fused mode, see :mod:`.lazy`).

For each call we build a *template* of the arguments — tensors become slots naming their dtype, shape and view
geometry, ``Scalar`` arguments become dynamic slots, everything else is kept as a static value — and a list of
the dynamic inputs (storage arrays and scalars). The template is the cache key. On a miss we (1) run the op on
meta tensors, which gives PyTorch's own output dtypes and shapes and PyTorch's own error for bad input, and
(2) jit a function that materializes the views, calls the lowering and casts to the meta dtypes. On a hit the
call costs one dict lookup plus one jitted dispatch (strict) or one graph node (fused).

Every compilation of a new signature is a telemetry event with its cause (:mod:`.compile_events`).
"""

from __future__ import annotations

import itertools
import time

import jax
import jax.numpy as jnp
import torch

from .. import caches, dtypes, platform, telemetry
from ..telemetry import SyncReason
from ..device import context, rng, sizes, tensor, views
from ..ops import checks as op_checks
from ..ops.registry import Lowering, op_name
from . import checks, compile_cache, compile_events, lazy, modes
from .signatures import OpSignature, Slot, Static

_precision = torch.get_float32_matmul_precision  # part of every op signature: lowerings read it when traced


_MISSING_META = object()
# A meta kernel that cannot say (no meta kernel, data-dependent shapes, or one that trips over a None optional
# argument, as the fused LSTM cell's does without biases) means "no metadata", not a user error.
_META_SKIP = (NotImplementedError, AttributeError)
try:
    from torch._subclasses.fake_tensor import DataDependentOutputException, DynamicOutputShapeException

    _META_SKIP = (NotImplementedError, AttributeError, DataDependentOutputException, DynamicOutputShapeException)
except ImportError:  # pragma: no cover
    pass


@caches.memoize("op_schemas", 8192)
def _scalar_args(op: torch._ops.OpOverload) -> tuple[frozenset, frozenset]:
    """Positions and names of the op's arguments where a Python number is a *value*, not configuration: those
    typed ``Scalar`` (or ``Scalar?``), and those typed ``Tensor`` that received a number (a wrapped scalar, as
    decompositions pass to ``aten.div.Tensor``). Numbers there become graph inputs, never constants."""
    positions, names = set(), set()
    for i, arg in enumerate(op._schema.arguments):
        t = arg.type
        if isinstance(t, torch.OptionalType):
            t = t.getElementType()
        if t.kind() in ("NumberType", "TensorType"):
            names.add(arg.name)
            if not arg.kwarg_only:
                positions.add(i)
    return frozenset(positions), frozenset(names)


class _Encoder:
    """Builds a hashable template of an argument structure and collects its dynamic inputs."""

    __slots__ = ("dyn", "device_index", "static_scalars", "host_tensors")

    def __init__(self, static_scalars: bool, host_tensors: bool = False):
        self.dyn: list = []
        self.device_index: int | None = None
        self.static_scalars = static_scalars
        self.host_tensors = host_tensors  # CPU tensors of any shape are accepted (index tensors, as on CUDA)

    def encode(self, v, scalar: bool = False):
        if not isinstance(v, tensor.TpuTensor) and isinstance(v, torch.Tensor) and v.device.type == "tpu":
            v = tensor.adopt(v)
        if isinstance(v, tensor.TpuTensor):
            storage = v._tpu_storage
            if self.device_index is None:
                self.device_index = storage.device_index
            elif storage.device_index != self.device_index:
                raise RuntimeError(
                    "Expected all tensors to be on the same device, but found at least two devices, "
                    f"tpu:{self.device_index} and tpu:{storage.device_index}!"
                )
            self.dyn.append(storage.array)
            index, view = len(self.dyn) - 1, v._tpu_view
            if view is not None:  # the offset is an input right after the array (device/views.py)
                view, offset = views.dynamic(storage.shape, view)
                if offset is not None:
                    self.dyn.append(offset)
            return Slot("T", index, v.dtype, tuple(v.shape), storage.shape, view)
        if isinstance(v, torch.Tensor):
            if v.device.type == "cpu" and v.dim() != 0 and self.host_tensors:
                self.dyn.append(jnp.asarray(dtypes.host_array(v)))
                return Slot("H", len(self.dyn) - 1, v.dtype, tuple(v.shape), (), None)
            if v.dim() != 0 or v.device.type != "cpu":
                raise RuntimeError(
                    "Expected all tensors to be on the same device, but found at least two devices, "
                    f"tpu:{self.device_index or 0} and {v.device}!"
                )
            self.dyn.append(jnp.asarray(dtypes.host_array(v)))
            return Slot("H", len(self.dyn) - 1, v.dtype, (), (), None)
        if isinstance(v, (list, tuple)):
            return tuple(self.encode(x, scalar) for x in v)
        if scalar and not self.static_scalars and isinstance(v, (bool, int, float, complex)):
            self.dyn.append(v)
            return Slot("S", len(self.dyn) - 1, type(v), (), (), None)
        if isinstance(v, torch.Generator):
            return None
        if isinstance(v, (bool, int, float, complex)):
            return Static(type(v), v)
        return v


def _decode(t, dyn, meta: bool = False):
    if isinstance(t, Slot):
        if t.kind == "S":
            return dyn[t.index]
        if meta:
            return torch.empty(t.shape, dtype=t.dtype, device="meta")
        if t.kind == "H":
            return dyn[t.index]
        return views.read(dyn[t.index], t.base_shape, t.view, _offset(t.view, dyn, t.index))
    if isinstance(t, Static):
        return t.value
    if isinstance(t, tuple):
        return [_decode(x, dyn, meta) for x in t]
    if meta and isinstance(t, torch.device) and t.type == "tpu":
        return torch.device("meta")
    return t


def _offset(view, dyn, index: int):
    """The offset input of a view whose offset moves (right after its storage array), else ``None``."""
    return dyn[index + 1] if view is not None and view.moves else None


def _meta_outputs(op, targs, tkwargs, dyn):
    """PyTorch's own output metadata for this call, or ``None`` where no meta kernel can say."""
    try:
        return op(*[_decode(a, dyn, True) for a in targs], **{k: _decode(v, dyn, True) for k, v in tkwargs})
    except _META_SKIP:
        return None


def _cast(op, out, meta):
    if meta is None:
        return out
    if isinstance(meta, torch.Tensor):
        if tuple(out.shape) != tuple(meta.shape):
            raise RuntimeError(
                f"torchtpu_lab bug: the lowering of {op} produced shape {tuple(out.shape)} "
                f"where PyTorch expects {tuple(meta.shape)}"
            )
        want = dtypes.to_jax(meta.dtype)
        return out if out.dtype == want else out.astype(want)
    if isinstance(meta, (list, tuple)):
        if not isinstance(out, (list, tuple)) or len(out) != len(meta):
            raise RuntimeError(f"torchtpu_lab bug: the lowering of {op} returned {type(out).__name__} "
                               f"where PyTorch expects {len(meta)} outputs")
        # PyTorch's container type, so output avals can be read off the metadata without tracing
        return type(meta)(_cast(op, o, m) for o, m in zip(out, meta))
    return out


def _wrap(out, meta, device_index: int):
    if out is None:
        return None
    if isinstance(out, (list, tuple)):
        metas = meta if isinstance(meta, (list, tuple)) else [None] * len(out)
        wrapped = [_wrap(o, m, device_index) for o, m in zip(out, metas)]
        return tuple(wrapped) if isinstance(out, tuple) else wrapped
    dtype = meta.dtype if isinstance(meta, torch.Tensor) else dtypes.to_torch(out.dtype)
    t = tensor.from_array(out, dtype, device_index)
    if isinstance(out, lazy.LazyValue):
        lazy.track(t._tpu_storage)
    return t


_UIDS = itertools.count()


class OpExecutable:
    """One op signature: its traceable function, the jitted version, PyTorch's output metadata, and (once
    fused mode needs them) the abstract outputs."""

    __slots__ = ("run", "jitted", "meta", "avals", "treedef", "name", "ran_eagerly", "executable", "exec_device",
                 "from_disk", "uid", "signature", "checks")

    def __init__(self, run, jit: bool, meta, name: str, checks: list | None = None):
        self.run = run
        self.jitted = jax.jit(run) if jit else None
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


def _aval(v):
    if isinstance(v, (jax.Array, lazy.LazyValue)):
        return jax.ShapeDtypeStruct(v.shape, v.dtype)
    return v


def _concrete(dyn: list, op_label: str) -> list:
    """``dyn`` with every lazy input materialized (a sync point when fused work is pending)."""
    if not lazy.has_pending() or not any(isinstance(v, lazy.LazyValue) for v in dyn):
        return dyn
    lazy.sync(SyncReason.CONCRETE_INPUTS, detail=op_label)
    return [v.value if isinstance(v, lazy.LazyValue) else v for v in dyn]


def _records(compiled: OpExecutable, has_tensor_inputs: bool) -> bool:
    """Whether :func:`launch` records this call into the lazy graph rather than running it."""
    return modes.current() == "fused" and compiled.jitted is not None and has_tensor_inputs


def launch(compiled: OpExecutable, key, dyn: list, device_index: int, has_tensor_inputs: bool,
           records: bool | None = None):
    """Run (strict/debug) or record (fused) one compiled signature on its dynamic inputs (``records``: the
    caller's :func:`_records` answer, when it has one)."""
    if records is None:
        records = _records(compiled, has_tensor_inputs)
    if records:
        if compiled.avals is None:
            # zero-size inputs: trace, so a lowering's own error for them (an empty reduction) is raised here,
            # at the op, as in strict mode (PyTorch's meta kernels do not always check); an op with checks
            # returns its error flags next to its outputs, which PyTorch's metadata does not describe
            if compiled.checks is not None or _has_empty_slot(key):
                out = _NO_AVALS
            else:
                out = _meta_avals(compiled.meta)
            if out is _NO_AVALS:
                out = jax.eval_shape(compiled.run, *[_aval(v) for v in dyn])
            sizes.check_outputs(jax.tree_util.tree_leaves(out))
            compiled.avals, compiled.treedef = jax.tree_util.tree_flatten(out)
        source = telemetry.user_source(3) if lazy.track_sources or compiled.checks is not None else None
        lazy.on_device(device_index)
        out = lazy.record(key, compiled.run, dyn, compiled.avals, compiled.treedef, compiled.name, source,
                          compiled.uid)
        if compiled.checks is not None:
            out, flags = out
            lazy.also_compute(jax.tree_util.tree_leaves(flags), checks.callback(compiled.checks, compiled.name, source))
        return out
    out = _run(compiled, key, _concrete(dyn, compiled.name), device_index, has_tensor_inputs)
    mode = modes.current()
    if compiled.checks is not None:
        out, flags = out
        checks.note(jax.tree_util.tree_leaves(flags), compiled.checks, compiled.name, telemetry.user_source(3))
        if mode == "debug":
            checks.raise_pending()
    if mode == "debug":
        _debug_check(compiled.name, out)
    return out


def _run(compiled: OpExecutable, key, dyn: list, device_index: int, has_tensor_inputs: bool):
    """Run one compiled signature now on concrete inputs."""
    exe = compiled.executable
    if exe is not None and compiled.exec_device == device_index:
        try:
            return exe(*dyn)  # the hot path: the executable itself, not jax.jit's dispatch
        except TypeError:  # inputs differ in a weak type or dtype from those it was compiled for: let jit decide
            return compiled.jitted(*dyn)
    if compiled.jitted is not None:
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


def _has_empty_slot(key) -> bool:
    """Whether an op signature has a tensor input with no elements."""
    def empty(t) -> bool:
        if isinstance(t, Slot):
            return t.kind != "S" and 0 in t.shape
        return isinstance(t, tuple) and not isinstance(t, Static) and any(empty(x) for x in t)

    return isinstance(key, OpSignature) and (any(empty(a) for a in key.args)
                                             or any(empty(v) for _, v in key.kwargs))


def _meta_avals(meta):
    """The abstract outputs of an op read off PyTorch's metadata (exact: ``_cast`` makes every lowering's output
    match it), so recording a new signature in fused mode needs no trace; ``_NO_AVALS`` where it cannot say."""
    if isinstance(meta, torch.Tensor):
        return jax.ShapeDtypeStruct(tuple(meta.shape), dtypes.to_jax(meta.dtype))
    if isinstance(meta, (list, tuple)):
        parts = [_meta_avals(m) for m in meta]
        return _NO_AVALS if any(p is _NO_AVALS for p in parts) else type(meta)(parts)
    return _NO_AVALS


def _debug_check(name: str, out) -> None:
    """Debug mode: wait for the op, so errors surface here, and optionally check its outputs are finite."""
    try:
        jax.block_until_ready(out)
    except Exception as e:  # noqa: BLE001
        raise RuntimeError(f"{name} failed at {telemetry.describe(telemetry.user_source(3))}: {e}") from e
    if modes.checking_finite():
        for leaf in jax.tree_util.tree_leaves(out):
            if jnp.issubdtype(leaf.dtype, jnp.inexact) and not bool(jnp.isfinite(leaf).all()):
                raise FloatingPointError(
                    f"{name} produced NaN or Inf at {telemetry.describe(telemetry.user_source(3))} "
                    "(torchtpu_lab.debug.check_finite is on)"
                )


#: Compiled op signatures (strict/debug executables and fused-mode node functions), bounded.
_OPS = caches.cache("ops", 4096)
#: Ops that accept CPU index tensors next to tpu tensors (as CUDA does); those are copied to the device.
HOST_INDEX_OPS = frozenset({
    torch.ops.aten.index.Tensor, torch.ops.aten._unsafe_index.Tensor, torch.ops.aten.index_put.default,
    torch.ops.aten._unsafe_index_put.default, torch.ops.aten._index_put_impl.default,
})
#: Every lowered op compiled in this process (the CI conformance subset checks it covers the whole op table);
#: filled on cache misses only, so the hot path never touches it.
OPS_SEEN: set = set()


def _generator(args, kwargs) -> torch.Generator | None:
    """The ``generator=`` a random op was given (keyword or positional), or ``None``."""
    g = kwargs.get("generator") if kwargs else None
    if g is None:
        g = next((a for a in args if isinstance(a, torch.Generator)), None)
    return g


def _device_from_args(args, kwargs) -> int:
    dev = kwargs.get("device")
    if dev is None:
        dev = next((a for a in args if isinstance(a, torch.device)), None)
    if isinstance(dev, torch.device) and dev.type == "tpu" and dev.index is not None:
        return dev.index
    return context.current_index()


_PLANS = caches.cache("op_plans", 8192)


def _op_plan(op) -> tuple:
    """``(scalar positions, scalar names, accepts host index tensors)`` of ``op``, looked up by the op's
    identity (an int hashes in no time; an OpOverload's hash is a Python call)."""
    plan = _PLANS.get(id(op))
    if plan is None:
        plan = (*_scalar_args(op), op in HOST_INDEX_OPS)
        _PLANS.put(id(op), plan)
    return plan


def execute(low: Lowering, args: tuple, kwargs: dict):
    """Run ``low.op`` on ``args``/``kwargs`` (tpu tensors and Python values); return wrapped tpu results."""
    op = low.op
    positions, names, host = _op_plan(op)
    enc = _Encoder(low.static_scalars, host)
    encode = enc.encode
    targs = tuple([encode(a, i in positions) for i, a in enumerate(args)])
    tkwargs = tuple([(k, encode(v, k in names)) for k, v in kwargs.items()]) if kwargs else ()
    device_index = enc.device_index
    if device_index is None:
        device_index = _device_from_args(args, kwargs)
    if low.rng:
        enc.dyn.extend(rng.next_seed_and_counter(device_index, _generator(args, kwargs)))
    precision = _precision()
    # the in-memory key names the op by identity (OpOverloads live as long as the process, and hashing one is a
    # Python call); the OpSignature is built once, on a miss
    compiled = _OPS.get((id(op), targs, tkwargs, precision))
    fresh = compiled is None
    if fresh:
        t0 = time.perf_counter()
        OPS_SEEN.add(op)
        compiled = _compile(low, targs, tkwargs, enc.dyn, low.jit_for(args, kwargs))
        compiled.signature = OpSignature(op, targs, tkwargs, precision)
        _OPS.put((id(op), targs, tkwargs, precision), compiled)
    key = compiled.signature
    has_tensors = enc.device_index is not None
    t_launch = time.perf_counter()
    records = _records(compiled, has_tensors)
    out = launch(compiled, key, enc.dyn, device_index, has_tensors, records)
    # an executable ran (strict/debug) rather than being recorded (fused): its first run compiled it
    hit = None
    if not records and compiled.jitted is not None:
        hit = compiled.ran_eagerly
        if hit:
            telemetry.counters["op_cache_hits"] += 1
        else:
            compiled.ran_eagerly = True
            compile_events.note_compile("op", key, None, compile_events.op_cause(key),
                                        time.perf_counter() - (t0 if fresh else t_launch), disk=compiled.from_disk)
    if telemetry.recording():
        t0 = t_launch if not fresh else t0
        telemetry.emit("op", compiled.name, t=t0, dur=time.perf_counter() - t0, cache_hit=hit)
    result = _wrap(out, compiled.meta, device_index)
    if lazy.over_limit():
        lazy.sync(SyncReason.GRAPH_LIMIT)
    return result


def _compile(low: Lowering, targs, tkwargs, dyn, jit: bool) -> OpExecutable:
    op = low.op
    meta = _meta_outputs(op, targs, tkwargs, dyn) if jit else None
    sizes.check_outputs(meta)  # before XLA sees an absurd shape (it aborts the process)

    def run(*dyn_values):
        a = [_decode(t, dyn_values) for t in targs]
        k = {name: _decode(t, dyn_values) for name, t in tkwargs}
        if low.rng:
            k["key"] = jax.random.fold_in(jax.random.key(dyn_values[-2]), dyn_values[-1])
        return _cast(op, low.fn(*a, **k), meta)

    if op_checks.reporting(low.fn):
        run, statics = checks.instrument(run)
        return OpExecutable(run, jit, meta, op_name(op), statics)
    return OpExecutable(run, jit, meta, op_name(op))



def cache_size() -> int:
    return len(_OPS)


# ---- assignment: the one way a tpu tensor's values change ------------------------------------------------


@caches.memoize("programs", 2048)
def _assign_program(dst_base_shape, dst_view, dst_dtype, src_base_shape, src_view, overwrite_all: bool):
    jdt = dtypes.to_jax(dst_dtype)
    dst_size = dst_base_shape if dst_view is None else dst_view.size

    # inputs: [dst base, dst offset if it moves,] src base[, src offset if it moves] (see _assign_inputs)
    def whole(src_base, *src_offset):
        v = views.read(src_base, src_base_shape, src_view, *src_offset).astype(jdt)
        return jnp.broadcast_to(v, dst_size)

    def partial(dst_base, *rest):
        dst_offset, rest = (rest[:1], rest[1:]) if dst_view is not None and dst_view.moves else ((), rest)
        v = views.read(rest[0], src_base_shape, src_view, *rest[1:]).astype(jdt)
        return views.write(dst_base, dst_base_shape, dst_view, v, *dst_offset)

    # its output's metadata, so fused mode records it without tracing (checked when the graph is traced)
    meta = torch.empty(dst_size if overwrite_all else dst_base_shape, dtype=dst_dtype, device="meta")
    return OpExecutable(whole if overwrite_all else partial, True, meta, "aten::copy_")


def assign(dst: tensor.TpuTensor, src) -> None:
    """Overwrite ``dst``'s values (through its view, if any) with ``src`` (a tpu tensor or JAX array).

    ``src`` broadcasts to ``dst``'s shape and is cast to ``dst``'s dtype, as ``Tensor.copy_`` does.
    """
    storage = dst._tpu_storage
    dst_view = dst._tpu_view
    if tensor.on_tpu(src):
        src = tensor.adopt(src)
        src_storage, src_view = src._tpu_storage, src._tpu_view
        src_array, src_base_shape = src_storage.array, src_storage.shape
        if (
            dst_view is None
            and src_view is None
            and src_storage.shape == storage.shape
            and src_storage.dtype == storage.dtype
        ):
            _store(storage, src_array)  # arrays are immutable: sharing one is safe
            return
    else:
        src_array, src_base_shape, src_view = src, tuple(src.shape), None
    dyn = [] if dst_view is None else [storage.array]
    dst_key = _dynamic_input(storage.shape, dst_view, dyn)
    dyn.append(src_array)
    src_key = _dynamic_input(tuple(src_base_shape), src_view, dyn)
    sig = (storage.shape, dst_key, storage.dtype, tuple(src_base_shape), src_key, dst_view is None)
    program = _assign_program(*sig)
    _store(storage, launch(program, OpSignature("assign", sig + (_leaf_dtype(src_array),), ()), dyn, storage.device_index, True))


def _dynamic_input(base_shape: tuple, view, dyn: list):
    """The offset-free key of ``view`` (``None`` for a base), appending its offset to ``dyn`` if it moves."""
    if view is None:
        return None
    key, offset = views.dynamic(base_shape, view)
    if offset is not None:
        dyn.append(offset)
    return key


def _store(storage, array) -> None:
    """Give ``storage`` a new array (or placeholder, which the next sync must then materialize)."""
    if isinstance(array, lazy.LazyValue):
        lazy.track(storage)  # tracked first: an interrupt between the two lines leaves nothing untracked
    storage.array = array


def _leaf_dtype(v) -> str:
    return str(v.dtype)


def value(t: tensor.TpuTensor, reason: SyncReason = SyncReason.READ, record: bool = True):
    """The concrete JAX array of ``t``'s values (a sync point if ``t`` is pending; a view is gathered)."""
    t = tensor.adopt(t)
    storage = t._tpu_storage
    if isinstance(storage._array, lazy.LazyValue):
        lazy.track(storage)  # normally tracked already; a no-op then
        lazy.sync(reason, record=record)
    checks.raise_pending()  # a host read waits for the device anyway: errors its inputs reported surface here
    if t._tpu_view is None:
        return storage.array
    dyn = [storage.array]
    key = _dynamic_input(storage.shape, t._tpu_view, dyn)
    program = _read_program(storage.shape, key, storage.dtype)
    return _run(program, OpSignature("read", (storage.shape, key, storage.dtype), ()), dyn, storage.device_index,
                True)


@caches.memoize("view_reads", 2048)
def _read_program(base_shape, view, dtype):
    """Gather a view (offset-free key ``view``; its offset, if it moves, is the second input). Its output's
    metadata lets fused mode record it without tracing."""
    meta = torch.empty(base_shape if view is None else view.size, dtype=dtype, device="meta")
    return OpExecutable(lambda base, *offset: views.read(base, base_shape, view, *offset), True, meta,
                        "materialize view")


def materialize(t: tensor.TpuTensor) -> tensor.TpuTensor:
    """A new base tensor holding ``t``'s values (recorded, not run, in fused mode)."""
    t = tensor.adopt(t)
    storage = t._tpu_storage
    dyn = [storage.array]
    key = _dynamic_input(storage.shape, t._tpu_view, dyn)
    program = _read_program(storage.shape, key, storage.dtype)
    out = launch(program, OpSignature("read", (storage.shape, key, storage.dtype), ()), dyn,
                 storage.device_index, True)
    result = tensor.from_array(out, t.dtype, storage.device_index)
    if isinstance(out, lazy.LazyValue):
        lazy.track(result._tpu_storage)
    return result
