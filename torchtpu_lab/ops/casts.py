"""Casts with PyTorch's CPU semantics where JAX's differ: floats out of an integer dtype's range.

XLA saturates a float it converts to an integer (``300.0`` to uint8 is 255, ``-1.5`` is 0, NaN is 0). PyTorch's
CPU casts as x86 does: a float is truncated toward zero into int64 (for int64 and uint8 results) or int32 (for
int32, int16 and int8), a value outside that range, or NaN, becoming its minimum (``INT64_MIN``/``INT32_MIN``),
and a narrower result keeps the low bits: ``300.0`` to uint8 is 44, ``-1.5`` is 255, ``70000.0`` to int16 is 4464,
``1e10`` to int32 is ``-2**31``. Image code that scales to ``[0, 255]`` and casts sees the difference; NumPy's
``astype`` agrees with CPU. Checked against CPU on float16, bfloat16, float32 and float64 values in
``tests/test_corners.py``. Other unsigned results (uint16/32/64, rare) keep XLA's conversion. ``float8_e4m3fn``,
which has no infinity, saturates at ±448 on CPU, where XLA gives NaN.
"""

from __future__ import annotations

import jax.numpy as jnp
import numpy as np

#: result dtype -> the signed dtype CPU truncates into first
_THROUGH = {np.dtype(np.int64): jnp.int64, np.dtype(np.uint8): jnp.int64, np.dtype(np.int32): jnp.int32,
            np.dtype(np.int16): jnp.int32, np.dtype(np.int8): jnp.int32}


#: float8_e4m3fn has no infinity: CPU's conversion into it saturates (beyond ±448, infinities included, is ±448;
#: NaN stays NaN) where XLA's gives NaN
_E4M3FN, _E4M3FN_MAX = np.dtype(jnp.float8_e4m3fn), 448.0


def convert(x, dtype):
    """``x`` as ``dtype`` (a JAX dtype), cast as PyTorch's CPU casts."""
    dtype = np.dtype(dtype)
    if dtype == _E4M3FN and x.dtype != dtype and x.dtype != jnp.bool_ and not jnp.iscomplexobj(x):
        # through float32, as c10's conversion goes (a float64 rounds twice there too)
        return jnp.clip(x.astype(jnp.float32), -_E4M3FN_MAX, _E4M3FN_MAX).astype(dtype)
    through = _THROUGH.get(dtype)
    if through is None or not jnp.issubdtype(x.dtype, jnp.floating):
        return x.astype(dtype)
    info = jnp.iinfo(through)
    inside = (x >= -(2.0 ** (info.bits - 1))) & (x < 2.0 ** (info.bits - 1))  # NaN is outside
    t = jnp.where(inside, jnp.where(inside, x, 0).astype(through), info.min)
    return t.astype(dtype)  # integer narrowing keeps the low bits
