"""Reductions, scans, sorting and selection ops."""

from __future__ import annotations

import jax.numpy as jnp
from jax import lax

from .. import dtypes
from .casts import convert
from .elementwise import _floating_only
from .precision import opmath
from .registry import aten, checks_args, fixes_meta, lower, wrap_dim


# ---- helpers ------------------------------------------------------------------------------------------------


def _axes(dim, ndim: int, empty_means_all: bool = True) -> tuple:
    """Normalized reduction axes. ``None`` (and ``[]`` where PyTorch says so) means every axis; a 0-dim input
    accepts dim 0/-1 and has nothing to reduce."""
    if dim is None or (empty_means_all and isinstance(dim, (list, tuple)) and len(dim) == 0):
        return tuple(range(ndim))
    if isinstance(dim, int):
        dim = (dim,)
    if ndim == 0:
        return ()
    return tuple(sorted({d % ndim for d in dim}))


def _axis(dim: int, ndim: int) -> int:
    return wrap_dim(dim, ndim)


def _is_int(x) -> bool:
    return jnp.issubdtype(x.dtype, jnp.integer) or x.dtype == jnp.bool_


def _acc(x, dtype):
    """``x`` in the dtype a sum/prod accumulates in: ``dtype=`` if given, int64 for integers and bools."""
    if dtype is not None:
        return x.astype(dtypes.to_jax(dtype))
    if _is_int(x):
        return x.astype(jnp.int64)
    return x


def _float(x):
    return x if jnp.issubdtype(x.dtype, jnp.inexact) else x.astype(jnp.float32)


# ---- sums, means, products ----------------------------------------------------------------------------------


@lower(aten.sum.dim_IntList)
def sum_dim(x, dim=None, keepdim=False, *, dtype=None):
    return jnp.sum(_acc(x, dtype), axis=_axes(dim, x.ndim), keepdims=keepdim)


@lower(aten.sum.default)
def sum_all(x, *, dtype=None):
    return jnp.sum(_acc(x, dtype))


@lower(aten.nansum.default)
def nansum(x, dim=None, keepdim=False, *, dtype=None):
    x = _acc(x, dtype)
    if jnp.issubdtype(x.dtype, jnp.inexact):
        x = jnp.where(jnp.isnan(x), jnp.zeros((), x.dtype), x)
    return jnp.sum(x, axis=_axes(dim, x.ndim), keepdims=keepdim)


@fixes_meta(aten.nansum.default)
def _nansum_of_no_dims(op, args: list, kwargs: dict, meta):
    """``nansum(x, dim=[])`` reduces every dim on CPU (as ``sum`` does), where PyTorch's meta kernel keeps the
    shape, and the lowering's result (CPU's) then failed the shape check."""
    dim = kwargs.get("dim", args[1] if len(args) > 1 else None)
    if dim is None or len(dim) or args[0].dim() == 0:
        return meta
    keepdim = kwargs.get("keepdim", args[2] if len(args) > 2 else False)
    return meta.new_empty((1,) * args[0].dim() if keepdim else ())


@lower(aten.mean.dim)
def mean_dim(x, dim=None, keepdim=False, *, dtype=None):
    x = x.astype(dtypes.to_jax(dtype)) if dtype is not None else x
    return jnp.mean(x, axis=_axes(dim, x.ndim), keepdims=keepdim)


@lower(aten.mean.default)
def mean_all(x, *, dtype=None):
    x = x.astype(dtypes.to_jax(dtype)) if dtype is not None else x
    return jnp.mean(x)


@lower(aten.prod.default)
def prod_all(x, *, dtype=None):
    return jnp.prod(_acc(x, dtype))


@lower(aten.prod.dim_int)
def prod_dim(x, dim, keepdim=False, *, dtype=None):
    return jnp.prod(_acc(x, dtype), axis=_axes(dim, x.ndim), keepdims=keepdim)


# ---- min / max --------------------------------------------------------------------------------------------------


def _empty_dim(name: str, d: int) -> IndexError:
    """CPU's IndexError for reducing or selecting along dim ``d`` of size 0."""
    return IndexError(f"{name}(): Expected reduction dim {d} to have non-zero size.")


@checks_args(aten.amax.default, aten.amin.default, aten.argmax.default, aten.argmin.default)
def _reduced_dims_not_empty(op, x, dim=None, keepdim=False) -> None:
    """CPU's IndexError for a max/min/arg-reduction over a dim of size 0, or over all of an empty tensor without a
    dim (arg-reductions: amax/amin's is a RuntimeError, which PyTorch's meta kernel raises alike); its meta
    kernel raises a RuntimeError of its own before our lowering is reached."""
    if x.numel() != 0:
        return
    name = op._schema.name.split("::")[-1]
    dims = [] if dim is None else [dim] if isinstance(dim, int) else list(dim)
    if not dims and name.startswith("arg"):
        raise IndexError(f"{name}(): Expected reduction dim to be specified for input.numel() == 0.")
    for d in dims:
        d = wrap_dim(d, x.dim())
        if x.dim() > 0 and x.shape[d] == 0:
            raise _empty_dim(name, d)


@checks_args(aten.median.dim, aten.nanmedian.dim, aten.mode.default, aten.kthvalue.default)
def _selected_dim_not_empty(op, x, *args, **kwargs) -> None:
    """CPU's IndexError for selecting along a dim of size 0 (PyTorch's meta kernels let it through, or raise a
    RuntimeError about ``k``); nanmedian's says median, as CPU's does."""
    name = op._schema.name.split("::")[-1]
    at = 1 if name == "kthvalue" else 0
    dim = args[at] if len(args) > at else kwargs.get("dim", -1)
    if x.dim() > 0 and x.shape[wrap_dim(dim, x.dim())] == 0:
        raise _empty_dim("median" if name == "nanmedian" else name, wrap_dim(dim, x.dim()))


@lower(aten.amax.default)
def amax(x, dim=(), keepdim=False):
    return jnp.max(x, axis=_axes(dim, x.ndim), keepdims=keepdim)


@lower(aten.amin.default)
def amin(x, dim=(), keepdim=False):
    return jnp.min(x, axis=_axes(dim, x.ndim), keepdims=keepdim)


def _check_not_empty(x, name: str) -> None:
    """A full max/min of nothing has no value: PyTorch's CPU kernel raises (JAX's own error is a ValueError)."""
    if x.size == 0:
        raise RuntimeError(f"{name}(): Expected reduction dim to be specified for input.numel() == 0. "
                           "Specify the reduction dim with the 'dim' argument.")


@lower(aten.max.default)
def max_all(x):
    _check_not_empty(x, "max")
    return jnp.max(x)


@lower(aten.min.default)
def min_all(x):
    _check_not_empty(x, "min")
    return jnp.min(x)


def _arg_extreme(x, axis: int, largest: bool):
    """Max (min) and the index of its first occurrence along ``axis``; NaN is the extreme (first NaN wins)."""
    if x.dtype == jnp.bool_:
        x = x.astype(jnp.int8)
    floating = jnp.issubdtype(x.dtype, jnp.inexact)
    none = jnp.iinfo(jnp.int64).max  # index of the reduction's init value, which never wins

    def reducer(a, b):
        (va, ia), (vb, ib) = a, b
        strict = (vb > va) if largest else (vb < va)
        tie = va == vb
        if floating:
            na, nb = jnp.isnan(va), jnp.isnan(vb)
            strict = (nb & ~na) | (~na & ~nb & strict)
            tie = tie | (na & nb)
        take_b = (ia == none) | ((ib != none) & (strict | (tie & (ib < ia))))
        return jnp.where(take_b, vb, va), jnp.where(take_b, ib, ia)

    idx = lax.broadcasted_iota(jnp.int64, x.shape, axis)
    init = (jnp.zeros((), x.dtype), jnp.array(none, jnp.int64))
    return lax.reduce((x, idx), init, reducer, (axis,))


def _select_dim(x, dim, keepdim, largest, name):
    if x.ndim == 0:
        return x, jnp.zeros((), jnp.int64)
    axis = _axis(dim, x.ndim)
    if x.shape[axis] == 0:  # PyTorch's meta kernel lets this through; its CPU kernel raises
        raise IndexError(f"{name}(): Expected reduction dim {axis} to have non-zero size.")
    v, i = _arg_extreme(x, axis, largest)
    v = v.astype(x.dtype)
    if keepdim:
        v, i = jnp.expand_dims(v, axis), jnp.expand_dims(i, axis)
    return v, i


@lower(aten.max.dim)
def max_dim(x, dim, keepdim=False):
    return _select_dim(x, dim, keepdim, True, "max")


@lower(aten.min.dim)
def min_dim(x, dim, keepdim=False):
    return _select_dim(x, dim, keepdim, False, "min")


def _arg_reduce(x, dim, keepdim, largest):
    name = "argmax" if largest else "argmin"
    if dim is None:
        i = _select_dim(x.reshape(-1), 0, False, largest, name)[1]
        return i.reshape((1,) * x.ndim) if keepdim else i
    return _select_dim(x, dim, keepdim, largest, name)[1]


@lower(aten.argmax.default)
def argmax(x, dim=None, keepdim=False):
    return _arg_reduce(x, dim, keepdim, True)


@lower(aten.argmin.default)
def argmin(x, dim=None, keepdim=False):
    return _arg_reduce(x, dim, keepdim, False)


@lower(aten.aminmax.default)
def aminmax(x, *, dim=None, keepdim=False):
    if dim is None:
        lo, hi = jnp.min(x), jnp.max(x)
        if keepdim:
            lo, hi = lo.reshape((1,) * x.ndim), hi.reshape((1,) * x.ndim)
        return lo, hi
    axes = _axes(dim, x.ndim)
    return jnp.min(x, axis=axes, keepdims=keepdim), jnp.max(x, axis=axes, keepdims=keepdim)


# ---- variance / std ---------------------------------------------------------------------------------------------


def _var_mean(x, dim, correction, keepdim):
    """PyTorch divides by ``max(0, N - correction)`` (0 gives inf/nan, as on CPU); half types in float32, rounded
    once (CPU's Welford runs in float32)."""
    x = opmath(_float(x))
    axes = _axes(dim, x.ndim)
    n = 1
    for a in axes:
        n *= x.shape[a]
    mean = jnp.mean(x, axis=axes, keepdims=True)
    d = x - mean
    ss = jnp.sum((d * jnp.conj(d)).real if jnp.iscomplexobj(d) else d * d, axis=axes, keepdims=keepdim)
    c = 1 if correction is None else correction
    var = ss / jnp.maximum(n - c, 0)
    return var, (mean if keepdim or x.ndim == 0 else jnp.squeeze(mean, axes))


@lower(aten.var.correction)
def var(x, dim=None, *, correction=None, keepdim=False):
    return _var_mean(x, dim, correction, keepdim)[0]


@lower(aten.std.correction)
def std(x, dim=None, *, correction=None, keepdim=False):
    return jnp.sqrt(_var_mean(x, dim, correction, keepdim)[0])


@lower(aten.var_mean.correction)
def var_mean(x, dim=None, *, correction=None, keepdim=False):
    return _var_mean(x, dim, correction, keepdim)


@lower(aten.std_mean.correction)
def std_mean(x, dim=None, *, correction=None, keepdim=False):
    v, m = _var_mean(x, dim, correction, keepdim)
    return jnp.sqrt(v), m


# ---- scans ------------------------------------------------------------------------------------------------------


@lower(aten.cumsum.default)
def cumsum(x, dim, *, dtype=None):
    x = _acc(x, dtype)
    return x if x.ndim == 0 else jnp.cumsum(opmath(x), axis=_axis(dim, x.ndim)).astype(x.dtype)


@lower(aten.cumprod.default)
def cumprod(x, dim, *, dtype=None):
    x = _acc(x, dtype)
    return x if x.ndim == 0 else jnp.cumprod(opmath(x), axis=_axis(dim, x.ndim)).astype(x.dtype)


def _cum_extreme(x, dim, largest):
    """Running max/min with PyTorch's indices: ties take the latest index; a NaN sticks until the next NaN,
    which takes over (CPU's ``isnan(x) || (!isnan(out) && x >= out)``)."""
    if x.ndim == 0:
        return x, jnp.zeros((), jnp.int64)
    axis = _axis(dim, x.ndim)
    idx = lax.broadcasted_iota(jnp.int64, x.shape, axis)
    v = x.astype(jnp.int8) if x.dtype == jnp.bool_ else x
    floating = jnp.issubdtype(v.dtype, jnp.inexact)

    def combine(a, b):
        (va, ia), (vb, ib) = a, b
        ge = (vb >= va) if largest else (vb <= va)
        if floating:
            take_b = jnp.isnan(vb) | (~jnp.isnan(va) & ge)
        else:
            take_b = ge
        return jnp.where(take_b, vb, va), jnp.where(take_b, ib, ia)

    inds = lax.associative_scan(combine, (v, idx), axis=axis)[1]
    # the values are gathered at the indices: the scan's interleaving adds zero padding, which turns -0.0 into 0.0
    return jnp.take_along_axis(x, inds, axis=axis), inds


@lower(aten.cummax.default)
def cummax(x, dim):
    return _cum_extreme(x, dim, True)


@lower(aten.cummin.default)
def cummin(x, dim):
    return _cum_extreme(x, dim, False)


@lower(aten._logcumsumexp.default, aten.logcumsumexp.default)
def logcumsumexp(x, dim):
    _floating_only("logcumsumexp_out_cpu", x)  # CPU has no integer or bool kernel: its error, not a float result
    if x.ndim == 0:
        return x
    axis = _axis(dim, x.ndim)

    def combine(a, b):
        m = jnp.maximum(a, b)
        m_safe = jnp.where(jnp.isinf(m), jnp.zeros((), m.dtype), m)
        return m_safe + jnp.log(jnp.exp(a - m_safe) + jnp.exp(b - m_safe))

    return lax.associative_scan(combine, x, axis=axis)


@lower(aten.logsumexp.default)
def logsumexp(x, dim, keepdim=False):
    x = _float(x)
    axes = _axes(dim, x.ndim)
    if not axes:
        return x
    m = jnp.max(x, axis=axes, keepdims=True, initial=-jnp.inf)  # over nothing: -inf, as CPU's is
    m = jnp.where(jnp.isinf(m), jnp.zeros((), m.dtype), m)
    out = jnp.log(jnp.sum(jnp.exp(x - m), axis=axes, keepdims=True)) + m
    return out if keepdim else jnp.squeeze(out, axes)


# ---- boolean reductions, counts, norms ------------------------------------------------------------------------


@lower(aten.all.default)
def all_elements(x):
    return jnp.all(x != 0)


@lower(aten.any.default)
def any_element(x):
    return jnp.any(x != 0)


@lower(aten.all.dim, aten.all.dims)
def all_dim(x, dim=None, keepdim=False):
    return jnp.all(x != 0, axis=_axes(dim, x.ndim, empty_means_all=False), keepdims=keepdim)


@lower(aten.any.dim, aten.any.dims)
def any_dim(x, dim=None, keepdim=False):
    return jnp.any(x != 0, axis=_axes(dim, x.ndim, empty_means_all=False), keepdims=keepdim)


@lower(aten.count_nonzero.default, aten.count_nonzero.dim_IntList)
def count_nonzero(x, dim=None):
    return jnp.sum(x != 0, axis=_axes(dim, x.ndim), dtype=jnp.int64)


@lower(aten.linalg_vector_norm.default, static_scalars=True)
def linalg_vector_norm(x, ord=2, dim=None, keepdim=False, *, dtype=None):
    """``ord``: inf/-inf are max/min of |x|, 0 counts nonzeros, else (sum |x|^ord)^(1/ord)."""
    if dtype is not None:
        x = x.astype(dtypes.to_jax(dtype))
    a = jnp.abs(opmath(_float(x)))
    axes = _axes(dim, x.ndim)
    ord = float(ord)
    if ord == float("inf"):
        return jnp.max(a, axis=axes, keepdims=keepdim)
    if ord == float("-inf"):
        return jnp.min(a, axis=axes, keepdims=keepdim)
    if ord == 0:
        return jnp.sum((a != 0).astype(a.dtype), axis=axes, keepdims=keepdim)
    if ord == 1:
        return jnp.sum(a, axis=axes, keepdims=keepdim)
    if ord == 2:
        return jnp.sqrt(jnp.sum(a * a, axis=axes, keepdims=keepdim))
    return jnp.sum(a**ord, axis=axes, keepdims=keepdim) ** (1.0 / ord)


# ---- sorting and selection -------------------------------------------------------------------------------------


def _sort(x, axis: int, descending: bool):
    """Stable sort along ``axis`` with PyTorch's order (NaN largest, -0.0 == 0.0); returns (values, indices).

    Descending keeps equal elements in their original order: sort the reversed array ascending, then reverse."""
    n = x.shape[axis]
    if descending:
        x = lax.rev(x, (axis,))
    key = x.astype(jnp.int8) if x.dtype == jnp.bool_ else x
    if jnp.issubdtype(key.dtype, jnp.floating):
        key = jnp.where(key == 0, jnp.zeros((), key.dtype), key)
        key = jnp.where(jnp.isnan(key), jnp.full((), jnp.nan, key.dtype), key)
    idx = lax.broadcasted_iota(jnp.int64, x.shape, axis)
    _, vals, inds = lax.sort((key, x, idx), dimension=axis, is_stable=True, num_keys=1)
    if descending:
        vals, inds = lax.rev(vals, (axis,)), (n - 1) - lax.rev(inds, (axis,))
    return vals, inds


@lower(aten.sort.default)
def sort(x, dim=-1, descending=False):
    if x.ndim == 0:
        return x, jnp.zeros((), jnp.int64)
    return _sort(x, _axis(dim, x.ndim), descending)


@lower(aten.sort.stable)
def sort_stable(x, *, stable=None, dim=-1, descending=False):
    return sort(x, dim, descending)


@lower(aten.topk.default)
def topk(x, k, dim=-1, largest=True, sorted=True):
    if x.ndim == 0:
        return x, jnp.zeros((), jnp.int64)
    axis = _axis(dim, x.ndim)
    v, i = _sort(x, axis, largest)
    return lax.slice_in_dim(v, 0, k, axis=axis), lax.slice_in_dim(i, 0, k, axis=axis)


@lower(aten.kthvalue.default)
def kthvalue(x, k, dim=-1, keepdim=False):
    if x.ndim == 0:
        return x, jnp.zeros((), jnp.int64)
    axis = _axis(dim, x.ndim)
    v, i = _sort(x, axis, False)
    v, i = jnp.take(v, k - 1, axis=axis), jnp.take(i, k - 1, axis=axis)
    if keepdim:
        v, i = jnp.expand_dims(v, axis), jnp.expand_dims(i, axis)
    return v, i


def _median(x, axis: int, ignore_nan: bool):
    """Lower median along ``axis``. median: any NaN gives the first NaN; nanmedian: median of the non-NaNs."""
    v, i = _sort(x, axis, False)
    n = x.shape[axis]
    if jnp.issubdtype(x.dtype, jnp.inexact):
        nans = jnp.isnan(x)
        cnt = n - jnp.sum(nans, axis=axis, keepdims=True)
        if ignore_nan:
            pos = jnp.maximum((cnt - 1) // 2, 0)
        else:
            first_nan = jnp.argmax(nans, axis=axis, keepdims=True)
            pos = jnp.where(cnt < n, -1, (n - 1) // 2)
    else:
        pos = jnp.full([1 if a == axis else s for a, s in enumerate(x.shape)], (n - 1) // 2)
    pos = pos.astype(jnp.int64)
    mv = jnp.take_along_axis(v, jnp.maximum(pos, 0), axis=axis)
    mi = jnp.take_along_axis(i, jnp.maximum(pos, 0), axis=axis)
    if jnp.issubdtype(x.dtype, jnp.inexact) and not ignore_nan:
        mv = jnp.where(pos < 0, jnp.full((), jnp.nan, x.dtype), mv)
        mi = jnp.where(pos < 0, first_nan.astype(jnp.int64), mi)
    return jnp.squeeze(mv, axis), jnp.squeeze(mi, axis)


def _median_dim(x, dim, keepdim, ignore_nan):
    if x.ndim == 0:
        return x, jnp.zeros((), jnp.int64)
    axis = _axis(dim, x.ndim)
    v, i = _median(x, axis, ignore_nan)
    if keepdim:
        v, i = jnp.expand_dims(v, axis), jnp.expand_dims(i, axis)
    return v, i


def _nothing(x):
    """The median of an empty tensor, as CPU gives it: NaN, cast to ``x``'s dtype (an integer's minimum)."""
    return convert(jnp.full((), jnp.nan), x.dtype)


@lower(aten.median.default)
def median(x):
    return _nothing(x) if x.size == 0 else _median(x.reshape(-1), 0, False)[0]


@lower(aten.nanmedian.default)
def nanmedian(x):
    return _nothing(x) if x.size == 0 else _median(x.reshape(-1), 0, True)[0]


@lower(aten.median.dim)
def median_dim(x, dim, keepdim=False):
    return _median_dim(x, dim, keepdim, False)


@lower(aten.nanmedian.dim)
def nanmedian_dim(x, dim, keepdim=False):
    return _median_dim(x, dim, keepdim, True)


@lower(aten.mode.default)
def mode(x, dim=-1, keepdim=False):
    """Most frequent value (the smallest among equally frequent ones) and the last index where it occurs."""
    if x.ndim == 0:
        return x, jnp.zeros((), jnp.int64)
    axis = _axis(dim, x.ndim)
    xm = jnp.moveaxis(x, axis, -1)
    v, i = _sort(xm, xm.ndim - 1, False)
    pos = lax.broadcasted_iota(jnp.int64, v.shape, v.ndim - 1)
    differs = v[..., 1:] != v[..., :-1]
    true = jnp.ones(v.shape[:-1] + (1,), bool)
    start = jnp.concatenate([true, differs], axis=-1)
    end = jnp.concatenate([differs, true], axis=-1)
    run_start = lax.cummax(jnp.where(start, pos, 0), axis=v.ndim - 1)
    freq = jnp.where(end, pos - run_start + 1, 0)
    best = jnp.argmax(freq, axis=-1, keepdims=True)
    mv = jnp.take_along_axis(v, best, axis=-1)[..., 0]
    mi = jnp.take_along_axis(i, best, axis=-1)[..., 0]
    if keepdim:
        mv, mi = jnp.expand_dims(mv, axis), jnp.expand_dims(mi, axis)
    return mv, mi
