"""Create the bare PrivateUse1 TensorImpl behind a tpu tensor, on any ``tpu:i``.

``torch._C._acc.create_empty_tensor`` (the pure-Python backend API) always makes ``tpu:0``. For ``tpu:i`` with
``i > 0`` we hand PyTorch a DLPack capsule whose device is ``kDLExtDev``/``i``, which PyTorch imports as a
PrivateUse1 tensor on device ``i``. The capsule's data pointer is a small dummy buffer: tpu tensors keep their
values in JAX arrays, and no kernel ever dereferences a PrivateUse1 pointer except ours, which never do. The
DLManagedTensor block is ``malloc``-ed and handed to PyTorch with libc's ``free`` as its deleter, so it lives
exactly as long as the tensor's storage.
"""

from __future__ import annotations

import ctypes

import torch


class _DLDevice(ctypes.Structure):
    _fields_ = [("device_type", ctypes.c_int), ("device_id", ctypes.c_int)]


class _DLDataType(ctypes.Structure):
    _fields_ = [("code", ctypes.c_uint8), ("bits", ctypes.c_uint8), ("lanes", ctypes.c_uint16)]


class _DLTensor(ctypes.Structure):
    _fields_ = [
        ("data", ctypes.c_void_p),
        ("device", _DLDevice),
        ("ndim", ctypes.c_int),
        ("dtype", _DLDataType),
        ("shape", ctypes.POINTER(ctypes.c_int64)),
        ("strides", ctypes.POINTER(ctypes.c_int64)),
        ("byte_offset", ctypes.c_uint64),
    ]


class _DLManagedTensor(ctypes.Structure):
    _fields_ = [("dl_tensor", _DLTensor), ("manager_ctx", ctypes.c_void_p), ("deleter", ctypes.c_void_p)]


_K_DL_EXT_DEV = 12
_INT, _UINT, _FLOAT, _BFLOAT, _COMPLEX, _BOOL = 0, 1, 2, 4, 5, 6
_DL_DTYPES = {
    torch.float32: (_FLOAT, 32), torch.float64: (_FLOAT, 64), torch.float16: (_FLOAT, 16),
    torch.bfloat16: (_BFLOAT, 16), torch.int8: (_INT, 8), torch.int16: (_INT, 16), torch.int32: (_INT, 32),
    torch.int64: (_INT, 64), torch.uint8: (_UINT, 8), torch.uint16: (_UINT, 16), torch.uint32: (_UINT, 32),
    torch.uint64: (_UINT, 64), torch.bool: (_BOOL, 8), torch.complex64: (_COMPLEX, 64),
    torch.complex128: (_COMPLEX, 128),
}

_libc = ctypes.CDLL(None)
_libc.malloc.restype = ctypes.c_void_p
_libc.malloc.argtypes = [ctypes.c_size_t]
_FREE = ctypes.cast(_libc.free, ctypes.c_void_p).value
_SIZE = ctypes.sizeof(_DLManagedTensor)
_DUMMY = ctypes.create_string_buffer(64)
_capsule_new = ctypes.pythonapi.PyCapsule_New
_capsule_new.restype = ctypes.py_object
_capsule_new.argtypes = [ctypes.c_void_p, ctypes.c_char_p, ctypes.c_void_p]


def _on_device(size, dtype: torch.dtype, index: int) -> torch.Tensor:
    try:
        code, bits = _DL_DTYPES[dtype]
    except KeyError:
        raise TypeError(f"dtype {dtype} is supported on tpu:0 only") from None
    shape = (ctypes.c_int64 * max(len(size), 1))(*size)
    addr = _libc.malloc(_SIZE)
    managed = _DLManagedTensor.from_address(addr)
    managed.dl_tensor = _DLTensor(
        ctypes.addressof(_DUMMY), _DLDevice(_K_DL_EXT_DEV, index), len(size), _DLDataType(code, bits, 1), shape,
        None, 0,
    )
    managed.manager_ctx = None
    managed.deleter = _FREE
    return torch.utils.dlpack.from_dlpack(_capsule_new(addr, b"dltensor", None))


def dummy_address() -> int:
    """The data pointer every tpu storage reports: a small buffer nothing reads."""
    return ctypes.addressof(_DUMMY)


def new_impl(size, dtype: torch.dtype, index: int) -> torch.Tensor:
    """A data-less PrivateUse1 tensor of ``size`` and ``dtype`` on ``tpu:index`` with contiguous strides."""
    if index == 0:
        return torch._C._acc.create_empty_tensor(list(size), dtype)
    return _on_device(tuple(size), dtype, index)
