"""The one mapping between torch dtypes and JAX dtypes, and host transfers that respect it."""

from __future__ import annotations

import jax.numpy as jnp
import ml_dtypes
import numpy as np
import torch

from . import platform

_TORCH_TO_JAX = {
    torch.float32: jnp.float32,
    torch.float64: jnp.float64,
    torch.float16: jnp.float16,
    torch.bfloat16: jnp.bfloat16,
    torch.int8: jnp.int8,
    torch.int16: jnp.int16,
    torch.int32: jnp.int32,
    torch.int64: jnp.int64,
    torch.uint8: jnp.uint8,
    torch.uint16: jnp.uint16,
    torch.uint32: jnp.uint32,
    torch.uint64: jnp.uint64,
    torch.bool: jnp.bool_,
    torch.complex64: jnp.complex64,
    torch.complex128: jnp.complex128,
    torch.float8_e4m3fn: jnp.float8_e4m3fn,
    torch.float8_e5m2: jnp.float8_e5m2,
    # no infinities and one NaN (the negative zero's bits): JAX's conversions into them are bit for bit CPU's
    torch.float8_e4m3fnuz: jnp.float8_e4m3fnuz,
    torch.float8_e5m2fnuz: jnp.float8_e5m2fnuz,
}
_JAX_TO_TORCH = {np.dtype(v): k for k, v in _TORCH_TO_JAX.items()}
#: PyTorch's C++ names for dtypes (``c10::toString(ScalarType)``), which its error messages use
_SCALAR_NAMES = {
    torch.float32: "Float", torch.float64: "Double", torch.float16: "Half", torch.bfloat16: "BFloat16",
    torch.int64: "Long", torch.int32: "Int", torch.int16: "Short", torch.int8: "Char", torch.uint8: "Byte",
    torch.bool: "Bool", torch.complex64: "ComplexFloat", torch.complex128: "ComplexDouble",
}
_WIDE = {torch.float64, torch.int64, torch.uint64, torch.complex128}


class UnsupportedDtype(RuntimeError):
    """A dtype the tpu device cannot hold. A RuntimeError, as PyTorch's own refusals of a dtype are: a TypeError
    raised inside ``x + y`` is turned by torch's operator wrappers into "unsupported operand type(s) for +",
    which hides the dtype (``float16 + 1j`` is complex32)."""


def to_jax(dtype: torch.dtype) -> np.dtype:
    """The JAX dtype for a torch dtype; raises :class:`UnsupportedDtype` for dtypes the device cannot hold."""
    try:
        jdt = _TORCH_TO_JAX[dtype]
    except KeyError:
        raise UnsupportedDtype(f"dtype {dtype} is not supported on the tpu device") from None
    if dtype in _WIDE and not platform.x64_enabled():
        raise UnsupportedDtype(
            f"dtype {dtype} needs JAX's x64 mode, which TORCHTPU_LAB_X64=0 turned off; "
            "unset it or use a 32-bit dtype"
        )
    return np.dtype(jdt)


def to_torch(dtype) -> torch.dtype:
    """The torch dtype for a JAX/numpy dtype."""
    try:
        return _JAX_TO_TORCH[np.dtype(dtype)]
    except KeyError:
        raise TypeError(f"JAX dtype {dtype} has no torch equivalent") from None


def scalar_names() -> tuple[str, ...]:
    """Every dtype name :func:`scalar_name` gives ("Float", "Long", ...)."""
    return tuple(_SCALAR_NAMES.values())


#: The dtypes' C++ type names as ``caffe2::TypeMeta`` prints them in CPU's messages ("from is out of bounds for
#: signed char", "inferred dtype c10::complex<float>")
TYPE_META_NAMES = {torch.bool: "bool", torch.uint8: "unsigned char", torch.int8: "signed char",
                   torch.int16: "short int", torch.int32: "int", torch.int64: "long int", torch.float16: "c10::Half",
                   torch.bfloat16: "c10::BFloat16", torch.float32: "float", torch.float64: "double",
                   torch.complex64: "c10::complex<float>", torch.complex128: "c10::complex<double>"}


def scalar_name(dtype) -> str:
    """PyTorch's C++ name for a torch or JAX dtype ("Double"), as its error messages print it."""
    if not isinstance(dtype, torch.dtype):
        dtype = to_torch(dtype)
    return _SCALAR_NAMES.get(dtype, str(dtype))


#: dtypes numpy lacks, read as integers of their width and reinterpreted as ml_dtypes' types
_AS_BITS = {torch.bfloat16: (torch.int16, ml_dtypes.bfloat16),
            torch.float8_e4m3fn: (torch.uint8, ml_dtypes.float8_e4m3fn),
            torch.float8_e5m2: (torch.uint8, ml_dtypes.float8_e5m2),
            torch.float8_e4m3fnuz: (torch.uint8, ml_dtypes.float8_e4m3fnuz),
            torch.float8_e5m2fnuz: (torch.uint8, ml_dtypes.float8_e5m2fnuz)}


def host_array(t: torch.Tensor) -> np.ndarray:
    """A numpy view of a CPU tensor's values, reinterpreting dtypes numpy lacks (bfloat16, float8).

    Read through DLPack, not ``Tensor.numpy()``: PyTorch marks a storage it hands to numpy as never resizable
    again, so a user's tensor moved to the device (``x.to("tpu")``) would refuse ``x.resize_(n)`` afterwards."""
    t = t.detach().resolve_conj().resolve_neg()
    bits = _AS_BITS.get(t.dtype)
    if bits is not None:
        return np.from_dlpack(t.view(bits[0])).view(bits[1])
    if t.dtype not in _TORCH_TO_JAX:  # complex32 and the rest: the device's refusal, not numpy's TypeError
        to_jax(t.dtype)
    return np.from_dlpack(t)


def host_tensor(a: np.ndarray, dtype: torch.dtype) -> torch.Tensor:
    """A CPU tensor owning a copy of a host array that came back from the device.

    The copy goes into memory PyTorch allocated, not numpy's (``torch.from_numpy``): such a tensor's storage is
    resizable, as any CPU tensor PyTorch makes, so ``x.cpu().resize_(n)`` and an ``out=`` argument the CPU
    fallback resizes work as after ``.cpu()`` of a CUDA tensor."""
    out = torch.empty(np.shape(a), dtype=dtype)
    if out.numel():
        host_array(out)[...] = a
    return out
