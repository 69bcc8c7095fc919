"""Tensors that grow by appending keep one shape: ``torch.cat([x, new], dim)`` writes into spare capacity.

A token loop grows its sequence one step at a time — ``input_ids = torch.cat([input_ids, next_token], -1)`` in
``transformers``' ``generate``, an attention mask extended by a column of ones. With one storage per result,
every step's arrays have a new shape, so every step's fused graph is a new program and XLA compiles once per
token. Here such a tensor lives in a storage with room to grow (a :class:`~torchtpu_lab.device.views.View`
of the first ``n`` positions of a longer buffer along ``dim``): appending writes the new piece at position ``n``
— a ``dynamic_update_slice`` whose position is a graph *input* — into a new array of the same padded shape, and
the result views the first ``n + k`` positions. Reads of the last token (``input_ids[:, -1:]``) are views at a
moving offset, also graph inputs (:func:`~torchtpu_lab.device.views.dynamic`), so a decode step compiles once
for any number of tokens; only outgrowing the buffer (capacity doubles) compiles again.

With the native core, an append into spare capacity seen before — the same grown storage shape, dim and piece
geometry, at any length — is recorded by the recording kernel in C++ (runtime/recording.py; this module's
:func:`_append` teaches it and :func:`appended` keeps the marks below), so a decode token's appends run no Python.

Semantics are PyTorch's: the result is a new tensor with its own storage (arrays are immutable; the input's
storage is only read), equal to the concatenation. Padding starts at the first append — a smaller piece after a
whole tensor, or any piece after an empty accumulator (``torch.cat([torch.tensor([]), piece])``, how a
``DynamicCache`` starts each layer's keys), so a prompt's keys already sit in their capacity bucket and the
first decode step is the same program as the rest; a concatenation of equal parts is not an append. The padding
is bounded: capacity doubles from at least :data:`MIN_CAPACITY` positions (tensors with small rows — token ids,
masks — get as many as fit in :data:`FREE_BYTES`, so they do not change bucket one step apart from the KV cache
they run beside), and a storage over :data:`MAX_PADDED_BYTES` is not padded at all.

A grown tensor's consumers read its first ``n`` positions — a view, whose shape changes every step — unless
they can take the padding: attention over a padded KV cache reads the whole storage with ``n`` as a graph input
(:func:`padded_length`, runtime/padded_attention.py), and most ops on a grown tensor — pointwise ops,
reductions, softmax, products, gathers, indexing, an ``arange`` of a grown length — run on the padded extent and
give the front of a padded result again (:func:`front`, :func:`grown`, runtime/bounded.py): the mask
``transformers`` rebuilds from a left-padded batch's grown ``[batch, n]`` mask every step, eager attention and a
repetition penalty are built that way, so a decode step is one program per capacity bucket.
"""

from __future__ import annotations

import functools
import itertools
import math
import weakref
from typing import NamedTuple

import jax.numpy as jnp
import torch
from jax import lax

from .. import caches, dtypes, telemetry
from ..device import tensor, views
from ..device.storage import Storage
from ..ops import LOWERINGS
from . import fused, layouts, recording
from .encode import dynamic_input, leaf_dtype
from .executor import OpExecutable, execute, launch
from .signatures import OpSignature

aten = torch.ops.aten

#: The largest padded storage an appended-to tensor gets (bytes); beyond it, ``cat`` makes a plain new tensor.
MAX_PADDED_BYTES = 1 << 20
#: Capacity along the growing dim is at least this (then doubles), so a short generation never re-pads.
MIN_CAPACITY = 64
#: A buffer this small costs nothing worth saving: a tensor with small rows (token ids, an attention mask) gets
#: as many positions as fit in it, so it outgrows nothing in a generation and never moves a program to a new
#: bucket one step apart from the KV cache's.
FREE_BYTES = 16 << 10

#: ``id(storage) -> (dim, weak reference, lineage)`` for each storage grown along ``dim``: by an append, or as an
#: op's padded result (:func:`grown`). ``lineage`` is the sequence an append's storage belongs to (an id shared by
#: every append of one growing tensor: the ``lineage`` of the op events a profile reads, profiling/generation.py;
#: ``None`` for a padded result). Keyed by ``id``, read without making a weak reference (:func:`front` runs for
#: every tensor argument of an op while anything is grown); the weak reference's callback drops the entry when the
#: storage dies.
_GROWN_IDS: dict = {}
_LINEAGES = itertools.count()
#: length -> (capacity, weak reference to the storage, syncs so far): the largest live storage an append grew to
#: that length, and when
_LENGTHS: dict = {}
#: how many syncs (a decode step makes one or two) an append's length stays "growing" for factories
RECENT_SYNCS = 4
#: the name of an append's op event
APPEND = "aten::cat (append)"


def cat(tensors, dim: int = 0):
    """``aten::cat``: an append into spare capacity where :func:`_appendable` allows, else the lowering."""
    plan = _appendable(tensors, dim)
    if plan is None:
        return execute(LOWERINGS[aten.cat.default], (tensors, dim), {})
    return _append(*plan)


#: ``cat`` is the recording kernel's Python kernel for ``aten::cat`` (backend/dispatch.py): a call the executor
#: records (not an append) teaches that kernel, which then records the same call in C++ (a tensor list argument:
#: csrc/recorder.cpp); appends always come here
cat.lowering = LOWERINGS[aten.cat.default]


def _appendable(tensors, dim: int):
    """``(x, piece, d, padded)`` when ``cat`` is an append along ``d``: of a piece to a tensor already grown
    along ``d`` (``padded``: ``x`` is the front of its padded storage, :func:`padded_length`), of a smaller piece
    to a whole tensor (a first append), or of a piece to an empty accumulator (``x`` is ``None`` then:
    ``torch.cat([torch.tensor([]), piece])``, as a ``DynamicCache`` starts); else ``None``. The recording kernel's
    ``as_append`` (csrc/recorder.cpp) asks the same of a call, for the appends into spare capacity it records."""
    if not isinstance(tensors, (list, tuple)) or len(tensors) != 2:
        return None
    x, piece = tensors
    if not (tensor.on_tpu(x) and tensor.on_tpu(piece)) or x.dtype != piece.dtype or piece.ndim == 0:
        return None
    x, piece = tensor.adopt(x), tensor.adopt(piece)
    if x.tpu_storage.device_index != piece.tpu_storage.device_index:
        return None
    xs, ps = tuple(x.shape), tuple(piece.shape)  # each a torch.Size made by PyTorch: read once
    d = dim % len(ps)
    if x.numel() == 0 and (len(xs) == 1 or xs == ps[:d] + (0,) + ps[d + 1:]):
        return (None, piece, d, False) if piece.numel() else None
    if len(ps) != len(xs) or xs[:d] != ps[:d] or xs[d + 1:] != ps[d + 1:] or ps[d] == 0:
        return None
    padded = _padded_length(x, d) is not None
    if not padded and ps[d] >= xs[d]:
        return None  # two halves, not an append
    return x, piece, d, padded


def padded_length(t, dim: int) -> int | None:
    """``n`` when ``t`` is the first ``n`` positions along ``dim`` of a storage grown by appends along ``dim``
    (the rest of the storage is padding that appends have not filled), else ``None``.

    A consumer that can mask the padding (runtime/padded_attention.py) reads the whole storage with ``n`` as a
    graph input instead of ``t`` itself, whose shape changes with every append."""
    if not tensor.on_tpu(t) or t.ndim == 0:
        return None
    return _padded_length(tensor.adopt(t), dim % t.ndim)


def _padded_length(t: tensor.TpuTensor, d: int) -> int | None:
    """:func:`padded_length` of an adopted tpu tensor along its (non-negative) dim ``d``."""
    storage = t.tpu_storage
    known = _GROWN_IDS.get(id(storage))
    if known is None or known[0] != d:
        return None
    view = t.tpu_view
    if view is None:
        return storage.shape[d]
    base = storage.shape  # a view of the first n positions of the padded storage, and nothing else
    if len(view.size) != len(base) or view.offset != 0 or view.cast is not None or view.stride != _strides(base):
        return None
    if any(a != b for i, (a, b) in enumerate(zip(view.size, base)) if i != d):
        return None
    return view.size[d]


def grown_storages() -> bool:
    """Whether any live storage is grown (else no tensor is a :func:`front`, and nothing need be asked)."""
    return bool(_GROWN_IDS)


def grown_dim(storage: Storage) -> int | None:
    """The dim ``storage`` grows along (an append's result or a padded op result), else ``None``."""
    known = _GROWN_IDS.get(id(storage))
    return None if known is None else known[0]


class Front(NamedTuple):
    """A tensor that is the front of a padded storage (:func:`front`): ``dim`` (of the tensor) holds its ``length``
    logical positions of the storage's ``capacity``; ``whole`` is the same geometry with ``capacity`` there."""

    dim: int
    length: int
    capacity: int
    whole: views.View


def front(t) -> Front | None:
    """Where ``t`` reads the first ``n`` positions along a storage's grown dim with one of its own dims, and the
    same geometry with the storage's whole capacity there stays inside the storage: a grown tensor, or any view of
    it that keeps the grown positions together (``x[None, :]``, ``expand``, a transpose, a reshape of the other
    dims, a row ``x[1]``, the windows of an ``unfold`` along the grown dim and views of them) — else ``None``; the
    ``capacity`` of a front that starts a few positions in (``x[:, 1:]``, ``windows[..., -1]``) is the storage's
    less that start. Ops on such a tensor can run on the ``whole`` padded extent instead
    (runtime/bounded.py), so nothing they compile has ``n`` in a shape: the positions past ``n`` are read, as
    padding, and nothing logical is computed from them."""
    if not tensor.on_tpu(t):
        return None
    t = tensor.adopt(t)
    view = t.tpu_view
    if view is None or view.cast is not None:  # a base tensor is never a front: its padding, if any, is part of it
        return None
    storage = t.tpu_storage
    known = _GROWN_IDS.get(id(storage))
    if known is None:
        return None
    g = known[0]
    base = storage.shape
    capacity, step = base[g], _strides(base)[g]
    found = _grown_axis(view, step, capacity)
    if found is None:
        return None
    size = list(view.size)
    size[found] = _room(view, found, step, capacity, math.prod(base))
    if size[found] <= view.size[found]:
        return None
    # a size-1 dim's stride addresses nothing, but a view op derives it from the length (unsqueeze): the whole
    # extent's gets one that does not, so the ops reading it have the same key for every length
    canonical = _strides(tuple(size))
    stride = tuple(c if n == 1 else s for n, s, c in zip(size, view.stride, canonical))
    return Front(found, view.size[found], size[found], views.View(tuple(size), stride, view.offset))


def _grown_axis(view: views.View, step: int, capacity: int) -> int | None:
    """The dim of ``view`` that walks the storage's grown positions, or ``None``. Two dims may walk them: an
    ``unfold`` along the grown dim (a window dim, its last, over the windows dim: ``transformers``' n-gram ban
    unfolds the grown token ids every token); the windows dim, the longer one, is the grown one (equal sizes:
    ``None``, the ordinary path)."""
    walking = [i for i, (n, s) in enumerate(zip(view.size, view.stride)) if s == step and 1 < n < capacity]
    if not walking or len(walking) > 2 or 0 in view.size:
        return None
    if len(walking) == 1:
        return walking[0]
    a, b = walking
    if view.size[a] == view.size[b]:
        return None
    return a if view.size[a] > view.size[b] else b


def _room(view: views.View, found: int, step: int, capacity: int, total: int) -> int:
    """How many positions dim ``found`` of ``view`` can take inside the storage: the capacity, or fewer for a view
    that starts past the grown dim's first position or whose other dims walk it too (a window ``unfold`` made,
    ``windows[..., -1]``): the capacity less that start, the same for every length as long as the start is
    nearer the front than the view is long (a view of the *last* positions, ``x[:, n - k:]``, would move with the
    length: 0, the ordinary path)."""
    rest = view.offset + sum((n - 1) * s for i, (n, s) in enumerate(zip(view.size, view.stride)) if i != found)
    room = min(capacity, (total - 1 - rest) // step + 1)
    if room < capacity and (view.offset // step) % capacity >= view.size[found]:
        return 0
    return room


def grown(t, dim: int, length: int, source: Storage | None = None):
    """A view of the first ``length`` positions along ``dim`` of ``t`` (a base tensor: an op's output computed on
    padded extents), its storage marked as grown along ``dim``: the result of an op run by runtime/bounded.py
    (``source``: the storage of a front it reorders, whose sequence it continues, :func:`_lineage_of`)."""
    t = tensor.adopt(t)
    storage, view = t.tpu_storage, t.tpu_view
    order = layouts.whole_order(storage.shape, view)  # a result laid out as CPU lays it out: marked in its order
    if (view is not None and order is None) or not length < t.shape[dim]:
        raise ValueError(f"not a padded result: {tuple(t.shape)} for {length} positions along dim {dim}")
    size = list(t.shape)
    size[dim] = length
    _mark(storage, dim if order is None else order.index(dim), _lineage_of(source))
    return tensor.make(storage, views.View(tuple(size), _strides(storage.shape) if view is None else view.stride, 0))


def _lineage_of(source: Storage | None) -> int | None:
    """The sequence ``source`` belongs to, for a result that continues it: beam search reorders each layer's cache
    by beam (``index_select``) and appends to the result, so without it every token would start a new sequence
    and a profile of the loop would find no token stream (profiling/generation.py)."""
    known = None if source is None else _GROWN_IDS.get(id(source))
    return None if known is None else known[2]


def _mark(storage: Storage, dim: int, lineage: int | None = None) -> weakref.ref:
    """Record ``storage`` as grown along ``dim`` (in ``lineage``: an append's); the entry leaves when the storage
    dies. Returns the entry's weak reference to ``storage``."""
    key = id(storage)
    ref = weakref.ref(storage, lambda _, key=key: _GROWN_IDS.pop(key, None))
    _GROWN_IDS[key] = (dim, ref, lineage)
    return ref


def recent_capacity(length: int) -> int | None:
    """The capacity of a live tensor an append grew to ``length`` positions within the last :data:`RECENT_SYNCS`
    syncs (``None``: none did): a factory asked for that many positions (``torch.arange(n)`` of the length, as
    ``transformers`` builds its masks) gets the same padded extent (runtime/bounded.py). A sequence that stopped
    growing — a generated output kept while a training loop runs — or a dead one leaves factories ordinary."""
    known = _LENGTHS.get(length)
    if known is None or known[1]() is None:
        return None
    return known[0] if 0 <= telemetry.counters["syncs"] - known[2] <= RECENT_SYNCS else None


def recent_extent(length: int) -> int | None:
    """The positions a factory of a growing ``length`` is made with (``torch.arange(n)``, ``torch.ones(batch,
    n)``): the length's :func:`extent` within the :func:`recent_capacity`, or ``None`` where no live tensor grew
    to ``length`` recently (the core's ``as_arange_front`` computes the same)."""
    capacity = recent_capacity(length)
    return None if capacity is None else extent(length, capacity)


def growing_prefix(storage: Storage, view: views.View) -> bool:
    """Mark ``storage`` as grown along ``d`` when ``view`` (a slice's result) reads its first ``n`` positions along
    ``d`` and nothing else is cut, and ``n`` grows: the last such slice of a storage of this shape and dtype along
    ``d``, within the last :data:`RECENT_SYNCS` syncs, read fewer positions of other contents (another storage,
    or this one written since), or as many of a storage it marked (one step's several reads).

    ``True`` when the caller must not teach the recording kernel this slice: a length not read just before, or
    one it marked. Served in C++, the next step's storage sliced to that length would not come here, and not be
    marked; a slice repeated at one length (a model's ``position_ids[:, :n]`` for inputs of one length) is taught.

    Beam search keeps its sequences in a buffer of the final length and hands the logits processors
    ``running_sequences[:, :, :cur_len]`` flattened, a new buffer every step (a gather by beam): nothing is
    appended, so without the mark every op on the ids (an n-gram ban's windows) compiles once per token. Marking is
    safe for any storage: a front's logical positions are computed from the same inputs either way; it only
    decides that ops on the prefix run on the whole extent."""
    if id(storage) in _GROWN_IDS or not 0 < storage.nbytes <= MAX_PADDED_BYTES:
        return False
    base = storage.shape
    if view.offset != 0 or view.cast is not None or len(view.size) != len(base) or view.stride != _strides(base):
        return False
    cut = [i for i, (n, m) in enumerate(zip(view.size, base)) if n != m]
    if len(cut) != 1 or view.size[cut[0]] < 2:
        return False
    d, n = cut[0], view.size[cut[0]]
    key, syncs, written = (base, storage.dtype, d), telemetry.counters["syncs"], (id(storage), id(storage._array))
    last = _PREFIXES.get(key)
    # a longer prefix of new contents (another storage, or this one written since): a model's constant buffer
    # sliced to a longer input (``position_ids[:, :n]``) is not a growing sequence
    grows = last is not None and syncs - last[2] <= RECENT_SYNCS and (
        (last[0] < n and last[3] != written) or last[:2] == (n, True))
    if len(_PREFIXES) > 256:
        _PREFIXES.clear()
    _PREFIXES[key] = (n, grows, syncs, written)
    if grows:  # a growing length: factories of it (BART's decoder mask, ``ones(batch, n)``) are padded alike
        _note_length(n, base[d], _mark(storage, d))
    return grows or last is None or last[0] != n


#: ``(storage shape, dtype, dim) -> (length, marked, syncs, (id of the storage, id of its array))``: the last slice
#: of a storage's first positions along ``dim`` (:func:`growing_prefix`)
_PREFIXES: dict = {}


@functools.lru_cache(maxsize=256)
def _strides(shape: tuple) -> tuple:
    """A padded storage's contiguous strides (a handful of shapes per generation, looked up every step)."""
    return views.contiguous_strides(shape)


def extent(length: int, capacity: int) -> int:
    """How many positions a computation built from a grown length runs on: the length's own bucket (the power of
    two above it, at least :data:`MIN_CAPACITY`), within ``capacity``. A tensor with small rows is padded far past its
    length (:data:`FREE_BYTES`: token ids get a thousand positions); what is *computed* from it — embeddings of
    the ids, positions, a model's whole forward over them — must not be, or a loop that runs a forward over the
    whole sequence every token (nanoGPT's; ``use_cache=False``) would compute ~20x its work."""
    return min(capacity, max(MIN_CAPACITY, 1 << length.bit_length()))


def _capacity(n: int, row_bytes: int) -> int:
    """Positions for ``n`` (a power of two, at least twice ``n`` rounded down): buckets double."""
    free = 1 << max((FREE_BYTES // max(row_bytes, 1)).bit_length() - 1, 0)
    return max(MIN_CAPACITY, free, 1 << max(2 * n - 1, 1).bit_length())


def _append(x: tensor.TpuTensor | None, piece: tensor.TpuTensor, d: int, padded: bool):
    n, k = (0 if x is None else x.shape[d]), piece.shape[d]
    storage = None if x is None else x.tpu_storage
    dyn: list = []
    x_base = x_key = None
    if not padded or n + k > storage.shape[d]:
        # not padded yet, or out of room: a new buffer, once per doubling
        shape = list(piece.shape)
        shape[d] = _capacity(n + k, math.prod(shape) // max(k, 1) * piece.dtype.itemsize)
        if math.prod(shape) * piece.dtype.itemsize > MAX_PADDED_BYTES:
            return execute(LOWERINGS[aten.cat.default], ([piece] if x is None else [x, piece], d), {})
        grow = True
        if x is not None:
            dyn.append(storage.array)
            x_base = tuple(storage.shape)
            x_key = dynamic_input(storage.shape, x.tpu_view, dyn)
    else:
        shape = list(storage.shape)
        grow = False
        dyn.append(storage.array)
        x_base = tuple(storage.shape)
    shape = tuple(shape)
    p_storage = piece.tpu_storage
    dyn.append(p_storage.array)
    p_key = dynamic_input(p_storage.shape, piece.tpu_view, dyn)
    dyn.append(n)
    sig = (x_base, x_key, grow, shape, piece.dtype, d, tuple(p_storage.shape), p_key)
    program = _program(*sig)
    key = OpSignature("append", sig + (leaf_dtype(p_storage.array),), ())
    out = launch(program, key, dyn, p_storage.device_index, True)
    # the storage holds the new array (or placeholder) from its first line, like any op's output (executor._wrap)
    new = Storage.output(shape, piece.dtype, p_storage.device_index, out)
    if type(out) is fused.LazyValue:
        fused.track_new(new)
        if not grow or x is None:  # the recording kernel records the next ones (into this capacity; first ones)
            recording.learn_append(program, key, dyn, first=x is None)
    size = list(shape)
    size[d] = n + k
    result = tensor.make(new, views.View(tuple(size), _strides(shape), 0))
    if _grew(new, storage, d, n + k, k):
        fused.flush_if_over_limit()
    return result


def appended(result, old: Storage, d: int, length: int, k: int, sources: tuple | None) -> bool:
    """What an append the recording kernel recorded (csrc/recorder.cpp: an append into spare capacity seen
    before, whose lesson :func:`_append` gave it) leaves to Python: ``result``'s storage marked as grown, in
    ``old``'s lineage, and while a profile records (``sources``: the op's line and stack, which C++ read) the op
    event :func:`_append` emits. Called with the runtime's lock held, so an interrupt waits. ``True``: a loop's
    iteration ended (:func:`_loop_step`), and the kernel asks :func:`.fused.flush_if_over_limit` to cut."""
    return _grew(result.tpu_storage, old, d, length, k, sources)


def mark_grown(result, dim: int, source: Storage | None = None) -> None:
    """What a pointwise op on fronts the recording kernel recorded (csrc/recorder.cpp ``as_pointwise_fronts``: the
    op on the padded extents, its result the front of the padded output, as runtime/bounded.py's rewrite gives it)
    leaves to Python: ``result``'s storage marked as grown along ``dim``, as :func:`grown` marks it. Called with the
    runtime's lock held, so an interrupt waits. ``source``: the storage of a front an ``index_select`` reordered
    (csrc/recorder.cpp ``as_first_front``), whose sequence the result continues. ``result`` is a tuple for an op
    with several outputs (a layer norm's output, mean and rstd), each grown along ``dim``."""
    lineage = _lineage_of(source)
    for r in result if type(result) is tuple else (result,):
        _mark(r.tpu_storage, dim, lineage)


def _note_length(length: int, capacity: int, ref: weakref.ref) -> None:
    """Note that a live storage (``ref``) of ``capacity`` positions grew to ``length`` now, for factories of that
    length (:func:`recent_capacity`)."""
    if len(_LENGTHS) > 64:
        for n in [n for n, (_, r, _) in _LENGTHS.items() if r() is None]:
            del _LENGTHS[n]
    known, syncs = _LENGTHS.get(length), telemetry.counters["syncs"]
    # the largest capacity among this length's recent appends; one from an earlier loop (a previous generate's
    # output, kept alive) gives way, or the next loop's factories of that length would stay ordinary
    if known is None or known[0] <= capacity or known[1]() is None or syncs - known[2] > RECENT_SYNCS:
        _LENGTHS[length] = (capacity, ref, syncs)


def _grew(new: Storage, old: Storage | None, d: int, length: int, k: int, sources: tuple | None = None) -> bool:
    """Mark ``new``, an append of ``k`` positions with ``length`` in all along ``d``, as grown (in ``old``'s
    lineage, or a new one), note the length for factories (:func:`recent_capacity`) and, while a profile records,
    emit the append's op event (at ``sources``, the op's line and stack, when the caller has them). ``True`` when
    the pending graph is to be cut after this append (:func:`_loop_step`)."""
    lineage = _lineage_of(old)
    if lineage is None:
        lineage = next(_LINEAGES)
    _note_length(length, new.shape[d], _mark(new, d, lineage))
    if telemetry.recording():
        source, stack = sources if sources is not None else (None, None)
        telemetry.emit("op", APPEND, source=source, stack=stack, dim=d, length=length, appended=k, lineage=lineage)
    return _loop_step(lineage)


#: ``lineage -> syncs`` when it was last appended to
_LAST_APPEND: dict = {}
#: ``[syncs, lineage]``: the first sequence appended to since the last sync
_FIRST_APPEND = [-1, None]
#: ``[lineage, syncs]``: the loop the last cut was made in, and the sync count that cut left
_LOOP = [None, -1]


def _loop_step(lineage: int) -> bool:
    """Whether a loop that appends without syncing should have its pending graph cut after this append, so that
    each of its iterations is a graph of its own (and, its shapes bounded, one program per bucket) instead of one
    graph of every iteration so far — compiled again for every number of iterations, at a cost that grows with
    it (nanoGPT's ``generate``, 20 tokens: one 656-op graph, 10.8 s). A sequence appended to twice since the last
    sync, and the first one appended to since then, marks the end of an iteration; the same sequence's next
    append ends the next one, until another sync comes between. A loop that syncs every iteration
    (``transformers``' ``generate`` reads its stop check) never appends twice between syncs: nothing changes. Only
    without gradients (generation, evaluation): a training step that accumulates a recurrent net's outputs with
    ``torch.cat`` keeps its one graph (its length the same every step, it compiles once)."""
    syncs = telemetry.counters["syncs"]
    if _LOOP[0] == lineage and _LOOP[1] == syncs:
        due = True
    else:
        due = _LAST_APPEND.get(lineage) == syncs and _FIRST_APPEND[1] == lineage and _FIRST_APPEND[0] == syncs
    if len(_LAST_APPEND) > 256:
        _LAST_APPEND.clear()
    _LAST_APPEND[lineage] = syncs
    if _FIRST_APPEND[0] != syncs:
        _FIRST_APPEND[:] = [syncs, lineage]
    # (strict mode: nothing is ever pending, nothing to cut; with gradients on, a training step's unrolled loop
    # stays one graph, compiled once for its length, as before)
    if not due or not fused.has_pending() or torch.is_grad_enabled():
        return False
    _LOOP[:] = [lineage, syncs + 1]
    fused.LOOP_CUT[0] = True
    return True


@caches.memoize("append_programs", 1024, code=True)
def _program(x_base: tuple, x_key, grow: bool, shape: tuple, dtype, d: int, p_base: tuple, p_key):
    """The padded array after an append; inputs: x's storage[, its offset], the piece's storage[, its offset],
    the position ``n`` (a value, so every step runs the same program)."""
    jdt = dtypes.to_jax(dtype)

    def run(*rest):
        if x_base is not None:
            x_array, rest = rest[0], rest[1:]
        if grow and x_key is not None and x_key.moves:
            x_offset, rest = rest[:1], rest[1:]
        else:
            x_offset = ()
        p_array, rest = rest[0], rest[1:]
        p_offset, n = (rest[:1], rest[1]) if p_key is not None and p_key.moves else ((), rest[0])
        value = views.read(p_array, p_base, p_key, *p_offset).astype(jdt)
        starts = [0] * len(shape)
        if x_base is None:  # appended to an empty accumulator
            base = jnp.zeros(shape, jdt)
        elif grow:
            old = views.read(x_array, x_base, x_key, *x_offset).astype(jdt)
            base = lax.dynamic_update_slice(jnp.zeros(shape, jdt), old, starts)
        else:
            base = x_array
        starts[d] = n
        return lax.dynamic_update_slice(base, value, starts)

    meta = torch.empty(shape, dtype=dtype, device="meta")
    return OpExecutable(run, True, meta, APPEND)


#: collected into ``backend.dispatch.KERNELS``
APPEND_KERNELS = {aten.cat.default: cat}
