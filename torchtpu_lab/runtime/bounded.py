"""Ops on a tensor that grows run on its padded extent: what is built from a grown length compiles once per bucket.

:mod:`.growth` keeps a tensor grown by ``torch.cat`` at the front of a padded storage (capacity doubling), and
attention reads a padded KV cache whole (:mod:`.padded_attention`). What a decode step *builds* from the length
still had it in its shapes: ``transformers`` rebuilds a left-padded batch's 4-d mask every token from the grown
``[batch, n]`` attention mask and ``torch.arange(n)`` — a cast, a masked ``sum``, a compare, ``&``, a gather,
``expand`` — so every token was a new program (3 per token, one of them the whole forward; tiny Llama, batch 2:
72 programs for 32 tokens, 40 s against 1.7 s for one prompt).

Here an op whose tensor inputs are such fronts (:func:`.growth.front`: the tensor, or a view of it that keeps its
grown positions together) is rewritten on the padded extents, with torch ops, and its result is the front of the
padded output (:func:`.growth.grown`), so the next op is rewritten too:

- **pointwise ops** (PyTorch's ``pointwise`` tag, same-device casts, ``full_like``/``ones_like``): run on the
  whole extents, aligned to the smallest capacity among them (a view: capacities only differ in how far past
  ``n`` they reach). Every logical position is computed from the same inputs as before; padding positions hold
  whatever the op makes of padding, and nothing reads them: a consumer not rewritten here reads the front view,
  as before.
- **reductions** (``sum``, ``mean``, ``amax``/``amin``, ``any``/``all``, over all dims or some): over the grown
  dim the padding is filled with the reduction's identity first (``arange(capacity) >= n``, ``n`` a graph input;
  a mean divides the sum by the logical count), so the result is exact; a reduction of other dims keeps the grown
  dim, a front again. Cumulative ops (``cumsum``, ``cumprod``, ``logcumsumexp``) never read past a position.
- **advanced indexing** (``x[i, j]`` with an index for every dim): padding positions of grown indices become
  ``0`` before the gather (padding must not raise an index error that PyTorch would not); an index into a grown
  dim of ``x`` is wrapped by the *logical* length, as PyTorch does, and one out of that range is moved out of the
  padded range too, so the gather's own check raises ``IndexError`` (its message shows the moved value and the
  capacity: the logical length is a graph input, not part of a compiled message).
- **embedding** of grown indices (T5's relative position bias is looked up by buckets built from ``arange`` of
  the key length): padding indices read row ``0``, and the rows are grown like the indices.
- **gathers and scatters** along the dim their index grows along (``transformers``' repetition penalty gathers
  and scatters scores by the grown token ids): the index's padding is made ``0`` for a gather; for a scatter,
  each padding position repeats the first position's write (or adds ``0``).
- **padding** (``F.pad``): of other dims, the result is grown again; of the grown dim on the right to a fixed
  size (a grown mask padded to a static cache's length), the padding takes the pad value and the result is an
  ordinary tensor of that size.
- **products and softmax** (``mm``/``bmm``, so ``matmul``'s decomposition, and ``addmm``/``baddbmm`` with a bias
  grown alike or broadcast, as BLOOM adds ALiBi to its scores; ``softmax``/``log_softmax``): a grown
  row or column dim is a grown dim of the product; grown contraction dims of both operands are zeroed on both
  sides first (each padded term adds an exact ``0``); a softmax along the grown dim sees ``-inf`` there (exact
  zero weights). Eager attention over a grown KV cache is built from these.
- **factories**: ``torch.arange(n)`` where an append made a live tensor of ``n`` positions within the last few
  syncs (a growing length, not one a finished sequence happens to have) is an ``arange`` of that tensor's
  capacity, viewed to ``n`` — the length it is built from is a graph input nowhere, and the iota
  is the same program for every ``n`` in the bucket.

Scalars the rewrite introduces (``n``, capacities minus ``n``) are Python numbers, so they are graph inputs
(packed numbers), not constants. The inner ops are ordinary dispatches of static shapes, which the native
recording kernel learns and then serves without Python; the rewritten op itself is never taught to it (its key
has ``n`` in it; an ``arange(n)`` it learned before any tensor grew to ``n`` stays an ordinary one). A pointwise
op on fronts and an ``arange`` of a growing length need no lesson of their own: each rewrite is one inner call on
the whole extents, so in fused mode the recording kernel makes that call's key from the call it sees and records it
as the rewrite would, the result the front of the padded output (csrc/recorder.cpp ``as_pointwise_fronts``,
``as_arange_front``; a left-padded batch's mask is rebuilt each token with a cast, ``arange``, compares and ``&``).
A rewrite
that fails for any reason leaves the op to the ordinary path, which gives PyTorch's error if the call is wrong.
Anything else — ops across the grown dim with no padded form (``flip``, ``sort``), other indexing, mutation,
several outputs, operands grown along different dims or lengths, factories of a grown length other than
``arange`` (BART's ``torch.ones(batch, n)`` mask: a factory's result is contiguous) — takes the ordinary path:
correct, and compiled per length as before, with the compile cause naming the op and the dim.

**Copies** (``clone``, ``contiguous()``): a copy of a front *with* a broadcast dim (``reshape`` of an expanded KV
cache: grouped-query eager attention) is made on the padded extent and grown again. Without one, the copy is the
ordinary contiguous tensor of ``n`` positions PyTorch gives, remembered as a copy of its source: attention handed
it as a mask, unwritten, reads the grown source instead (T5's sdpa path makes its position-bias mask
``contiguous()``), so the copy, dead by the sync, never reaches a program.

A rewritten result has the padded storage's strides, as a grown tensor itself has, where PyTorch's would be
contiguous: a ``view`` that merges its grown dim with another moves the tensor to a contiguous copy of its own
first (:func:`compact`; with another view of it alive, PyTorch's error for such strides stands), ``reshape``
copies, and ``contiguous()`` gives an ordinary tensor of ``n`` positions.
"""

from __future__ import annotations

import math
import weakref

import torch

from .. import config
from ..device import tensor, views
from ..ops import LOWERINGS
from . import executor, growth, layouts

aten = torch.ops.aten

#: set while a rewrite runs its inner ops (they see whole extents, never fronts, and an ``arange`` of a capacity
#: must not be rewritten again)
_ACTIVE = [False]
#: whether the recording kernel makes the rewrites that are one inner call itself (a pointwise op on fronts, an
#: ``arange`` of a growing length: csrc/recorder.cpp); ``[False]`` leaves them to Python, as a benchmark compares
#: (``python bench/generate.py --bounded-ab``)
NATIVE = [True]
_MEAN, _LEAST, _MOST = object(), object(), object()
#: reductions and the value the padding is filled with when they reduce the grown dim
_IDENTITY = {aten.sum.default: 0, aten.sum.dim_IntList: 0, aten.mean.default: _MEAN, aten.mean.dim: _MEAN,
             aten.amax.default: _LEAST, aten.amin.default: _MOST, aten.any.default: False, aten.any.dim: False,
             aten.any.dims: False, aten.all.default: True, aten.all.dim: True, aten.all.dims: True}
_CUMULATIVE = {aten.cumsum.default, aten.cumprod.default, aten.logcumsumexp.default}
_SOFTMAXES = {aten._softmax.default, aten._log_softmax.default}
_PRODUCTS = {aten.mm.default, aten.bmm.default}
#: products that add a scaled bias
_BIASED = {aten.addmm.default, aten.baddbmm.default}
_SCATTERS = {aten.scatter.src, aten.scatter.value, aten.scatter_add.default}
#: op id -> its rewrite (or ``None``), decided once per op
_KINDS: dict = {}
#: id(a copy's storage) -> (weak ref to it, its array then, a tensor over its grown source, the source storage's
#: array then): copies of grown tensors that attention may read through (:func:`_copy`)
_COPIES: dict = {}


def run(low, args: tuple, kwargs: dict):
    """The result of ``low.op`` on ``args`` computed on padded extents, or ``None`` where this does not apply
    (the caller then runs the op as usual). Called by the executor only while some storage is grown."""
    if _ACTIVE[0]:
        return None
    op = low.op
    rewrite = _KINDS.get(id(op), _KINDS)
    if rewrite is _KINDS:
        rewrite = _KINDS[id(op)] = _kind(op)
    if rewrite is None:
        return None
    _ACTIVE[0] = True
    try:
        return rewrite(op, args, kwargs)
    except Exception:  # noqa: BLE001 — the ordinary path runs the op instead, and raises PyTorch's error if any
        return None
    finally:
        _ACTIVE[0] = False


def _kind(op):
    low = LOWERINGS.get(op)
    if low is not None and low.rng:  # random draws over padding would shift the logical positions' numbers
        return None
    if op in _REWRITES:
        return _REWRITES[op]
    schema = op._schema
    if torch.Tag.pointwise in op.tags and not schema.is_mutable and len(schema.returns) == 1 \
            and str(schema.returns[0].type) == "Tensor":
        return _pointwise
    return None


def pointwise(op) -> bool:
    """Whether ``op`` is rewritten as a pointwise op (:func:`_pointwise`): the recording kernel then also records
    it on fronts, as the rewrite runs it (csrc/recorder.cpp ``as_pointwise_fronts``)."""
    return _kind(op) is _pointwise


def on_fronts(op) -> bool:
    """Whether the recording kernel also records ``op`` on fronts as one inner call on the whole extents: the
    pointwise ops, ``clone``, whose copy of a front with a broadcast dim or of a batch of one :func:`_copy` makes
    so (csrc/recorder.cpp ``padded_copy``), ``index_select`` across another dim, as :func:`_select` makes it
    (``as_first_front``: beam search reorders every layer's cache by beam every token), and ``linear`` and
    ``native_layer_norm`` of a front grown along a leading dim, as :func:`_rowwise` makes them (a forward over a
    whole grown sequence)."""
    return op in _ON_FRONTS or pointwise(op)


def whole(t, f: growth.Front, capacity: int | None = None):
    """``t`` over its padded storage's whole extent (``f = growth.front(t)``), cut to ``capacity`` positions
    along the grown dim when given (a view either way; ``capacity`` is at least the length)."""
    view = f.whole
    if capacity is not None and capacity != f.capacity:
        size = list(view.size)
        size[f.dim] = capacity
        view = views.View(tuple(size), view.stride, view.offset)
    return tensor.make(tensor.adopt(t).tpu_storage, view)


def _padding(t, f: growth.Front):
    """A bool tensor, ``True`` at ``t``'s padding positions along its grown dim, shaped to broadcast against
    ``whole(t, f)``: ``arange(capacity) >= n``, ``n`` a graph input."""
    shape = [1] * t.ndim
    shape[f.dim] = f.capacity
    return (torch.arange(f.capacity, device=t.device) >= f.length).view(shape)


def _aligned(tensors: list, rank: int):
    """``(dim, length, capacity)`` of the output when every grown tensor among ``tensors`` (broadcast to
    ``rank`` dims) is grown along the same output dim to the same length and the others have size 1 there;
    ``None`` otherwise (or when none is grown)."""
    out = None
    for t, f in tensors:
        if f is None:
            continue
        d = rank - t.ndim + f.dim
        if out is None:
            out = [d, f.length, f.capacity]
        elif out[0] != d or out[1] != f.length:
            return None
        else:
            out[2] = min(out[2], f.capacity)
    if out is None:
        return None
    d = out[0]
    for t, f in tensors:
        if f is None:
            i = d - (rank - t.ndim)
            if i >= 0 and t.shape[i] != 1:
                return None
    return tuple(out)


def _tensors(values, found: list) -> bool:
    """Add ``(tensor, front)`` for each tpu tensor among ``values`` to ``found``; ``False`` when a list holds one
    (not covered)."""
    front, on_tpu = growth.front, tensor.on_tpu
    for v in values:
        if isinstance(v, torch.Tensor):
            found.append((v, front(v) if on_tpu(v) else None))
        elif isinstance(v, (list, tuple)) and any(isinstance(x, torch.Tensor) for x in v):
            return False
    return True


def _base(out):
    """``out`` as a base tensor, or all of its storage in another dim order (a result laid out as CPU lays it
    out: runtime/layouts.py); rewritten ops make new outputs, so a view is copied, which never happens for the ops
    covered, but a front must be all of its storage."""
    t = tensor.adopt(out)
    return out if layouts.whole_order(t.tpu_storage.shape, t.tpu_view) is not None or t.tpu_view is None \
        else out.clone()


def _pointwise(op, args: tuple, kwargs: dict):
    """A pointwise op (or cast, or ``full_like``) of grown tensors and others broadcast along the grown dim."""
    found: list = []
    if not _tensors(args, found) or (kwargs and not _tensors(kwargs.values(), found)):
        return None
    if not any(f for _, f in found):
        return None
    rank = max(t.ndim for t, _ in found)
    plan = _aligned(found, rank)
    if plan is None:
        return None
    d, n, capacity = plan
    swap = {id(t): whole(t, f, capacity) for t, f in found if f is not None}
    args = tuple(swap.get(id(a), a) for a in args)
    kwargs = {k: swap.get(id(v), v) for k, v in kwargs.items()}
    return growth.grown(_base(op(*args, **kwargs)), d, n)


def _reduce(op, args: tuple, kwargs: dict):
    """A reduction: over the grown dim, the padding is first filled with the reduction's identity (``0`` for a
    sum, ``-inf`` or the dtype's least value for a max, ...; a mean sums and divides by the logical count);
    over other dims only, the grown dim is a batch dim and the result is grown again."""
    x = args[0]
    f = growth.front(x)
    if f is None:
        return None
    rest = list(args[1:])
    dims = rest[0] if rest else kwargs.get("dim")
    keepdim = rest[1] if len(rest) > 1 else kwargs.get("keepdim", False)
    if isinstance(dims, int):
        dims = [dims]
    if dims and not all(-x.ndim <= int(i) < x.ndim for i in dims):
        return None  # PyTorch's error, from the ordinary path
    reduced = set(range(x.ndim)) if not dims else {int(i) % x.ndim for i in dims}
    w = whole(x, f)
    if f.dim not in reduced:
        d = f.dim if keepdim else f.dim - sum(1 for i in reduced if i < f.dim)
        return growth.grown(_base(op(w, *rest, **kwargs)), d, f.length)
    fill = _IDENTITY[op]
    if fill is _MEAN:
        dtype = kwargs.get("dtype")
        if not (dtype or x.dtype).is_floating_point:
            return None  # PyTorch's error, from the ordinary path
        total = aten.sum.dim_IntList(w.masked_fill(_padding(x, f), 0), sorted(reduced), bool(keepdim), dtype=dtype)
        return total / math.prod(x.shape[i] for i in reduced)
    if fill is _LEAST or fill is _MOST:
        info = torch.finfo(x.dtype) if x.dtype.is_floating_point else torch.iinfo(x.dtype)
        fill = (-math.inf if fill is _LEAST else math.inf) if x.dtype.is_floating_point else \
            (info.min if fill is _LEAST else info.max)
    return op(w.masked_fill(_padding(x, f), fill), *rest, **kwargs)


def _cumulative(op, args: tuple, kwargs: dict):
    """``cumsum``/``cumprod``/``logcumsumexp``: along the grown dim a logical position only reads positions
    before it, never the padding; along another dim the grown one is a batch dim. The result is grown again."""
    x = args[0]
    f = growth.front(x)
    dim = args[1] if len(args) > 1 else kwargs.get("dim")
    if f is None or not isinstance(dim, int) or not -x.ndim <= dim < x.ndim:
        return None
    return growth.grown(_base(op(whole(x, f), *args[1:], **kwargs)), f.dim, f.length)


def _softmax(op, args: tuple, kwargs: dict):
    """Along the grown dim: the padding is ``-inf`` first, so its weights are exact zeros; along another dim the
    grown one is a batch dim, as for a pointwise op."""
    x = args[0]
    f = growth.front(x)
    if f is None or kwargs or len(args) != 3:
        return None
    if not -x.ndim <= args[1] < x.ndim:
        return None
    w = whole(x, f)
    if args[1] % x.ndim == f.dim:
        w = w.masked_fill(_padding(x, f), float("-inf"))
    return growth.grown(_base(op(w, *args[1:])), f.dim, f.length)


def _product(op, args: tuple, kwargs: dict):
    """``mm``/``bmm``, and ``addmm``/``baddbmm`` (``beta * bias + alpha * a @ b``: BLOOM adds its ALiBi bias to the
    attention scores this way): a grown row dim of the first operand or column dim of the second is a grown dim
    of the product, and a bias grown along that dim to the same length, or of size 1 there, is read whole; grown
    contraction dims of both (attention's weights times its values) have their padding zeroed on both sides, so
    each padded term adds an exact ``0``, and the product is an ordinary tensor."""
    biased = op in _BIASED
    if len(args) != 2 + biased or (kwargs and not biased):
        return None
    bias, (a, b) = (args[0], args[1:]) if biased else (None, args)
    fa, fb = growth.front(a), growth.front(b)
    if fa is None and fb is None:
        return None
    batch = a.ndim - 2  # the row dim of a, the contraction dim of b
    if fa is not None and fb is not None:
        if fa.dim != batch + 1 or fb.dim != batch or fa.length != fb.length or growth.front(bias) is not None:
            return None
        capacity = min(fa.capacity, fb.capacity)
        a = whole(a, fa, capacity).masked_fill(_padding(a, fa._replace(capacity=capacity)), 0)
        b = whole(b, fb, capacity).masked_fill(_padding(b, fb._replace(capacity=capacity)), 0)
        return op(*(bias, a, b)[not biased:], **kwargs)
    if fa is not None and fa.dim == batch:
        d, grown, f = batch, a, fa
    elif fb is not None and fb.dim == batch + 1:
        d, grown, f = batch + 1, b, fb
    else:
        return None
    found = [(grown, f)] + ([(bias, growth.front(bias))] if biased else [])
    plan = _aligned(found, a.ndim)
    if plan is None or plan[0] != d:
        return None
    swap = {id(t): whole(t, g, plan[2]) for t, g in found if g is not None}
    operands = [swap.get(id(t), t) for t in (bias, a, b)[not biased:]]
    return growth.grown(_base(op(*operands, **kwargs)), d, f.length)


def _rowwise(op, args: tuple, kwargs: dict):
    """``linear`` and ``native_layer_norm``: each position along the dims before the trailing ones they contract or
    normalize is computed from that position alone, so a grown dim among those leading dims is a batch dim and
    every output (a layer norm's mean and rstd too) is grown along it again; weights and biases must not grow."""
    x = args[0]
    f = growth.front(x)
    if f is None or any(growth.front(a) is not None for a in (*args[1:], *kwargs.values())):
        return None
    trailing = 1 if op is aten.linear.default else len(args[1])
    if f.dim >= x.ndim - trailing:
        return None
    out = op(whole(x, f), *args[1:], **kwargs)
    if isinstance(out, tuple):
        return tuple(growth.grown(_base(o), f.dim, f.length) for o in out)
    return growth.grown(_base(out), f.dim, f.length)


def _alike(tensors, fronts: list):
    """``(whole extents, dim, length)`` when every one of ``tensors`` is a front (``fronts``, from
    :func:`.growth.front`) grown along the same dim of its own to the same length: each over the smallest
    capacity among them. ``None`` otherwise."""
    if any(f is None for f in fronts):
        return None
    d, n = fronts[0].dim, fronts[0].length
    if any(f.dim != d or f.length != n for f in fronts):
        return None
    capacity = min(f.capacity for f in fronts)
    return [whole(t, f, capacity) for t, f in zip(tensors, fronts)], d, n


def _concat(op, args: tuple, kwargs: dict):
    """``cat`` of fronts all grown along the same dim to the same length, along another dim (rotary embeddings
    join two halves along the head dim: ``cat((freqs, freqs), -1)``, ``rotate_half``): the whole extents joined,
    the result grown along that dim again; or of fixed pieces and then one front, along its grown dim (a prepend:
    ``torch.diff(position_ids, prepend=...)``, ``transformers``' packed-sequence check): the pieces and the whole
    extent, the result a front of their lengths. Appends (along the grown dim, after a front) are :mod:`.growth`'s."""
    tensors = args[0]
    dim = args[1] if len(args) > 1 else kwargs.get("dim", 0)
    if not isinstance(tensors, (list, tuple)) or len(tensors) < 2 or not isinstance(dim, int):
        return None
    fronts = [growth.front(t) for t in tensors]
    last = fronts[-1]
    rank = tensors[0].ndim
    if last is not None and last.dim == dim % rank and not any(fronts[:-1]) and \
            all(tensor.on_tpu(t) and t.ndim == rank for t in tensors):
        # a prepend (``torch.diff(x, prepend=...)`` along the grown dim): fixed pieces, then the whole extent
        ahead = sum(t.shape[last.dim] for t in tensors[:-1])
        out = op([*tensors[:-1], whole(tensors[-1], last)], dim)
        return growth.grown(_base(out), last.dim, ahead + last.length)
    alike = _alike(tensors, fronts)
    if alike is None or any(t.ndim != rank for t in tensors) or alike[1] == dim % rank:
        return None
    wholes, d, n = alike
    return growth.grown(_base(op(wholes, dim)), d, n)


def _pad(op, args: tuple, kwargs: dict):
    """``F.pad`` of a grown tensor: padding the other dims keeps it grown; padding the grown dim on the right to
    a fixed size (``transformers`` pads a grown mask to a static cache's length) fills the padding with the pad
    value and gives an ordinary tensor of that size, whatever ``n`` was."""
    x = args[0]
    f = growth.front(x)
    if f is None or kwargs or len(args) > 3:
        return None
    pad, value = list(args[1]), args[2] if len(args) > 2 else None
    at = 2 * (x.ndim - 1 - f.dim)
    left, right = (pad[at], pad[at + 1]) if at + 1 < len(pad) else (0, 0)
    if left != 0 or right < 0 or any(p < 0 for p in pad):
        return None
    rest = args[2:]
    if right == 0:
        return growth.grown(_base(op(whole(x, f), pad, *rest)), f.dim, f.length)
    size = f.length + right
    filled = whole(x, f).masked_fill(_padding(x, f), 0 if value is None else value)
    if f.capacity >= size:
        filled = filled.narrow(f.dim, 0, size)
        pad[at + 1] = 0
    else:
        pad[at + 1] = size - f.capacity
    return op(filled, pad, *rest)


def _grown_index(x, dim, index):
    """``(dim, front)`` when ``index`` is grown along the gathered/scattered ``dim`` of an ``x`` that is not grown
    (the token ids ``transformers``' repetition penalty gathers scores with), else ``None``."""
    if not tensor.on_tpu(index) or not isinstance(dim, int) or growth.front(x) is not None:
        return None
    f = growth.front(index)
    return None if f is None or f.dim != dim % index.ndim else (f.dim, f)


def _gather(op, args: tuple, kwargs: dict):
    """``gather`` along the dim its index grows along: padding positions of the index become ``0`` (a valid
    index, never an error PyTorch would not raise), and the result is grown like the index."""
    if kwargs or len(args) != 3:
        return None
    x, dim, index = args
    found = _grown_index(x, dim, index)
    if found is None:
        return None
    d, f = found
    index = whole(index, f).masked_fill(_padding(index, f), 0)
    return growth.grown(_base(op(x, dim, index)), d, f.length)


def _select(op, args: tuple, kwargs: dict):
    """``index_select`` along a dim other than the grown one (beam search reorders every layer's cache by beam,
    ``index_select(0, beam_idx)``, every token): the grown dim is a batch dim there, so the whole padded extent is
    selected and the result is grown like its input. Along the grown dim, or by a grown index: the ordinary
    path."""
    if kwargs or len(args) != 3:
        return None
    x, dim, index = args
    f = growth.front(x)
    if f is None or not isinstance(dim, int) or not -x.ndim <= dim < x.ndim or dim % x.ndim == f.dim:
        return None
    if growth.front(index) is not None:
        return None
    return growth.grown(_base(op(whole(x, f), dim, index)), f.dim, f.length, tensor.adopt(x).tpu_storage)


def _embedding(op, args: tuple, kwargs: dict):
    """``embedding`` of grown indices (T5's relative position buckets, built from ``arange`` of the key length):
    padding indices become row ``0``, and the rows are grown like the indices."""
    weight, indices = args[0], args[1]
    f = growth.front(indices)
    if f is None or growth.front(weight) is not None:
        return None
    capacity = growth.extent(f.length, f.capacity)
    indices = whole(indices, f, capacity).masked_fill(_padding(indices, f._replace(capacity=capacity)), 0)
    return growth.grown(_base(op(weight, indices, *args[2:], **kwargs)), f.dim, f.length)


def _scatter(op, args: tuple, kwargs: dict):
    """``scatter``/``scatter_add`` along the dim its index (and source) grow along: each padding position writes
    what the first position along that dim writes (a repeated write of the same value), or adds ``0``; the
    result is shaped like ``self``, an ordinary tensor."""
    if kwargs or len(args) != 4:
        return None
    x, dim, index, src = args
    found = _grown_index(x, dim, index)
    if found is None:
        return None
    d, f = found
    padding = _padding(index, f)
    index = whole(index, f)
    if isinstance(src, torch.Tensor):
        fs = growth.front(src)
        if fs is None or fs.dim != d or fs.length != f.length or src.ndim != index.ndim:
            return None
        src = whole(src, fs, f.capacity) if fs.capacity >= f.capacity else None
        if src is None:
            return None
        if op is aten.scatter_add.default:
            src = src.masked_fill(padding, 0)
        else:
            src = torch.where(padding, src.narrow(d, 0, 1), src)
    elif op is aten.scatter_add.default:
        return None
    index = torch.where(padding, index.narrow(d, 0, 1), index)
    return op(x, dim, index, src)


def _index(op, args: tuple, kwargs: dict):
    if kwargs or len(args) != 2:
        return None
    x, indices = args
    if not tensor.on_tpu(x) or len(indices) != x.ndim or x.ndim == 0:
        return None
    if any(i is None or not tensor.on_tpu(i) or i.dtype in (torch.bool, torch.uint8) or i.is_floating_point()
           for i in indices):
        return None
    fx = growth.front(x)
    found = [(i, growth.front(i)) for i in indices]
    grown_index = any(f for _, f in found)
    if fx is None and not grown_index:
        return None
    plan = _aligned(found, max(i.ndim for i in indices)) if grown_index else None
    if grown_index and plan is None:
        return None
    new = []
    for i, f in found:
        if f is not None:  # padding positions of a grown index would be checked too: make them a valid index
            i = whole(i, f, plan[2])
            i = i.masked_fill(_padding(i, f._replace(capacity=plan[2])), 0)
        new.append(i)
    if fx is not None:
        new[fx.dim] = _into_padded(new[fx.dim], fx.length, fx.capacity)
        x = whole(x, fx)
    out = op(x, new)
    return out if plan is None else growth.grown(_base(out), plan[0], plan[1])


def _into_padded(i, n: int, capacity: int):
    """Indices into a dim of logical length ``n`` as indices into its padded ``capacity``: negatives wrap by
    ``n`` (PyTorch's rule), and an index outside ``[-n, n)`` lands outside ``[-capacity, capacity)``, where the
    gather's own check reports it."""
    i = torch.where(i < 0, i + n, i)
    return torch.where(i >= n, i + (capacity - n), torch.where(i < 0, i - capacity, i))


def _copy(op, args: tuple, kwargs: dict):
    """``clone`` of a grown tensor. With a broadcast (stride-0) dim of size above 1 — what ``reshape`` makes of an
    expanded grown KV cache: ``repeat_kv``'s grouped-query keys in eager attention, reshaped by ``matmul`` to 3-d —
    the copy is made on the whole padded extent and grown again. So is a contiguous copy (asked for, or of a
    contiguous front) where that front is contiguous as PyTorch's result is: every dim before the grown one has
    size 1 (a batch of one's ids, which ``generate`` copies every token, or its attention output,
    ``y.transpose(1, 2).contiguous()``, in a forward over the whole sequence). Otherwise (``contiguous()`` of a
    batch: PyTorch's result is a contiguous tensor, so ours is too) the copy is the ordinary one, of ``n``
    positions, remembered as a copy of its source's padded extent: attention given it as a mask reads the source
    instead (:func:`attention_mask`; ``transformers`` makes T5's position-bias mask ``contiguous()`` before sdpa),
    and the copy, dead by the sync, never reaches a program. The record keeps the source's padded storage alive as
    long as the copy lives."""
    x = args[0]
    f = growth.front(x)
    if f is None or len(args) > 1 or kwargs.get("memory_format") not in (None, torch.contiguous_format,
                                                                            torch.preserve_format):
        return None
    contiguous = kwargs.get("memory_format") is torch.contiguous_format or x.is_contiguous()
    if any(s == 0 and n > 1 for n, s in zip(x.shape, x.stride())) or \
            (contiguous and all(n == 1 for n in x.shape[:f.dim])):
        return growth.grown(_base(op(whole(x, f), **kwargs)), f.dim, f.length)
    out = _unlearned(op, x, **kwargs)
    x = tensor.adopt(x)
    copy, source = tensor.adopt(out).tpu_storage, x.tpu_storage
    key = id(copy)
    _COPIES[key] = (weakref.ref(copy, lambda _, key=key: _COPIES.pop(key, None)), copy._array,
                    tensor.make(source, x.tpu_view), source._array)
    return out


def _unlearned(op, *args, **kwargs):
    """``op`` run the ordinary way on a front's own geometry, without the native recording kernel keying it: a
    lesson would serve the next call of ``op`` on that geometry — the rewrite's own — in C++, past the rewrite."""
    with config.native_recording(False):
        return op(*args, **kwargs)


def _copied_front(mask):
    """The grown tensor ``mask`` is a whole :func:`_copy` of (a tensor of its own over the same padded storage),
    when neither has been written since (a write replaces a storage's array), else ``None``."""
    m = tensor.adopt(mask)
    storage = m.tpu_storage
    entry = _COPIES.get(id(storage))
    if entry is None or m.tpu_view is not None:
        return None
    ref, copied, source, read = entry
    if ref() is not storage or storage._array is not copied or tensor.adopt(source).tpu_storage._array is not read:
        return None
    return source


def _arange(op, args: tuple, kwargs: dict):
    """``arange(n)`` of a growing length: where an append grew a live tensor to ``n`` within the last few syncs
    (a decode loop's mask or position bias, built from the length of what it just appended). A sequence that
    stopped growing (a generated output kept while a training loop runs) leaves ``arange`` ordinary."""
    if op is aten.arange.start:  # ``arange(0, n)``, as nanoGPT numbers its positions
        start, end = args[:2] if len(args) == 2 else (None, None)
        if type(start) is not int or start != 0:
            return None
    else:
        end = args[0] if args else kwargs.get("end")
        if len(args) > 1:
            return None
    if type(end) is not int or end < 2:
        return None
    capacity = growth.recent_extent(end)
    if capacity is None:
        return None
    kwargs = {k: v for k, v in kwargs.items() if k not in ("start", "end")}
    out = op(capacity, **kwargs) if op is aten.arange.default else op(0, capacity, **kwargs)
    return growth.grown(_base(out), 0, end)


def _filled(op, args: tuple, kwargs: dict):
    """``ones``/``zeros``/``full`` of a size with a growing length in it: the same padded extent as
    :func:`_arange` gives (``transformers``' BART decoder builds its mask as ``torch.ones(batch, cache length + 1)``
    every token). A size equal to a growing length by chance — T5's cross-attention bias is ``zeros`` over the
    prompt's length, which the decoder's length passes once — must stay ordinary, or that step builds a program
    of its own: a dim counts as growing only where the last call with the same other sizes had a shorter one
    there, or the same one, padded (several layers' calls within one step)."""
    size = args[0] if args else kwargs.get("size")
    if type(size) not in (list, tuple):
        return None
    if len(_FILLED) > 256:
        _FILLED.clear()
    for d in range(len(size) - 1, -1, -1):
        n = size[d]
        capacity = growth.recent_extent(n) if type(n) is int and n >= 2 else None
        if capacity is None:
            continue
        key = (op, d, *size[:d], *size[d + 1:])
        last = _FILLED.get(key)
        grows = last is not None and (last[0] < n or last == (n, True))
        _FILLED[key] = (n, grows)
        if grows:
            padded = list(size)
            padded[d] = capacity
            rest = {k: v for k, v in kwargs.items() if k != "size"}
            return growth.grown(_base(op(padded, *args[1:], **rest)), d, n)
    return None


#: ``(op, dim, the other sizes) -> (length, padded)``: the last ``ones``/``zeros``/``full`` of a recent growing
#: length along ``dim`` (:func:`_filled`)
_FILLED: dict = {}


def compact(t) -> bool:
    """Give ``t``, the front of a padded storage, a contiguous copy of its ``n`` positions as its own storage, in
    place, when no other tensor reads that storage; ``False`` (nothing changed) otherwise.

    A ``view`` that merges a grown dim with another (``torch.cat([a, b], 1).view(-1)``) cannot be expressed on
    the padded storage's strides, where PyTorch's contiguous ``cat`` result takes it. The view kernel calls this
    and retries (runtime/view_kernels.py). Values and every reference to ``t`` are kept; only its strides change.
    With another tensor on the storage (a view of ``t`` made before), moving ``t`` would break their aliasing, so
    PyTorch's view error stands. Who else reads the storage is found by the garbage collector's referrers (each
    tensor holds a ``(storage, view)`` pair): ~30 ms, on a path that raised before."""
    import gc

    t = tensor.adopt(t)
    storage = t.tpu_storage
    if growth.front(t) is None:
        return False
    pairs = [r for r in gc.get_referrers(storage) if type(r) is tuple and len(r) == 2 and r[0] is storage]
    private = sum(1 for entry in _COPIES.values() if tensor.adopt(entry[2]).tpu_storage is storage)
    if len(pairs) - private != 1:  # a copy's record of its source is no view of t: the source is not written
        return False
    active, _ACTIVE[0] = _ACTIVE[0], True  # the ordinary copy: contiguous, n positions
    try:
        copy = tensor.adopt(_unlearned(aten.clone.default, t, memory_format=torch.contiguous_format))
    finally:
        _ACTIVE[0] = active
    tensor.set_geometry(t, copy.tpu_storage, copy.tpu_view)
    return True


def attention_mask(mask, length: int, capacity: int):
    """``mask`` (an attention mask or bias) over ``capacity`` key positions when it is grown along its last dim
    to ``length`` keys (the keys' own padded length), or is an unwritten copy of such a tensor (:func:`_copy`),
    else ``None``: attention then reads the mask with the keys, whole, and masks the padding itself
    (runtime/padded_attention.py)."""
    f = growth.front(mask)
    if f is None:
        mask = _copied_front(mask)
        f = None if mask is None else growth.front(mask)
    if f is None or f.dim != mask.ndim - 1 or f.length != length:
        return None
    if f.capacity >= capacity:
        return whole(mask, f, capacity)
    return torch.constant_pad_nd(whole(mask, f), [0, capacity - f.capacity], 0)


def attention_fronts(query, key, value):
    """``(query, key, value, n)`` over their whole padded extents when all three are fronts grown along the
    sequence dim (dim 2) to the same length ``n``, as a forward over a whole grown sequence gives them (a
    generation loop without a KV cache: nanoGPT's, ``use_cache=False``); else ``None``. Attention then reads
    them whole, ``n`` masking the keys' padding (runtime/padded_attention.py): with ``is_causal`` a query
    position never reads a key after it, and without it no query reads a key past ``n``."""
    tensors = (query, key, value)
    alike = _alike(tensors, [growth.front(t) for t in tensors])
    if alike is None or alike[1] != 2:
        return None
    return (*alike[0], alike[2])


#: the ops besides the pointwise ones the recording kernel records on fronts (:func:`on_fronts`)
_ON_FRONTS = {aten.clone.default, aten.index_select.default, aten.linear.default, aten.native_layer_norm.default}
#: the ops with a rewrite of their own (the rest of the pointwise ops: :func:`_kind`)
_REWRITES = {aten.arange.default: _arange, aten.arange.start: _arange, aten.ones.default: _filled,
             aten.zeros.default: _filled, aten.full.default: _filled, aten.index.Tensor: _index,
             aten.constant_pad_nd.default: _pad, aten.clone.default: _copy, aten.gather.default: _gather,
             aten.index_select.default: _select, aten._to_copy.default: _pointwise,
             aten.full_like.default: _pointwise, aten.embedding.default: _embedding, aten.linear.default: _rowwise,
             aten.native_layer_norm.default: _rowwise, aten.cat.default: _concat,
             **dict.fromkeys(_IDENTITY, _reduce), **dict.fromkeys(_CUMULATIVE, _cumulative),
             **dict.fromkeys(_SOFTMAXES, _softmax), **dict.fromkeys(_PRODUCTS | _BIASED, _product),
             **dict.fromkeys(_SCATTERS, _scatter)}
executor.BOUNDED[:] = [growth._GROWN_IDS, run]
