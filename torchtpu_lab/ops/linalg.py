"""Matrix products and linear algebra (factorizations, solves, decompositions)."""

from __future__ import annotations

import jax.numpy as jnp
import jax.scipy.linalg as jsl
from jax import lax

from .precision import EXACT, HALF_TYPES, matmul_precision, opmath
from .registry import aten, lower


def _mm(a, b, precision=None):
    """``a @ b`` at ``precision`` (default: PyTorch's float32 matmul precision setting), integers exactly."""
    return jnp.matmul(a, b, precision=matmul_precision() if precision is None else precision)


def _scaled(beta, bias, alpha, prod):
    """``beta * bias + alpha * prod``. PyTorch ignores ``bias`` entirely (NaN/inf included) when beta == 0, and
    for integer tensors first converts beta and alpha to the integer type (0.6 becomes 0)."""
    if prod.dtype == jnp.bool_:
        return (bias & (beta != 0)) | (prod & (alpha != 0))
    if _is_one(beta) and _is_one(alpha):  # the usual call (a Linear's bias): no scaling in the program
        return bias + prod
    if jnp.issubdtype(prod.dtype, jnp.integer):
        beta, alpha = jnp.asarray(beta).astype(prod.dtype), jnp.asarray(alpha).astype(prod.dtype)
    scaled_bias = jnp.where(beta == 0, jnp.zeros((), bias.dtype), bias * beta)
    return scaled_bias + prod * alpha


def _is_one(scale) -> bool:
    """A scale known when traced to be 1 (not a graph input)."""
    return type(scale) in (int, float) and scale == 1


# ---- products ---------------------------------------------------------------------------------------------------


@lower(aten.mm.default, aten.bmm.default, aten.mv.default)
def mm(a, b):
    return _mm(a, b)


@lower(aten.dot.default, aten.vdot.default)
def dot(a, b):
    """``vdot`` conjugates its first argument."""
    return jnp.dot(a, b, precision=matmul_precision())


def biased_product(bias, a, b, beta=1, alpha=1):
    """``beta * bias + alpha * (a @ b)``; in half types the product and the bias are added in float32 and rounded
    once, as PyTorch's CPU gemm adds the bias inside its float32 accumulation (rounding the product first is up to
    an ulp off: a bfloat16 ``Linear`` under autocast)."""
    if a.dtype not in HALF_TYPES:
        return _scaled(beta, bias, alpha, _mm(a, b))
    prod = jnp.matmul(a, b, precision=matmul_precision(), preferred_element_type=jnp.float32)
    return _scaled(beta, opmath(bias), alpha, prod).astype(a.dtype)


@lower(aten.addmm.default, aten.addmv.default, aten.baddbmm.default)
def addmm(bias, a, b, *, beta=1, alpha=1):
    return biased_product(bias, a, b, beta, alpha)


@lower(aten.addbmm.default)
def addbmm(bias, a, b, *, beta=1, alpha=1):
    """In half types as PyTorch's CPU kernel adds it: the first batch's product to the scaled bias, then each
    other one to the total, each by an ``addmm_`` that rounds once."""
    if a.dtype not in HALF_TYPES or a.shape[0] == 0:
        return _scaled(beta, bias, alpha, jnp.sum(_mm(a, b), axis=0))
    first = biased_product(jnp.broadcast_to(bias, (a.shape[1], b.shape[2])), a[0], b[0], beta, alpha)

    def add(total, pair):
        return biased_product(total, pair[0], pair[1], 1, alpha), None

    return lax.scan(add, first, (a[1:], b[1:]))[0]


@lower(aten.addr.default)
def addr(bias, u, v, *, beta=1, alpha=1):
    """``beta * bias + alpha * u * v`` in PyTorch's order (``alpha * u`` first), which rounds in half types."""
    if jnp.issubdtype(u.dtype, jnp.inexact):
        return _scaled(beta, bias, 1, (u * alpha)[:, None] * v[None, :])
    return _scaled(beta, bias, alpha, u[:, None] * v[None, :])


# ---- helpers for factorizations ---------------------------------------------------------------------------------


def _mT(x):
    return jnp.swapaxes(x, -1, -2)


def _mH(x):
    return jnp.conj(_mT(x)) if jnp.iscomplexobj(x) else _mT(x)


def _lu(a):
    """LAPACK getrf: packed LU, 1-based int32 pivots, and info (first zero pivot of U, 1-based; 0 if none)."""
    lu, piv, _ = lax.linalg.lu(a)
    k = min(a.shape[-2], a.shape[-1])
    diag = jnp.diagonal(lu, axis1=-2, axis2=-1)[..., :k]
    zero = diag == 0
    if k == 0:
        return lu, (piv + 1).astype(jnp.int32), jnp.zeros(a.shape[:-2], jnp.int32)
    info = jnp.where(jnp.any(zero, axis=-1), jnp.argmax(zero, axis=-1) + 1, 0).astype(jnp.int32)
    return lu, (piv + 1).astype(jnp.int32), info


def _perm_from_pivots(piv, m):
    """Row permutation (as indices) that applying LAPACK pivots (1-based, sequential swaps) produces."""
    batch = piv.shape[:-1]
    perm = jnp.broadcast_to(jnp.arange(m), batch + (m,))
    if piv.shape[-1] == 0:
        return perm

    def swap(i, perm):
        j = piv[..., i].astype(jnp.int32) - 1
        pi = perm[..., i]
        pj = jnp.take_along_axis(perm, j[..., None], axis=-1)[..., 0]
        perm = perm.at[..., i].set(pj)
        return jnp.where(jnp.arange(m) == j[..., None], pi[..., None], perm)

    return lax.fori_loop(0, piv.shape[-1], swap, perm)


def _lu_solve(lu, piv, b, left, adjoint):
    """Solve with a packed LU (of square A): A X = B, A^H X = B, X A = B or X A^H = B."""
    n = lu.shape[-1]
    batch = jnp.broadcast_shapes(lu.shape[:-2], b.shape[:-2])
    lu = jnp.broadcast_to(lu, batch + lu.shape[-2:])
    perm = jnp.broadcast_to(_perm_from_pivots(piv, n), batch + (n,))
    b = jnp.broadcast_to(b, batch + b.shape[-2:])
    if not left:  # X A = B  <=>  A^H X^H = B^H (and X A^H = B <=> A X^H = B^H)
        return _mH(_lu_solve(lu, piv, _mH(b), True, not adjoint))
    tri = lax.linalg.triangular_solve
    if not adjoint:  # P A = L U: A X = B  <=>  L U X = P B
        pb = jnp.take_along_axis(b, perm[..., :, None], axis=-2)
        y = tri(lu, pb, left_side=True, lower=True, unit_diagonal=True)
        return tri(lu, y, left_side=True, lower=False)
    # A^H = U^H L^H P: solve U^H y = B, L^H z = y, X = P^T z
    y = tri(lu, b, left_side=True, lower=False, transpose_a=True, conjugate_a=True)
    z = tri(lu, y, left_side=True, lower=True, unit_diagonal=True, transpose_a=True, conjugate_a=True)
    inv = jnp.argsort(perm, axis=-1)
    return jnp.take_along_axis(z, inv[..., :, None], axis=-2)


def _det_from_lu(lu, piv):
    n = lu.shape[-1]
    diag = jnp.diagonal(lu, axis1=-2, axis2=-1)
    odd = jnp.sum(piv != jnp.arange(1, n + 1, dtype=piv.dtype), axis=-1) % 2
    sign = jnp.where(odd == 1, -1, 1).astype(lu.dtype)
    return sign, diag


# ---- determinants, inverses, solves -----------------------------------------------------------------------------


@lower(aten._linalg_det.default)
def linalg_det(a):
    lu, piv, _ = _lu(a)
    sign, diag = _det_from_lu(lu, piv)
    return sign * jnp.prod(diag, axis=-1), lu, piv


@lower(aten._linalg_slogdet.default)
def linalg_slogdet(a):
    lu, piv, _ = _lu(a)
    sign, diag = _det_from_lu(lu, piv)
    s = sign * jnp.prod(jnp.sign(diag), axis=-1)
    return s, jnp.sum(jnp.log(jnp.abs(diag)), axis=-1), lu, piv


@lower(aten.linalg_lu_factor_ex.default)
def linalg_lu_factor_ex(a, *, pivot=True, check_errors=False):
    if not pivot:
        raise NotImplementedError("torchtpu_lab: linalg_lu_factor_ex(pivot=False) is not supported")
    return _lu(a)


@lower(aten.linalg_lu_solve.default)
def linalg_lu_solve(lu, piv, b, *, left=True, adjoint=False):
    return _lu_solve(lu, piv, b, left, adjoint)


@lower(aten.lu_unpack.default)
def lu_unpack(lu, piv, unpack_data=True, unpack_pivots=True):
    m, n = lu.shape[-2:]
    k = min(m, n)
    if unpack_data:
        l = jnp.tril(lu[..., :, :k], -1) + jnp.eye(m, k, dtype=lu.dtype)
        u = jnp.triu(lu[..., :k, :])
    else:
        l = jnp.zeros((0,), lu.dtype)
        u = jnp.zeros((0,), lu.dtype)
    if unpack_pivots:
        perm = _perm_from_pivots(piv, m)  # (P A)[i] = A[perm[i]], and A = P^T L U: P^T[perm[i], i] = 1
        p = (perm[..., None, :] == jnp.arange(m)[:, None]).astype(lu.dtype)
    else:
        p = jnp.zeros((0,), lu.dtype)
    return p, l, u


@lower(aten.linalg_lu.default)
def linalg_lu(a, *, pivot=True):
    if not pivot:
        raise NotImplementedError("torchtpu_lab: linalg_lu(pivot=False) is not supported")
    lu, piv, _ = _lu(a)
    return lu_unpack(lu, piv)


@lower(aten.linalg_inv_ex.default)
def linalg_inv_ex(a, *, check_errors=False):
    lu, piv, info = _lu(a)
    eye = jnp.broadcast_to(jnp.eye(a.shape[-1], dtype=a.dtype), a.shape)
    return _lu_solve(lu, piv, eye, True, False), info


def _solve_is_vector(a, b):
    return b.ndim == 1 or (b.ndim == a.ndim - 1 and b.shape == a.shape[:-1])


@lower(aten._linalg_solve_ex.default)
def linalg_solve_ex(a, b, *, left=True, check_errors=False):
    """Returns A's LU and pivots too (the backward pass solves with them), as PyTorch's CPU kernel does."""
    lu, piv, info = _lu(a)
    vec = _solve_is_vector(a, b)
    bm = b[..., None] if vec else b
    x = _lu_solve(lu, piv, bm, left, False)
    return (x[..., 0] if vec else x), lu, piv, info


@lower(aten.linalg_solve_triangular.default)
def linalg_solve_triangular(a, b, *, upper, left=True, unitriangular=False):
    batch = jnp.broadcast_shapes(a.shape[:-2], b.shape[:-2])
    a = jnp.broadcast_to(a, batch + a.shape[-2:])
    b = jnp.broadcast_to(b, batch + b.shape[-2:])
    return lax.linalg.triangular_solve(a, b, left_side=left, lower=not upper, unit_diagonal=unitriangular)


@lower(aten.triangular_solve.default)
def triangular_solve(b, a, upper=True, transpose=False, unitriangular=False):
    batch = jnp.broadcast_shapes(a.shape[:-2], b.shape[:-2])
    a = jnp.broadcast_to(a, batch + a.shape[-2:])
    b = jnp.broadcast_to(b, batch + b.shape[-2:])
    x = lax.linalg.triangular_solve(
        a, b, left_side=True, lower=not upper, unit_diagonal=unitriangular, transpose_a=transpose
    )
    return x, a


# ---- Cholesky ---------------------------------------------------------------------------------------------------


def _chol_info(a, l):
    """LAPACK potrf's info: order of the first leading minor that is not positive definite (0: success).

    Only computed (with an unblocked factorization) when the fast factorization failed somewhere."""
    failed = jnp.any(jnp.isnan(jnp.diagonal(l, axis1=-2, axis2=-1)))
    n = a.shape[-1]
    if n == 0:
        return jnp.zeros(a.shape[:-2], jnp.int32)

    def slow(a):
        def step(j, carry):
            l, info = carry
            d = a[..., j, j] - jnp.sum(l[..., j, :] * jnp.conj(l[..., j, :]), axis=-1)
            d = d.real if jnp.iscomplexobj(d) else d
            bad = ~(d > 0)
            info = jnp.where((info == 0) & bad, j + 1, info)
            ljj = jnp.sqrt(jnp.where(bad, 1, d)).astype(a.dtype)
            col = (a[..., :, j] - jnp.einsum("...ik,...k->...i", l, jnp.conj(l[..., j, :]), precision=EXACT)) / ljj[
                ..., None
            ]
            col = jnp.where(jnp.arange(n) > j, col, 0)
            col = jnp.where(jnp.arange(n) == j, ljj[..., None], col)
            return l.at[..., :, j].set(col), info

        zeros = jnp.zeros(a.shape[:-2], jnp.int32)
        return lax.fori_loop(0, n, step, (jnp.zeros_like(a), zeros))[1]

    return lax.cond(failed, slow, lambda a: jnp.zeros(a.shape[:-2], jnp.int32), a)


def _cholesky(a, upper):
    l = lax.linalg.cholesky(a, symmetrize_input=False)
    return l, _mH(l) if upper else l


@lower(aten.linalg_cholesky_ex.default)
def linalg_cholesky_ex(a, *, upper=False, check_errors=False):
    """On failure LAPACK leaves a partial factor; JAX gives NaNs. ``info`` matches LAPACK either way."""
    l, out = _cholesky(a, upper)
    return out, _chol_info(a, l)


if hasattr(aten, "cholesky"):  # gone in torch 2.14 (torch.cholesky decomposes to linalg_cholesky_ex there)
    @lower(aten.cholesky.default)
    def cholesky(a, upper=False):
        return _cholesky(a, upper)[1]


def _cho_solve(b, f, upper):
    batch = jnp.broadcast_shapes(f.shape[:-2], b.shape[:-2])
    f = jnp.broadcast_to(f, batch + f.shape[-2:])
    b = jnp.broadcast_to(b, batch + b.shape[-2:])
    l = _mH(f) if upper else f
    tri = lax.linalg.triangular_solve
    y = tri(l, b, left_side=True, lower=True)
    return tri(l, y, left_side=True, lower=True, transpose_a=True, conjugate_a=True)


@lower(aten.cholesky_solve.default)
def cholesky_solve(b, f, upper=False):
    return _cho_solve(b, f, upper)


@lower(aten.cholesky_inverse.default)
def cholesky_inverse(f, upper=False):
    eye = jnp.broadcast_to(jnp.eye(f.shape[-1], dtype=f.dtype), f.shape)
    return _cho_solve(eye, f, upper)


# ---- QR, SVD, eigh ----------------------------------------------------------------------------------------------


@lower(aten.linalg_qr.default)
def linalg_qr(a, mode="reduced"):
    if mode == "r":
        return jnp.zeros((0,), a.dtype), jnp.linalg.qr(a, mode="r")
    q, r = jnp.linalg.qr(a, mode="complete" if mode == "complete" else "reduced")
    return q, r


@lower(aten._linalg_svd.default)
def linalg_svd(a, full_matrices=False, compute_uv=True, *, driver=None):
    """Singular vectors are unique only up to sign (phase); they match LAPACK's gesdd where JAX uses it."""
    if not compute_uv:
        s = jnp.linalg.svd(a, compute_uv=False)
        return jnp.zeros((0,), a.dtype), s, jnp.zeros((0,), a.dtype)
    u, s, vh = jnp.linalg.svd(a, full_matrices=full_matrices)
    return u, s, vh


@lower(aten._linalg_eigh.default)
def linalg_eigh(a, UPLO="L", compute_v=True):
    """Reads only the ``UPLO`` triangle, as LAPACK does. Eigenvectors are unique only up to sign."""
    w, v = jnp.linalg.eigh(a, UPLO=UPLO, symmetrize_input=False)
    return w, (v if compute_v else jnp.zeros((0,), a.dtype))


@lower(aten.linalg_matrix_exp.default)
def linalg_matrix_exp(a):
    """Half types in float32 (JAX's ``expm`` has no half-type form), rounded once."""
    if not a.shape[-1]:
        return a
    return jsl.expm(opmath(a)).astype(a.dtype)


# ---- least squares, Householder products, eig -------------------------------------------------------------------


@lower(aten.linalg_lstsq.default, jit=False)
def linalg_lstsq(a, b, rcond=None, *, driver=None):
    """Minimum-norm solution through the SVD (what gelsy/gelsd/gelss compute; gels assumes full rank). The
    other outputs follow the driver as on PyTorch's CPU: ``rank`` for gelsy/gelsd/gelss (singular values above
    ``rcond * s_max``), singular values for gelsd/gelss, and residuals only when m > n (for gelsd/gelss only if
    every matrix has full rank) — hence not jitted."""
    driver = driver or "gelsy"
    m, n = a.shape[-2:]
    vec = b.ndim == a.ndim - 1
    bm = b[..., None] if vec else b
    batch = jnp.broadcast_shapes(a.shape[:-2], bm.shape[:-2])
    a = jnp.broadcast_to(a, batch + a.shape[-2:])
    bm = jnp.broadcast_to(bm, batch + bm.shape[-2:])
    real = jnp.finfo(a.dtype).dtype
    if rcond is None or rcond < 0:
        rcond = float(jnp.finfo(a.dtype).eps) * max(m, n)
    u, s, vh = jnp.linalg.svd(a, full_matrices=False)
    keep = s > (rcond * jnp.max(s, axis=-1, keepdims=True, initial=0) if driver != "gels" else 0)
    inv = jnp.where(keep, 1 / jnp.where(keep, s, 1), 0).astype(a.dtype)
    x = _mm(_mH(vh), inv[..., :, None] * _mm(_mH(u), bm, EXACT), EXACT)
    rank = jnp.sum(keep, axis=-1).astype(jnp.int64)
    residuals = jnp.zeros((0,), real)
    if m > n and driver != "gelsy" and (driver == "gels" or bool(jnp.all(rank == n))):
        residuals = jnp.sum(jnp.abs(_mm(a, x, EXACT) - bm) ** 2, axis=-2)  # (..., k), k = 1 for a vector b
    if driver == "gels":
        rank = jnp.zeros((0,), jnp.int64)
    sv = s.astype(real) if driver in ("gelsd", "gelss") else jnp.zeros((0,), real)
    return (x[..., 0] if vec else x), residuals, rank, sv


@lower(aten.linalg_householder_product.default)
def linalg_householder_product(a, tau):
    return lax.linalg.householder_product(a, tau)


@lower(aten.geqrf.default)
def geqrf(a):
    """LAPACK geqrf (JAX's CPU backend calls the same routine): R above the diagonal, reflectors below, and tau."""
    from jax._src.lax.linalg import geqrf as _geqrf  # not re-exported by jax.lax.linalg

    return _geqrf(a)


@lower(aten.ormqr.default)
def ormqr(a, tau, c, left=True, transpose=False):
    batch = jnp.broadcast_shapes(a.shape[:-2], c.shape[:-2])
    a = jnp.broadcast_to(a, batch + a.shape[-2:])
    tau = jnp.broadcast_to(tau, batch + tau.shape[-1:])
    c = jnp.broadcast_to(c, batch + c.shape[-2:])
    return lax.linalg.ormqr(a, tau, c, left=left, transpose=transpose)


def _eig(a, vectors):
    """LAPACK geev (JAX's CPU backend; no TPU implementation): complex eigenvalues and unit-norm eigenvectors
    whose largest component is real, the same normalization PyTorch's CPU kernel gets from geev."""
    out = lax.linalg.eig(a, compute_left_eigenvectors=False, compute_right_eigenvectors=vectors)
    return out[0], (out[1] if vectors else None)


@lower(aten.linalg_eig.default)
def linalg_eig(a):
    return _eig(a, True)


@lower(aten._linalg_eigvals.default)
def linalg_eigvals(a):
    return _eig(a, False)[0]
