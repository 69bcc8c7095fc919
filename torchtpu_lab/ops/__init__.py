"""ATen -> JAX lowerings, one module per op family. Importing this package fills :data:`LOWERINGS`."""

from . import registry  # noqa: F401  (first: the families register into it)
from . import bitwise, counting, elementwise, factories, fft, indexing, linalg, nn  # noqa: F401
from . import powers, random, reductions, shape, special  # noqa: F401
from . import optimizer_kernels  # noqa: F401  (torch-level kernels of fused=True optimizer steps)
from .registry import DECOMP_SKIP, LOWERINGS, PY_KERNELS, Lowering, kernel, lower, skip_decomposition

__all__ = ["DECOMP_SKIP", "LOWERINGS", "PY_KERNELS", "Lowering", "kernel", "lower", "skip_decomposition"]
