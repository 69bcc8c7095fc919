"""The device buffer behind a base tensor and all of its views.

A :class:`Storage` owns one JAX array in the base tensor's shape. Mutation never touches that array (JAX arrays
are immutable): a write computes a new array and :attr:`Storage.array` is replaced, so every tensor that shares
the storage — the base and all its views — sees the new values. ``torch.empty`` allocates nothing: the array is
created on first read, zero-filled, and usually never, because the first write replaces it whole.
"""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp
import torch

from .. import dtypes
from . import memory


class Storage:
    __slots__ = ("_array", "shape", "dtype", "device_index", "nbytes", "__weakref__")

    def __init__(self, shape: tuple, dtype: torch.dtype, device_index: int, array=None):
        self.shape = tuple(shape)
        self.dtype = dtype
        self.device_index = device_index
        self.nbytes = math.prod(self.shape) * dtype.itemsize
        self._array = None
        if array is not None:
            self.array = array

    @property
    def array(self):
        """The JAX array holding the values (allocated, zero-filled, on first read of an empty storage)."""
        if self._array is None:
            from .. import platform

            with jax.default_device(platform.jax_device(self.device_index)):
                self.array = jnp.zeros(self.shape, dtypes.to_jax(self.dtype))
        return self._array

    @array.setter
    def array(self, new) -> None:
        old = self._array
        if new is old:
            return
        memory.acquire(new, self.device_index, self.nbytes)
        self._array = new
        if old is not None:
            memory.release(old)

    @property
    def allocated(self) -> bool:
        return self._array is not None

    def __del__(self) -> None:
        if self._array is not None:
            memory.release(self._array)
