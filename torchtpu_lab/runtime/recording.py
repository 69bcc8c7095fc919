"""The native core's recording kernel, seen from Python: what it is given, which ops it serves, what it learns.

In-place ops whose functional op it records (``p.add_(g, alpha=-lr)``, ``mul_``, ``addcmul_``: an
optimizer's update) are recorded as that functional op's node, and the result becomes ``self``'s storage's array
through :func:`.values.set_array` (the one Python call on that path: memory accounting), when ``self`` is a base
tensor of the result's shape and dtype; the functional op's Python path inside the in-place kernel teaches it.

View ops (``view``, ``t``, ``transpose``, ``expand``, ``detach``, ...; one output) are served the same way in
fused and strict mode (debug mode stays Python): the output tensor over the input's storage, with the geometry the Python view kernel computed for
the same input geometry and arguments (:func:`learn_view`).

In fused mode most ops are calls seen before: the same op on base tensors of the same shapes and dtypes with
the same other arguments. The native core (``csrc/recorder.cpp``) records those into :data:`.fused.PENDING`
itself — the same ``Node``, ``LazyValue``, ``Storage`` and tensor objects :func:`.executor._record_single`
makes, the graph-key segment, cut points and storage tracking updated the same way — without entering Python:
PyTorch's dispatch into a Python kernel alone costs more than PyTorch's whole CPU ``add`` (docs/perf.md).
An op with checks (``embedding``, ``nll_loss``, ``index_copy_``: an index bound) is recorded the same way, its
error flags as further outputs of its node and a :func:`.pending_errors.callback` in the pending work's extra
values, as :func:`.executor._launch` records it; its node carries the user's line whether or not sources are
tracked, since a bad index's error names it.

An append into spare capacity (:mod:`.growth`: ``torch.cat([x, piece], d)`` where ``x`` is the front of a padded
storage and the piece fits) is keyed without its length ``n``: the grown storage's shape, ``d`` and the piece's
own key. :func:`.growth._append`'s first such append teaches it (:func:`learn_append`) and the kernel records the
next ones, at every length, as the same append node with ``n`` an input taken from the call; the result is the
front of a new padded storage, which :func:`.growth.appended` marks as grown in ``x``'s lineage (and, while a
profile records, gives the op event the Python path emits). An append that does not fit and a first append take
the Python path. Attention over padded keys (:mod:`.padded_attention`: keys and values the fronts of storages
grown along the sequence, and no mask or one grown with them, as a left-padded batch's) is keyed the same way,
without the keys' length, and taught by its first such call (:func:`learn_padded_attention`): a decode step's
attention is recorded in C++ at every length. Attention on whole buffers (a static cache's keys and values) is
keyed as any other call and taught by :func:`learn`, under the call's own signature (its program is shared).

In strict mode a repeated call (the same key) of an op without checks runs its cached executable from C++
(:func:`learn_strict`, taught from :func:`.executor._run_repeated`'s branch): JAX's C++ call of the compiled
executable on the arguments' arrays, the output array in a ``Storage`` (``memory.acquire``, as
``Storage.output``) and a tensor, ``op_cache_hits`` counted; under a recording profile, its op record (a cache
hit, with the user's line and stack) and entry span, as the Python path notes them. Pending fused work, another
device than the executable's, a ``TypeError`` from the executable (a weak type: ``jax.jit`` decides), a pending
interrupt or another thread in the runtime take the Python path, which is unchanged.

Everything else reaches the op's Python kernel, unchanged: the first call of a signature, debug
mode, a recording profile, allocation sources on, a pending interrupt, another thread inside the runtime, and
``config.native_recording`` off (the switch for comparing the two paths).
When the Python path records a call the C++ kernel keyed and did not know (:func:`learn`, from the executor),
the kernel files the executable under that key, with where each of the executable's dynamic inputs comes from
(an argument's array or number, or a constant the Python path made for a wrapped scalar, keyed by its value).
A wrapped scalar (``x * 0.5``) reaches a Python kernel as the number, so it is a dynamic input taken from the
call; a view's offset is keyed exactly and taken as a constant. The table is cleared with every other cache (:func:`torchtpu_lab.caches.clear_all`).

Without the core (pure-Python mode) nothing here is active and every op takes the Python path.
"""

from __future__ import annotations

import functools
import threading
from types import ModuleType

import torch

from .. import caches, config, interrupts, telemetry
from ..device import memory, views
from ..device.storage import Storage
from ..device.tensor import TpuTensor, adopt, use_native_wrap
from . import encode, fused, graph_key, pending_errors

_core: list = [None]  # the native core, once configured
#: ``core.lesson_pending`` (``None`` without the core): whether the call being run can teach the kernel
lesson_pending = None


def available(core) -> bool:
    """Whether this build of the core has the recording kernel."""
    return core is not None and hasattr(core, "install_recording_kernels")


def configure(core, set_array, growth: ModuleType, bounded: ModuleType, from_host) -> None:
    """Give the core the objects its recorded path reads and writes (once, before :func:`install`);
    ``set_array``: :func:`.values.set_array`, an in-place op's write; ``growth``: the :mod:`.growth` module, whose
    table of grown storages and ``appended`` an append recorded in C++ uses, and its lengths and ``mark_grown``,
    which the rewrites of :mod:`.bounded` made in C++ use with that module's flags; ``from_host``:
    :func:`.core_kernels.from_host`, a host copy the kernel of ``_to_copy`` makes without the Python kernel's
    frames (all passed in: ``values`` imports the executor, and ``growth``, ``bounded`` and ``core_kernels``
    import this module through it)."""
    global lesson_pending
    from jax._src.array import ArrayImpl

    core.configure_recorder({
        "enabled": config.native_recording,
        "eager_mode": config.eager_mode,
        "track_sources": config.track_sources,
        "track_allocation_sources": memory.TRACK_SOURCES,
        "max_graph_ops": config.max_graph_ops,
        "recorders": telemetry.recorders,
        "entry_spans": interrupts.entry_spans,
        "after_entry": interrupts.after_entry,
        "interrupt_pending": interrupts._pending,
        "lock": fused.LOCK,
        "pending": fused.PENDING,
        "cuts": fused.CUTS,
        "flush": fused.flush_if_over_limit,
        "internal_files": telemetry._internal_files,
        "sources": telemetry._sources,
        "backward": telemetry.BACKWARD,
        "op_sources": telemetry.op_sources,
        "adopt": adopt,
        "Parameter": torch.nn.Parameter,
        "set_array": set_array,
        "partial": functools.partial,
        "note_later": pending_errors.note_later,
        "acquire": memory.acquire,
        "release": memory.release,
        "counters": telemetry.counters,
        "main_thread": threading.main_thread().ident,
        "Node": fused.Node,
        "LazyValue": fused.LazyValue,
        "Storage": Storage,
        "TpuTensor": TpuTensor,
        "ArrayImpl": ArrayImpl,
        "View": views.View,
        "grown_ids": growth._GROWN_IDS,
        "appended": growth.appended,
        "mark_grown": growth.mark_grown,
        "bounded_active": bounded._ACTIVE,
        "bounded_native": bounded.NATIVE,
        "lengths": growth._LENGTHS,
        "recent_syncs": growth.RECENT_SYNCS,
        "min_capacity": growth.MIN_CAPACITY,
        "from_host": from_host,
    })
    _core[0] = core
    telemetry.OP_LOGS[:] = [core.OpLog]
    lesson_pending = core.lesson_pending
    graph_key.untrack = core.untrack
    fused.SNAPSHOT[0] = core.sync_targets
    fused._NATIVE_PLAN[0] = core
    use_native_wrap(core.wrap_arrays)
    graph_key.NATIVE_ADD[0] = core.segment_add
    caches.on_clear(core.clear_recorded)
    config.data_checks.before_change(lambda old, new: core.clear_recorded())  # entries are with/without checks


def recordable(op: torch._ops.OpOverload) -> bool:
    """Whether the recording kernel can serve ``op``: a functional op whose outputs are tensors (one, or several
    such as layer norm's output, mean and rstd), none of them an alias. (A foreach op's list of them:
    :func:`returns_list`.)"""
    schema = op._schema
    returns = schema.returns
    return (not schema.is_mutable and len(returns) >= 1
            and all(isinstance(r.type, torch.TensorType) and r.alias_info is None for r in returns))


def returns_list(op: torch._ops.OpOverload) -> bool:
    """Whether ``op`` returns one list of tensors (a functional foreach op's kernel is recorded so)."""
    returns = op._schema.returns
    return (not op._schema.is_mutable and len(returns) == 1 and returns[0].alias_info is None
            and isinstance(returns[0].type, torch.ListType)
            and isinstance(returns[0].type.getElementType(), torch.TensorType))


#: What a recording kernel serves (csrc/recorder.cpp ``Kind``): a lowered op it records, a view op, an in-place
#: op whose functional op it records and writes into ``self``, and a pointwise one, which also takes a ``self``
#: that is a whole storage without its leading size-1 dims (recorded on that storage); and a lowered pointwise op
#: runtime/bounded.py runs on padded extents, which it also records on fronts of padded storages, as that does
#: (``clone`` too, for the copy of an expanded front that it makes so, and ``index_select`` across a front's
#: grown dim: ``bounded.on_fronts``); a functional
#: foreach op (one node, a list of outputs) and an in-place one (that node, each output written into its element
#: of ``self``: :mod:`.foreach_kernels`).
RECORD, VIEW, INPLACE, INPLACE_POINTWISE, RECORD_ON_FRONTS, RECORD_LIST, INPLACE_LIST = 0, 1, 2, 3, 4, 5, 6


def install(core, kernels: dict) -> None:
    """Make the recording kernel the PrivateUse1 kernel of each op in ``kernels`` (op -> (its Python kernel,
    which the recording kernel calls for everything it does not serve itself; its kind; the op whose Python
    path teaches it: itself, or an in-place op's functional op; whether that op's lowering takes numbers as
    graph inputs))."""
    core.install_recording_kernels([(op._schema.name, op._schema.overload_name, fn, kind, teacher._schema.name,
                                     teacher._schema.overload_name, dynamic_numbers(op, teacher, dynamic))
                                    for op, (fn, kind, teacher, dynamic) in kernels.items()])


def dynamic_numbers(op: torch._ops.OpOverload, teacher: torch._ops.OpOverload, dynamic_scalars: bool) -> list[int]:
    """Per argument of ``op``, 1 where a number is a graph input of the teacher's executable (so the kernel keys
    it by type, as :mod:`.fast_keys` does, and takes its value from each call), else 0 (keyed by value)."""
    n = len(op._schema.arguments)
    if not dynamic_scalars:
        return [0] * n
    positions, names = encode.op_plan(teacher)[:2]
    formals = teacher._schema.arguments
    if len(formals) != n:  # an in-place op whose functional op's arguments differ: numbers keyed by value
        return [0] * n
    return [int(i in positions or (a.kwarg_only and a.name in names)) for i, a in enumerate(formals)]


def learn(op: torch._ops.OpOverload, compiled, dyn: list, args: tuple, kwargs: dict, positions: frozenset,
          names: frozenset, dynamic_scalars: bool, signature=None) -> None:
    """The Python path is recording a call (``compiled``'s short path) that the recording kernel keyed and did
    not know: teach it where each of ``dyn`` comes from. Arguments it cannot describe (a view, numbers inside a
    list that are graph inputs) teach nothing; the call keeps taking the Python path. ``signature``: the call's
    node key, where ``compiled`` is a program several signatures share (:mod:`.padded_attention`'s)."""
    sources = _sources(op, dyn, args, kwargs, positions, names, dynamic_scalars)
    if sources is not None:
        _core[0].learn(op._schema.name, op._schema.overload_name, compiled, dyn, sources, signature)


def learn_strict(op: torch._ops.OpOverload, compiled, dyn: list, args: tuple, kwargs: dict, positions: frozenset,
                 names: frozenset, dynamic_scalars: bool) -> None:
    """Strict mode's Python path is running a cache hit (``compiled``'s executable, one tensor output, no checks)
    that the recording kernel keyed and did not know: teach it the executable and where each of ``dyn`` comes
    from, so that the next such call runs the executable from C++. It calls what :func:`.executor.run_now` calls:
    the compiled executable's own C++ call (``Compiled._call``, once JAX has made it; else the ``Compiled``)."""
    if type(compiled.meta) is not torch.Tensor or compiled.layout is not None:
        return
    sources = _sources(op, dyn, args, kwargs, positions, names, dynamic_scalars)
    if sources is not None:
        exe = compiled.executable
        call = getattr(exe, "_call", None) or exe
        _core[0].learn_strict(op._schema.name, op._schema.overload_name, compiled, call, compiled.exec_device, dyn,
                              sources)


def _sources(op, dyn: list, args: tuple, kwargs: dict, positions: frozenset, names: frozenset,
             dynamic_scalars: bool) -> list | None:
    """Per dynamic input of a call, the argument position it comes from (``(position, element)`` for an element
    of a tensor list; -1: a constant its key fixes), or ``None`` where the arguments cannot be described so."""
    sources: list[int] = []
    index = _argument_index(op)
    for i, a in enumerate(args):
        if not _source(a, i, dynamic_scalars and i in positions, sources):
            return None
    for name, a in (kwargs or {}).items():
        if not _source(a, index[name], dynamic_scalars and name in names, sources):
            return None
    return sources if len(sources) == len(dyn) else None


#: a length-free call's length ``n``, an input the recording kernel takes from the call itself (csrc/recorder.cpp
#: kLength)
LENGTH = -2
#: the calls the recording kernel keys without their length (csrc/recorder.cpp ``Unsized``)
_APPEND, _PADDED_ATTENTION = 1, 2


def learn_append(compiled, key, dyn: list, first: bool = False) -> None:
    """:mod:`.growth` recorded an append into spare capacity (``compiled``, the append's program, recorded under
    ``key``; ``dyn``: the grown tensor's storage, the piece's, the piece's offset where it is a view at one (which
    the kernel's key fixes), the length ``n``) for a ``cat`` the recording kernel took for such an append and did
    not know: teach it, so that the next appends of this geometry at any length are recorded in C++ (each new
    length is a new ``n``, not a new key). ``first``: the first append, to an empty accumulator, into a new buffer
    (``dyn`` has no grown storage then, and ``n`` is 0): the next ones of this piece geometry (a ``DynamicCache``'s
    first keys at every call or training step) are recorded in C++ too."""
    core = _core[0]
    if core is not None:
        elements = [(0, 1)] if first else [(0, 0), (0, 1)]
        core.learn_unsized(_APPEND, compiled, key, dyn, elements + [-1] * (len(dyn) - len(elements) - 1) + [LENGTH])


def learn_padded_attention(compiled, key, dyn: list, query: TpuTensor, mask: TpuTensor | None) -> None:
    """:mod:`.padded_attention` recorded attention over padded keys and values (``compiled``, its program,
    recorded under ``key``; ``dyn``: the query's storage (and its offset where it is a view at one, which the
    kernel's key fixes), the keys' and the values' padded storages, their length ``n``, and the storage of the
    ``mask`` it read over the keys' capacity, if any) for a call the recording kernel took for one and did not
    know: teach it, so that the next such calls at any length are recorded in C++ (a decode step's attention,
    once per layer and token)."""
    core = _core[0]
    if core is not None:
        sources: list = []
        _tensor_source(query, 0, sources)
        sources += [1, 2, LENGTH]
        if mask is not None:
            _tensor_source(mask, 3, sources)
        core.learn_unsized(_PADDED_ATTENTION, compiled, key, dyn, sources)


def learn_view(op: torch._ops.OpOverload, storage, geometry) -> None:
    """A view op's Python kernel made its output (over ``storage``, of ``geometry``: a
    :class:`~torchtpu_lab.device.views.View`, or ``None`` for the whole base) for a call the recording kernel
    keyed: teach it the output's geometry, which its key (the input's geometry and the arguments) determines."""
    _core[0].learn_view(op._schema.name, op._schema.overload_name, *_answer(storage, geometry))


def learn_views(op: torch._ops.OpOverload, storage, geometries) -> None:
    """:func:`learn_view` for a view op with a list of outputs (``split``, ``unbind``): each one's geometry."""
    _core[0].learn_views(op._schema.name, op._schema.overload_name, [_answer(storage, g) for g in geometries])


def _answer(storage, geometry) -> tuple:
    """``(geometry, size, stride, offset, reported)`` of a view output over ``storage``: ``reported`` where its
    TensorImpl must report a stride or offset other than the contiguous ones."""
    if geometry is None:
        size = tuple(storage.shape)
        return geometry, size, views.contiguous_strides(size), 0, False
    size, stride, offset = geometry[:3]
    return geometry, size, stride, offset, bool(offset) or tuple(stride) != views.contiguous_strides(size)


_NUMBERS = (bool, int, float)


def _source(a, position: int, dynamic: bool, sources: list) -> bool:
    """Append where ``a``'s dynamic inputs come from, in the encoder's order (:class:`.encode.Encoder`)."""
    if type(a) is TpuTensor:
        _tensor_source(a, position, sources)
    elif isinstance(a, torch.Tensor):  # a 0-dim host tensor: the encoder made a device array of its value
        if a.device.type != "cpu":
            return False
        sources.append(-1)
    elif isinstance(a, (list, tuple)):
        if not any(isinstance(x, torch.Tensor) for x in a):
            if dynamic and all(type(x) in _NUMBERS for x in a):  # a number per element (a foreach op's Scalar[])
                sources.extend((position, j) for j in range(len(a)))
                return True
            return not (dynamic and any(type(x) in _NUMBERS for x in a))
        for j, x in enumerate(a):  # a tensor list (torch.cat's; indices, some absent): (position, element) per array
            if x is None:
                continue
            if type(x) is not TpuTensor:
                return False
            _tensor_source(x, (position, j), sources)
    elif dynamic and type(a) in _NUMBERS:
        sources.append(position)
    return True


def _tensor_source(t: TpuTensor, source, sources: list) -> None:
    """A tpu tensor's array comes from ``source``; a view at a moving offset adds that offset, an input of the
    executable that the kernel's key fixes (-1)."""
    sources.append(source)
    view = t.tpu_view
    if view is not None and views.dynamic(t.tpu_storage.shape, view)[1] is not None:
        sources.append(-1)


_INDEX: dict = {}


def _argument_index(op) -> dict:
    index = _INDEX.get(op)
    if index is None:
        index = _INDEX[op] = {a.name: i for i, a in enumerate(op._schema.arguments)}
    return index


def stats() -> dict:
    """Calls recorded by the kernel, calls it handed to Python (in all, and per op: ``python_ops``), entries
    learned (empty without the core)."""
    core = _core[0]
    return core.recorder_stats() if core is not None else {}
