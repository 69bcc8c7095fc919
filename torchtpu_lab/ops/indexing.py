"""Indexing ops: advanced indexing, gathers and scatters, masks, searches, and the data-dependent ``nonzero`` family
(``unique``, ``bincount`` and ``histc`` are :mod:`.counting`'s).

Ops whose output shape depends on input values (``nonzero``, ``masked_select``, and
``index``/``index_put`` with boolean masks) are ``jit=False``: they run on concrete arrays; where a fixed-shape
part remains (advanced indexing once masks are integer indices), it runs as one cached ``jax.jit`` call.
"""

from __future__ import annotations

import functools
import warnings

import jax
import torch
import jax.numpy as jnp
import numpy as np
from jax import lax

from .. import dtypes
from . import cpu_rules
from .error_flags import report, reports
from .registry import aten, checks_args, checks_calls, lower, real_fill_value


def _dim(d: int, ndim: int) -> int:
    return d + ndim if d < 0 else d


# ---- advanced indexing -------------------------------------------------------------------------------------


def _integer_indices(x, indices) -> tuple:
    """PyTorch's ``Tensor?[] indices`` with boolean masks expanded into their (concrete) nonzero coordinates;
    a mask must match the dims it covers, and every integer index must be in range (reported, see .checks)."""
    out = []
    for i, idx in enumerate(indices):
        d = len(out)
        if idx is not None and idx.dtype in (jnp.bool_, jnp.uint8):
            if idx.dtype == jnp.uint8:  # CPU's warning, per call (a mask runs eagerly: its shape is its data's)
                warnings.warn("indexing with dtype torch.uint8 is now deprecated, please use a dtype torch.bool "
                              "instead.", UserWarning, stacklevel=2)
            if idx.ndim == 0:
                raise NotImplementedError("torchtpu_lab: indexing with a 0-dim boolean mask")
            for k, n in enumerate(idx.shape):
                if d + k >= x.ndim or x.shape[d + k] != n:
                    raise IndexError(f"The shape of the mask {list(idx.shape)} at index {k} does not match the "
                                     f"shape of the indexed tensor {list(x.shape)} at index {d + k}")
            out.extend(jnp.nonzero(idx.astype(jnp.bool_)))
        else:
            if idx is not None and d < x.ndim:
                n = x.shape[d]
                report((idx < -n) | (idx >= n), idx,
                       message=f"index {{value}} is out of bounds for dimension {d} with size {n}")
            out.append(idx)
    return tuple(out)


def _key(indices) -> tuple:
    """A NumPy index tuple: a ``None`` entry keeps its whole dim (it is not ``newaxis``)."""
    return tuple(slice(None) if i is None else i for i in indices)


@functools.partial(jax.jit, static_argnums=(1,))
def _gather(x, present, *idx):
    it = iter(idx)
    return x[_key(next(it) if p else None for p in present)]


@functools.partial(jax.jit, static_argnums=(1, 2))
def _scatter(x, present, accumulate, values, *idx):
    it = iter(idx)
    ref = x.at[_key(next(it) if p else None for p in present)]
    values = values.astype(x.dtype)
    if not accumulate:
        return ref.set(values)
    return ref.max(values) if x.dtype == jnp.bool_ else ref.add(values)  # bools accumulate as CPU's or


def _no_masks(args, kwargs) -> bool:
    """Integer indexing compiles (and fuses); a boolean/uint8 mask makes the output shape data-dependent."""
    indices = args[1] if len(args) > 1 else kwargs.get("indices", ())
    return not any(i is not None and i.dtype in (torch.bool, torch.uint8) for i in indices)


@checks_args(aten.index.Tensor, aten._unsafe_index.Tensor, aten.index_put.default, aten._unsafe_index_put.default,
             aten._index_put_impl.default)
def _index_args(op, x, indices, *_, **__) -> None:
    """CPU's IndexErrors for integer indices (PyTorch's meta kernel raises RuntimeErrors, or JAX's gather a
    TypeError): index dtypes, indices that do not broadcast together (``x[False, [0, 1]]`` included: PyTorch
    makes ``False`` an empty index), and any index into a dim of size 0."""
    present = [i for i in indices if i is not None]
    for i in present:
        if i.dtype not in (torch.int64, torch.int32, torch.uint8, torch.bool):
            raise IndexError("tensors used as indices must be long, int, byte or bool tensors")
    if any(i.dtype in (torch.bool, torch.uint8) for i in present):
        return  # masks: their nonzero counts, which meta tensors do not have, make the shapes
    try:
        torch.broadcast_shapes(*(i.shape for i in present))
    except RuntimeError:
        shapes = ", ".join(str(list(i.shape)) for i in present)
        raise IndexError(f"shape mismatch: indexing tensors could not be broadcast together with shapes {shapes}")
    for d, i in enumerate(indices):
        if i is not None and d < x.dim() and x.shape[d] == 0 and i.numel() > 0:
            raise IndexError("index is out of bounds for dimension with size 0")


@lower(aten.index.Tensor, aten._unsafe_index.Tensor, jit=_no_masks)
@reports
def index(x, indices):
    idx = _integer_indices(x, indices)
    return _gather(x, tuple(i is not None for i in idx), *[i for i in idx if i is not None])


def _indexed_shape(shape: tuple, idx: tuple) -> tuple | None:
    """The shape of ``x[idx]`` (NumPy's advanced-indexing rule: the broadcast index shape replaces adjacent indexed
    dims in place, else leads), from shapes alone; None when the indices themselves do not broadcast."""
    present = [d for d, i in enumerate(idx) if i is not None]
    if not present:
        return tuple(shape)
    try:
        joint = tuple(np.broadcast_shapes(*(i.shape for i in idx if i is not None)))
    except ValueError:
        return None
    if present == list(range(present[0], present[-1] + 1)):
        return tuple(shape[:present[0]]) + joint + tuple(shape[present[-1] + 1:])
    return joint + tuple(n for d, n in enumerate(shape) if d not in present)


def _check_values_fit(values, idx: tuple, shape: tuple) -> None:
    """CPU's RuntimeError for values that cannot fill the indexed positions (``a[mask] = []``); without it JAX's
    scatter raised a ValueError about types ("Incompatible types for broadcasting"), which no PyTorch code
    expects. (``__setitem__`` drops the values' leading size-1 dims before it calls ``index_put_``; the op
    itself does not: a 0-dim ``x.index_put([], tensor([1.]))`` raises on CPU.)"""
    result = _indexed_shape(shape, idx)
    if result is None:
        return
    vshape = tuple(values.shape)
    try:
        fits = tuple(np.broadcast_shapes(vshape, result)) == result
    except ValueError:
        fits = False
    if not fits:
        raise RuntimeError(f"shape mismatch: value tensor of shape {list(values.shape)} cannot be broadcast to "
                           f"indexing result of shape {list(result)}")


@lower(aten.index_put.default, aten._unsafe_index_put.default, jit=_no_masks)
@reports
def index_put(x, indices, values, accumulate=False):
    """``accumulate=True`` sums duplicate indices."""
    idx = _integer_indices(x, indices)
    _check_values_fit(values, idx, tuple(x.shape))
    if values.dtype != x.dtype:  # CPU's check: values are never cast (``double[:, [1]] = int_tensor`` raises)
        raise RuntimeError(f"Index put requires the source and destination dtypes match, got "
                           f"{dtypes.scalar_name(x.dtype)} for the destination and "
                           f"{dtypes.scalar_name(values.dtype)} for the source.")
    return _scatter(x, tuple(i is not None for i in idx), bool(accumulate), values, *[i for i in idx if i is not None])


@lower(aten._index_put_impl.default, jit=_no_masks)
@reports
def index_put_impl(x, indices, values, accumulate=False, unsafe=False):
    return index_put(x, indices, values, accumulate)


# ---- gather / scatter along a dim ---------------------------------------------------------------------------


def _coords(index, dim: int) -> tuple:
    """Full coordinates for ``scatter``/``gather``: ``index`` along ``dim``, the position itself elsewhere."""
    return tuple(
        index if d == dim else lax.broadcasted_iota(jnp.int64, index.shape, d) for d in range(index.ndim)
    )


def _crop(src, shape):
    return src[tuple(slice(0, n) for n in shape)]


def _in_dim(x, dim, index, error=RuntimeError) -> None:
    """``index`` (no negative values, as for ``gather``/``scatter``) must be in range along ``dim`` of ``x``."""
    n = x.shape[_dim(dim, x.ndim)] if x.ndim else 1
    report((index < 0) | (index >= n), index, error=error,
           message=f"index {{value}} is out of bounds for dimension {_dim(dim, max(x.ndim, 1))} with size {n}")


@lower(aten.gather.default)
@reports
def gather(x, dim, index, *, sparse_grad=False):
    _in_dim(x, dim, index)
    if index.size == 0:
        return jnp.zeros(index.shape, x.dtype)
    if x.ndim == 0:
        return jnp.broadcast_to(x, index.shape)
    if index.ndim == 0:
        return x.reshape(-1)[index]
    return x[_coords(index, _dim(dim, x.ndim))]


def _scatter_dim(x, dim, index, src, how):
    _in_dim(x, dim, index)
    if index.size == 0:
        return x
    if x.ndim == 0:
        x, index = x.reshape(1), index.reshape(1)
        src = src.reshape(1) if jnp.ndim(src) else src
        return _scatter_dim(x, 0, index, src, how).reshape(())
    if index.ndim == 0:
        index = index.reshape((1,) * x.ndim)
        if jnp.ndim(src):
            src = src.reshape((1,) * x.ndim)
    if jnp.ndim(src):
        src = _crop(src, index.shape)
    ref = x.at[_coords(index, _dim(dim, x.ndim))]
    src = jnp.asarray(src).astype(x.dtype)
    return getattr(ref, _method(how, x.dtype))(src)


def _method(how: str, dtype) -> str:
    """The ``.at`` method of a scatter's ``how`` for ``dtype``: bools add as CPU's or and multiply as its and
    (JAX has no bool add or multiply)."""
    return {"add": "max", "multiply": "min"}.get(how, how) if dtype == jnp.bool_ else how


@lower(aten.scatter.src, aten.scatter.value)
@reports
def scatter(x, dim, index, src):
    return _scatter_dim(x, dim, index, src, "set")


@lower(aten.scatter_add.default)
@reports
def scatter_add(x, dim, index, src):
    return _scatter_dim(x, dim, index, src, "add")


@lower(aten.scatter.reduce, aten.scatter.value_reduce)
@reports
def scatter_reduce_legacy(x, dim, index, src, *, reduce):
    return _scatter_dim(x, dim, index, src, {"add": "add", "multiply": "multiply"}[reduce])


def _identity(reduce: str, dtype):
    if reduce in ("sum", "mean"):
        return jnp.zeros((), dtype)
    if reduce == "prod":
        return jnp.ones((), dtype)
    if jnp.issubdtype(dtype, jnp.floating):
        return jnp.asarray(-jnp.inf if reduce == "amax" else jnp.inf, dtype)
    if dtype == jnp.bool_:
        return jnp.asarray(reduce == "amin")
    info = jnp.iinfo(dtype)
    return jnp.asarray(info.min if reduce == "amax" else info.max, dtype)


_REDUCE_METHOD = {"sum": "add", "mean": "add", "prod": "multiply", "amax": "max", "amin": "min"}


def _reduce_into(x, scatter_at, src, reduce, include_self):
    """``scatter_at(base, values, method)`` scatters ``values`` into ``base``; shared by scatter/index_reduce.

    Integer ``mean`` floors, as PyTorch does; positions nothing is scattered into keep ``x``.
    """
    src = src.astype(x.dtype)
    base = x if include_self else jnp.full(x.shape, _identity(reduce, x.dtype))
    out = scatter_at(base, src, _method(_REDUCE_METHOD[reduce], x.dtype))
    hit = scatter_at(jnp.zeros(x.shape, jnp.int64), jnp.ones(src.shape, jnp.int64), "add")
    if reduce == "mean":
        count = hit + (1 if include_self else 0)
        count = jnp.maximum(count, 1)
        if jnp.issubdtype(x.dtype, jnp.floating):
            out = out / count.astype(x.dtype)
        else:
            out = jnp.floor_divide(out, count.astype(x.dtype))
    if not include_self:
        out = jnp.where(hit > 0, out, x)
    return out


@lower(aten.scatter_reduce.two)
@reports
def scatter_reduce(x, dim, index, src, reduce, *, include_self=True):
    _in_dim(x, dim, index)
    if index.size == 0:
        return x
    if x.ndim == 0:
        return scatter_reduce(x.reshape(1), 0, index.reshape(1), src.reshape(1), reduce,
                              include_self=include_self).reshape(())
    dim = _dim(dim, x.ndim)
    src = _crop(src, index.shape)
    coords = _coords(index, dim)
    return _reduce_into(x, lambda base, v, how: getattr(base.at[coords], how)(v), src, reduce, include_self)


# ---- index_* along a dim --------------------------------------------------------------------------------------


#: CPU's message for an index out of range, per ``index_*`` op (``{value}``, ``{dim}``, ``{n}``); ``index_fill``
#: alone takes negative indices, from the end
_OUT_OF_RANGE = {"index_add": "index out of range in self", "index_reduce": "index out of range in self",
                 "index_copy": "index_copy_(): index {value} is out of bounds for dimension {dim} with size {n}",
                 "index_fill": "index {value} is out of bounds for dimension {dim} with size {n}"}


def _along(x, dim, index, op: str):
    """The ``.at`` key selecting ``index`` (1-D) along ``dim``, and ``x`` as at least 1-D; an index out of range
    is CPU's IndexError for ``op`` (reported)."""
    d = _dim(dim, max(x.ndim, 1))
    n = x.shape[d] if x.ndim else 1
    low = -n if op == "index_fill" else 0
    message = _OUT_OF_RANGE[op].replace("{dim}", str(d)).replace("{n}", str(n))
    report((index < low) | (index >= n), index, error=IndexError, message=message)
    index = jnp.where(index < 0, index + n, index) if low else index
    if x.ndim == 0:
        return x.reshape(1), (index.reshape(-1),)
    return x, (slice(None),) * _dim(dim, x.ndim) + (index.reshape(-1),)


def _source_like(x, source):
    return source.reshape(source.shape or (1,)) if x.ndim == 0 else source


@lower(aten.index_select.default)
@reports
def index_select(x, dim, index):
    n = x.shape[_dim(dim, x.ndim)] if x.ndim else 1
    report((index < 0) | (index >= n), message="index out of range in self")
    if x.ndim == 0:
        return x
    return jnp.take(x, index.reshape(-1), axis=_dim(dim, x.ndim))


@lower(aten.index_add.default)
@reports
def index_add(x, dim, index, source, *, alpha=1):
    x1, key = _along(x, dim, index, "index_add")
    source = _source_like(x, source)
    if x.dtype == jnp.bool_:  # a bool alpha scales as CPU's and; the add is an or (_method)
        source = jnp.logical_and(source, jnp.asarray(alpha).astype(jnp.bool_))
    else:
        source = (source * alpha).astype(x.dtype)
    return getattr(x1.at[key], _method("add", x.dtype))(source).reshape(x.shape)


@lower(aten.index_copy.default)
@reports
def index_copy(x, dim, index, source):
    x1, key = _along(x, dim, index, "index_copy")
    return x1.at[key].set(_source_like(x, source).astype(x.dtype)).reshape(x.shape)


@lower(aten.index_fill.int_Scalar, aten.index_fill.int_Tensor)
@reports
def index_fill(x, dim, index, value):
    real_fill_value(value, x.dtype, "index_fill_")
    x1, key = _along(x, dim, index, "index_fill")
    return x1.at[key].set(jnp.asarray(value).astype(x.dtype)).reshape(x.shape)


@lower(aten.index_reduce.default)
@reports
def index_reduce(x, dim, index, source, reduce, *, include_self=True):
    x1, key = _along(x, dim, index, "index_reduce")
    source = _source_like(x, source)
    out = _reduce_into(x1, lambda base, v, how: getattr(base.at[key], how)(v), source, reduce, include_self)
    return out.reshape(x.shape)


# ---- masks ------------------------------------------------------------------------------------------------------


def _about_arguments(e: BaseException) -> bool:
    return isinstance(e, (RuntimeError, IndexError))  # NotImplementedError included: CPU has no such kernel


@checks_args(aten.masked_fill.Scalar, aten.masked_fill.Tensor, aten.masked_scatter.default, aten.index_add.default,
             aten.index_copy.default, aten.index_fill.int_Scalar, aten.index_fill.int_Tensor,
             aten.index_reduce.default, aten.index_select.default)
@checks_calls(aten.masked_select.default)
def _cpu_argument_checks(op, *args, **kwargs) -> None:
    """CPU's errors for argument dtypes and ranks that PyTorch's meta kernels let through or word otherwise, asked
    of the CPU kernel on stand-ins (each op words them its own way): a uint8 or int mask (``jnp.where`` took it as
    truthy numbers, ``masked_select`` indexed with it), a source of another dtype (``index_copy`` cast it), a
    ``reduce`` ``index_reduce`` does not know, an index that is not a vector, a value tensor that is not 0-dim.
    Checks of these ops' sizes hold for the stand-ins' all-ones sizes, so only real refusals come back.
    ``masked_select`` is checked per call: it runs on concrete arrays, with no meta kernel. A dtype CPU has no
    kernel for (``index_reduce`` of bools) is its NotImplementedError, not JAX's TypeError."""
    cpu_rules.raise_refusal(op, args, kwargs, _about_arguments, values=True)
    if op is aten.index_copy.default:
        _index_copy_sizes(*args)


def _index_copy_sizes(x, dim, index, source) -> None:
    """CPU's size checks of ``index_copy``, which the stand-ins' all-ones sizes cannot trip: PyTorch's meta kernel
    raises RuntimeError where CPU raises IndexError, and prints slice shapes as ``torch.Size([2, 3])`` for
    C++'s ``2 3``."""
    n = index.numel()
    if source.dim() == 0 and n != 1:
        raise IndexError(f"index_copy_(): When source is scalar, index should have one element (got {n})")
    if source.dim() != x.dim() and 0 not in (source.dim(), x.dim()):
        raise IndexError(f"index_copy_(): When source and destination are not scalars, their dimensionality must "
                         f"match. Source dimensionality ({source.dim()}), destination dimensionality ({x.dim()})")
    d = _dim(dim, x.dim())
    slices = [[n for k, n in enumerate(t.shape) if k != d] for t in (x, source)]
    if slices[0] != slices[1]:
        raise RuntimeError(f"index_copy_(): Source/destination tensor must have same slice shapes. Destination slice "
                           f"shape: {' '.join(map(str, slices[0]))} at dimension {d} and source slice shape: "
                           f"{' '.join(map(str, slices[1]))} at dimension 0.")
    if source.dim() > 0 and n != source.shape[d]:
        raise IndexError(f"index_copy_(): Number of indices ({n}) should be equal to source.size(dim) "
                         f"({source.shape[d]})")


@lower(aten.masked_fill.Scalar, aten.masked_fill.Tensor)
def masked_fill(x, mask, value):
    real_fill_value(value, x.dtype)
    return jnp.where(mask, jnp.asarray(value).astype(x.dtype), x)


@lower(aten.masked_scatter.default)
@reports
def masked_scatter(x, mask, source):
    """The k-th ``True`` of the broadcast mask (row-major) takes ``source.flatten()[k]``. Too few source elements
    is CPU's RuntimeError (reported): clamping ``k`` would repeat the last one, a silent wrong answer."""
    shape = jnp.broadcast_shapes(x.shape, mask.shape)
    x, mask = jnp.broadcast_to(x, shape), jnp.broadcast_to(mask, shape)
    report(jnp.sum(mask, dtype=jnp.int64) > source.size, error=RuntimeError,
           message="Number of elements of source < number of ones in mask")
    if source.size == 0:
        return x
    k = jnp.cumsum(mask.reshape(-1).astype(jnp.int64)) - 1
    values = source.reshape(-1)[jnp.clip(k, 0, source.size - 1)].reshape(shape)
    return jnp.where(mask, values.astype(x.dtype), x)


@lower(aten.masked_scatter_backward.default)
def masked_scatter_backward(grad, mask, sizes):
    numel = int(np.prod(sizes))
    mask = jnp.broadcast_to(mask, grad.shape).reshape(-1)
    k = jnp.where(mask, jnp.cumsum(mask.astype(jnp.int64)) - 1, numel)
    out = jnp.zeros((numel,), grad.dtype).at[k].set(grad.reshape(-1), mode="drop")
    return out.reshape(tuple(sizes))


@lower(aten.masked_select.default, jit=False)
def masked_select(x, mask):
    shape = jnp.broadcast_shapes(x.shape, mask.shape)
    return jnp.broadcast_to(x, shape)[jnp.broadcast_to(mask, shape)]


@lower(aten.take.default)
@reports
def take(x, index):
    report((index < -x.size) | (index >= x.size), index,
           message=f"out of range: tried to access index {{value}} on a tensor of {x.size} elements.")
    return x.reshape(-1)[index]


@lower(aten.put.default)
@reports
def put(x, index, source, accumulate=False):
    report((index < -x.size) | (index >= x.size), index,
           message=f"out of range: tried to access index {{value}} on a tensor of {x.size} elements.")
    ref = x.reshape(-1).at[index.reshape(-1)]
    source = source.reshape(-1).astype(x.dtype)
    return (ref.add(source) if accumulate else ref.set(source)).reshape(x.shape)


# ---- nonzero ------------------------------------------------------------------------------------------------------


@lower(aten.nonzero.default, jit=False)
def nonzero(x):
    if x.ndim == 0:
        return jnp.zeros((int(x != 0), 0), jnp.int64)
    return jnp.stack(jnp.nonzero(x), axis=-1).astype(jnp.int64).reshape(-1, x.ndim)


@lower(aten.nonzero_static.default)
def nonzero_static(x, *, size, fill_value=-1):
    if x.ndim == 0:
        return jnp.zeros((size, 0), jnp.int64)
    coords = jnp.nonzero(x, size=size, fill_value=fill_value)
    return jnp.stack(coords, axis=-1).astype(jnp.int64).reshape(size, x.ndim)


# ---- searches -----------------------------------------------------------------------------------------------------


def _binary_search(seq, values, right: bool):
    """PyTorch's own bisection, step for step: ``lower_bound`` advances while ``!(seq[mid] >= v)``,
    ``upper_bound`` while ``!(seq[mid] > v)`` (so NaNs land where PyTorch puts them). ``seq`` is ``(B, n)``,
    ``values`` ``(B, m)``."""
    n = seq.shape[-1]
    start = jnp.zeros(values.shape, jnp.int64)
    end = jnp.full(values.shape, n, jnp.int64)
    for _ in range(n.bit_length() + 1):
        active = start < end
        mid = (start + end) // 2
        at = jnp.take_along_axis(seq, jnp.clip(mid, 0, max(n - 1, 0)), axis=-1) if n else values
        go_right = ~(at > values) if right else ~(at >= values)
        start = jnp.where(active & go_right, mid + 1, start)
        end = jnp.where(active & ~go_right, mid, end)
    return start


@checks_args(aten.searchsorted.Tensor, aten.searchsorted.Scalar)
def _searchsorted_args(op, boundaries, values, *, out_int32=False, right=False, side=None, sorter=None) -> None:
    """CPU's checks (``searchsorted_pre_check``) that PyTorch's meta kernel lacks, in CPU's order."""
    name = "torch.searchsorted(): "
    if side is not None and side not in ("left", "right"):
        raise RuntimeError(f"{name}side can only be 'left' or 'right' but got {side}")
    value_dim = values.dim() if isinstance(values, torch.Tensor) else 0
    if value_dim == 0 and boundaries.dim() != 1:
        numel = values.numel() if isinstance(values, torch.Tensor) else 1
        raise RuntimeError(f"{name}input value can be a scalar only when boundaries tensor dimension is 1, but we "
                           f"got boundaries tensor dim({boundaries.dim()}) and input value's dim({value_dim}) "
                           f"numel({numel})")
    if boundaries.dim() == 0:
        raise RuntimeError(f"{name}boundaries tensor should have positive dimension, but got 0 dimension")
    if sorter is not None and sorter.dtype != torch.int64:
        raise RuntimeError(f"{name}sorter must be a tensor of long dtype but got dtype {dtypes.scalar_name(sorter.dtype)}")


@checks_args(aten.bucketize.Tensor, aten.bucketize.Scalar)
def _bucketize_args(op, values, boundaries, *, out_int32=False, right=False) -> None:
    if boundaries.dim() != 1:
        raise RuntimeError(f"boundaries tensor must be 1 dimension, but got dim({boundaries.dim()})")


@reports
@lower(aten.searchsorted.Tensor, aten.searchsorted.Scalar)
def searchsorted(seq, values, *, out_int32=False, right=False, side=None, sorter=None):
    right = bool(right) or side == "right"
    values = jnp.asarray(values)
    if sorter is not None:
        report((sorter < 0) | (sorter >= seq.shape[-1]), error=RuntimeError,
               message="torch.searchsorted(): sorter index out of range")
        seq = jnp.take_along_axis(seq, sorter, axis=-1)
    dtype = jnp.promote_types(seq.dtype, values.dtype)
    if seq.ndim == 1:
        seq2, vals2 = seq.reshape(1, -1), values.reshape(1, -1)
    else:
        seq2, vals2 = seq.reshape(-1, seq.shape[-1]), values.reshape(-1, values.shape[-1] if values.ndim else 1)
    out = _binary_search(seq2.astype(dtype), vals2.astype(dtype), right)
    return out.reshape(values.shape)


@lower(aten.bucketize.Tensor, aten.bucketize.Scalar)
def bucketize(values, boundaries, *, out_int32=False, right=False):
    values = jnp.asarray(values)
    dtype = jnp.promote_types(boundaries.dtype, values.dtype)
    out = _binary_search(boundaries.reshape(1, -1).astype(dtype), values.reshape(1, -1).astype(dtype), right)
    return out.reshape(values.shape)
