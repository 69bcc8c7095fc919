"""Softmax (incl. ``_safe_softmax``), pointwise activations and their backward ops. Lowerings (pure JAX).

``rrelu_with_noise`` mutates its ``noise`` argument, so it is a torch-level kernel in :mod:`.torch_kernels`.
"""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp
from jax import lax

from ..error_flags import report, reports
from ..precision import HALF_TYPES, in_opmath
from ..registry import aten, lower, wrap_dim
from ._common import _acc


# ---- softmax -----------------------------------------------------------------------------------------------------


def _along(fn, x, dim):
    """Apply ``fn(x, axis)`` along ``dim``, treating a 0-dim ``x`` as one element; a ``dim`` out of range raises
    PyTorch's ``IndexError`` (its meta kernels do not check it, and a wrapped dim would be a wrong answer)."""
    wrap_dim(dim, x.ndim)
    if x.ndim == 0:
        return fn(x.reshape(1), 0).reshape(())
    return fn(x, dim % x.ndim)


@lower(aten._softmax)
def softmax(x, dim, half_to_float):
    """In float32, rounded once. (Along another dim than the last, CPU's kernel for a half-type ``x`` computes
    runs of a vector's width across the inner dims so, and rounds each ``exp`` first in the scalar tail of a
    thread's share: which elements take which path depends on CPU's thread count and vector ISA.)"""
    return _along(lambda v, a: jax.nn.softmax(_acc(v), axis=a), x, dim)


def _half_along_last(x, dim, half_to_float) -> bool:
    """Whether CPU's last-dim kernel runs for a half-type ``x`` (its other kernel keeps other buffers)."""
    return x.dtype in HALF_TYPES and not half_to_float and dim % max(x.ndim, 1) == max(x.ndim, 1) - 1


@lower(aten._log_softmax)
def log_softmax(x, dim, half_to_float):
    """``(x - max) - log(sum(exp(x - max)))`` in float32. Along the last dim of a half-type ``x`` CPU's kernel
    keeps the sum in a buffer of that type, and the log it then takes in place: both are rounded to it here too
    (bit-equal with CPU; rounding only the log left ~5 % of the elements an ulp off). Along another dim CPU keeps
    float32 throughout, as this does."""
    half = _half_along_last(x, dim, half_to_float)

    def fn(v, a):
        def kept(t):
            return t.astype(v.dtype).astype(t.dtype) if half else t

        shifted = _acc(v) - lax.stop_gradient(jnp.max(_acc(v), axis=a, keepdims=True, initial=-jnp.inf))
        return shifted - kept(jnp.log(kept(jnp.sum(jnp.exp(shifted), axis=a, keepdims=True))))

    return _along(fn, x, dim)


@lower(aten._softmax_backward_data)
def softmax_backward_data(grad, out, dim, input_dtype):
    def fn(g, a):
        g, y = _acc(g), _acc(out.reshape(g.shape))  # in float32 for half types, rounded once (as on CPU)
        return y * (g - jnp.sum(g * y, axis=a, keepdims=True))

    return _along(fn, grad, dim)


@lower(aten._log_softmax_backward_data)
def log_softmax_backward_data(grad, out, dim, input_dtype):
    def fn(g, a):
        g = _acc(g)
        return g - jnp.exp(_acc(out.reshape(g.shape))) * jnp.sum(g, axis=a, keepdims=True)

    return _along(fn, grad, dim)


@lower(aten._safe_softmax)
def safe_softmax(x, dim, dtype=None):
    """Softmax whose rows that are entirely ``-inf`` give zeros instead of NaN (attention over no keys)."""

    def fn(v, a):
        v = _acc(v) if dtype is None else v.astype(jnp.promote_types(v.dtype, jnp.float32))
        dead = jnp.all(v == -jnp.inf, axis=a, keepdims=True)
        return jnp.where(dead, jnp.zeros((), v.dtype), jax.nn.softmax(v, axis=a))

    return _along(fn, x, dim)


# ---- activations and their backward helpers ------------------------------------------------------------------


@lower(aten.relu)
def relu(x):
    return jnp.maximum(x, jnp.zeros((), x.dtype)) if x.dtype != jnp.bool_ else x


@lower(aten.sigmoid_backward)
def sigmoid_backward(grad, y):
    """CPU computes a bfloat16 gradient in float32, a float16 one in float16 (each product rounded)."""
    if y.dtype == jnp.bfloat16:
        grad, y = _acc(grad), _acc(y)
    return grad * (1 - y) * y


@lower(aten.tanh_backward)
@in_opmath
def tanh_backward(grad, y):
    return grad * (1 - y * y)


@lower(aten.logit_backward)
def logit_backward(grad, x, eps=None):
    g = grad / (x * (1 - x))
    if eps is None:
        return jnp.where((x < 0) | (x > 1), jnp.nan, g)
    return jnp.where((x < eps) | (x > 1 - eps), 0.0, g)


@lower(aten.threshold)
@in_opmath
def threshold(x, threshold, value):
    return jnp.where(x <= threshold, value, x)


@lower(aten.threshold_backward)
def threshold_backward(grad, x, threshold):
    return jnp.where(x <= threshold, jnp.zeros((), grad.dtype), grad)


_SQRT_2_OVER_PI = math.sqrt(2.0 / math.pi)


@lower(aten.gelu)
@in_opmath
def gelu(x, *, approximate="none"):
    if approximate == "tanh":
        return 0.5 * x * (1 + jnp.tanh(_SQRT_2_OVER_PI * (x + 0.044715 * x * x * x)))
    return 0.5 * x * (1 + lax.erf(x * (1 / math.sqrt(2.0))))


@lower(aten.gelu_backward)
@in_opmath
def gelu_backward(grad, x, *, approximate="none"):
    if approximate == "tanh":
        inner = _SQRT_2_OVER_PI * (x + 0.044715 * x * x * x)
        t = jnp.tanh(inner)
        d = 0.5 * (1 + t) + 0.5 * x * (1 - t * t) * _SQRT_2_OVER_PI * (1 + 3 * 0.044715 * x * x)
        return grad * d
    cdf = 0.5 * (1 + lax.erf(x * (1 / math.sqrt(2.0))))
    pdf = jnp.exp(-0.5 * x * x) * (1 / math.sqrt(2 * math.pi))
    return grad * (cdf + x * pdf)


@lower(aten.silu)
@in_opmath
def silu(x):
    return x * jax.nn.sigmoid(x)


@lower(aten.silu_backward)
@in_opmath
def silu_backward(grad, x):
    s = jax.nn.sigmoid(x)
    return grad * s * (1 + x * (1 - s))


@lower(aten.mish)
@in_opmath
def mish(x):
    return x * jnp.tanh(jax.nn.softplus(x))


@lower(aten.mish_backward)
@in_opmath
def mish_backward(grad, x):
    """CPU's kernel, in float32 (PyTorch's decomposition would round each of its ops to a half type)."""
    t = jnp.tanh(jax.nn.softplus(x))
    return grad * (t + x * jax.nn.sigmoid(x) * (1 - t * t))


@lower(aten.hardtanh)
def hardtanh(x, min_val=-1, max_val=1):
    return jnp.minimum(jnp.maximum(x, min_val), max_val).astype(x.dtype)


@lower(aten.hardtanh_backward)
def hardtanh_backward(grad, x, min_val, max_val):
    return jnp.where((x <= min_val) | (x >= max_val), jnp.zeros((), grad.dtype), grad)


@lower(aten.leaky_relu)
@in_opmath
def leaky_relu(x, negative_slope=0.01):
    return jnp.where(x > 0, x, x * negative_slope)


_IN_PLACE_NEGATIVE = ("In-place {op} backward calculation is triggered with a negative slope which is not supported. "
                      "This is caused by calling in-place forward function with a negative slope, please call "
                      "out-of-place version instead.")


def _in_place_slope_is_not_negative(op: str, slope, suffix: str = "") -> None:
    """CPU's check in the backward of an in-place ``elu_``/``leaky_relu_`` (``is_result``): from the result alone
    the gradient of a negative slope cannot be told apart (``x`` and the result have opposite signs), so CPU
    refuses rather than return a wrong gradient. The slope is a graph input: the error is reported."""
    report(jnp.asarray(slope) < 0, error=RuntimeError, message=_IN_PLACE_NEGATIVE.format(op=op) + suffix)


@lower(aten.leaky_relu_backward)
@reports
@in_opmath
def leaky_relu_backward(grad, x, negative_slope, self_is_result):
    if self_is_result:
        _in_place_slope_is_not_negative("leakyReLu", negative_slope,
                                        " File an issue at https://github.com/pytorch/pytorch if you do require "
                                        "supporting in-place leakRelu backward calculation with negative slope")
    return jnp.where(x > 0, grad, grad * negative_slope)


@lower(aten.elu)
@in_opmath
def elu(x, alpha=1, scale=1, input_scale=1):
    return jnp.where(x > 0, x * scale, alpha * scale * jnp.expm1(x * input_scale))


@lower(aten.elu_backward)
@reports
@in_opmath
def elu_backward(grad, alpha, scale, input_scale, is_result, self_or_result):
    y = self_or_result
    if is_result:
        _in_place_slope_is_not_negative("elu", alpha)
        return jnp.where(y <= 0, grad * input_scale * (y + alpha * scale), grad * scale)
    return jnp.where(y <= 0, grad * input_scale * alpha * scale * jnp.exp(y * input_scale), grad * scale)


@lower(aten.softplus)
@in_opmath
def softplus(x, beta=1, threshold=20):
    xb = x * beta
    return jnp.where(xb > threshold, x, jnp.log1p(jnp.exp(xb)) / beta)


@lower(aten.softplus_backward)
@in_opmath
def softplus_backward(grad, x, beta, threshold):
    xb = x * beta
    z = jnp.exp(jnp.minimum(xb, threshold))  # CPU's z / (z + 1), not a sigmoid: the same rounding
    return jnp.where(xb > threshold, grad, grad * z / (z + 1))


@lower(aten.hardswish)
@in_opmath
def hardswish(x):
    return x * jnp.clip(x + 3, 0, 6) / 6


@lower(aten.hardswish_backward)
@in_opmath
def hardswish_backward(grad, x):
    return jnp.where(x < -3, jnp.zeros((), grad.dtype), jnp.where(x <= 3, grad * (x / 3 + 0.5), grad))


@lower(aten.hardsigmoid)
@in_opmath
def hardsigmoid(x):
    return jnp.clip(x + 3, 0, 6) / 6


@lower(aten.hardsigmoid_backward)
@in_opmath
def hardsigmoid_backward(grad, x):
    return jnp.where((x > -3) & (x < 3), grad / 6, jnp.zeros((), grad.dtype))


@lower(aten.hardshrink)
def hardshrink(x, lambd=0.5):
    return jnp.where((x >= -lambd) & (x <= lambd), jnp.zeros((), x.dtype), x)


@lower(aten.hardshrink_backward)
def hardshrink_backward(grad, x, lambd):
    return jnp.where((x >= -lambd) & (x <= lambd), jnp.zeros((), grad.dtype), grad)


@lower(aten.softshrink)
@in_opmath
def softshrink(x, lambd=0.5):
    return jnp.where(x > lambd, x - lambd, jnp.where(x < -lambd, x + lambd, jnp.zeros((), x.dtype)))


@lower(aten.softshrink_backward)
def softshrink_backward(grad, x, lambd):
    return jnp.where((x >= -lambd) & (x <= lambd), jnp.zeros((), grad.dtype), grad)


@lower(aten.log_sigmoid_forward)
@in_opmath
def log_sigmoid_forward(x):
    z = jnp.exp(-jnp.abs(x))
    return jnp.minimum(x, 0) - jnp.log1p(z), z


@lower(aten.log_sigmoid_backward)
@in_opmath
def log_sigmoid_backward(grad, x, buffer):
    z = jnp.exp(-jnp.abs(x))
    return grad * jnp.where(x < 0, 1 - z / (1 + z), z / (1 + z))


@lower(aten.glu)
def glu(x, dim=-1):
    a, b = jnp.split(x, 2, axis=dim)
    return a * jax.nn.sigmoid(b)


@lower(aten.glu_backward)
def glu_backward(grad, x, dim):
    a, b = jnp.split(x, 2, axis=dim)
    sb = jax.nn.sigmoid(b)
    return jnp.concatenate([grad * sb, grad * a * sb * (1 - sb)], axis=dim)


@lower(aten._prelu_kernel)
def prelu_kernel(x, weight):
    return jnp.where(x > 0, x, weight * x)


@lower(aten._prelu_kernel_backward)
def prelu_kernel_backward(grad, x, weight):
    """The weight gradient keeps the broadcast shape: autograd sums it down to the weight's shape."""
    gi = jnp.where(x > 0, grad, weight * grad)
    gw = jnp.where(x > 0, jnp.zeros((), grad.dtype), x * grad)
    return gi, gw
