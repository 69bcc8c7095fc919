"""torchtpu-lab: a ``tpu`` device for PyTorch backed by JAX/XLA, built for notebooks.

``import torchtpu_lab`` registers the device; then ``torch.ones(3, device="tpu")``, ``model.to("tpu")`` and
``torch.tpu.*`` work as they do for CUDA. The device is a TPU when JAX finds one, otherwise XLA on GPU or CPU,
and says which (``torch.tpu.platform_name()``).
"""

from __future__ import annotations

from .device.registration import register as _register

_register()

from .device import tpu_module as tpu  # noqa: E402
from .platform import info as platform_info  # noqa: E402

__version__ = "0.1.0"
__all__ = ["tpu", "platform_info", "__version__"]
