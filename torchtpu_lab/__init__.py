"""torchtpu-lab: a ``tpu`` device for PyTorch backed by JAX/XLA, built for notebooks.

``import torchtpu_lab`` registers the device; then ``torch.ones(3, device="tpu")``, ``model.to("tpu")`` and
``torch.tpu.*`` work as they do for CUDA. The device is a TPU when JAX finds one, otherwise XLA on GPU or CPU,
and says which (``torch.tpu.platform_name()``).
"""

from __future__ import annotations

from .device.registration import register as _register

_register()

from . import autocast as _autocast  # noqa: E402,F401  (torch.autocast("tpu") policy)
from . import debug  # noqa: E402
from .device import tpu_module as tpu  # noqa: E402
from .metrics import metrics_report  # noqa: E402
from .profile import Profile, profile  # noqa: E402
from .platform import info as platform_info  # noqa: E402
from .runtime import compile_cache  # noqa: E402
from .runtime.cpu_fallback import set_cpu_fallback  # noqa: E402
from .runtime.modes import current as eager_mode_name  # noqa: E402
from .runtime.modes import eager_mode, set_eager_mode  # noqa: E402

__version__ = "0.1.0"
__all__ = [
    "tpu", "platform_info", "sync", "set_eager_mode", "eager_mode", "eager_mode_name", "metrics_report",
    "debug", "set_cpu_fallback", "profile", "Profile", "__version__",
]


def sync() -> None:
    """Run all pending fused work now (a sync point; a no-op in strict and debug modes)."""
    from . import telemetry
    from .runtime import lazy

    import time

    event = telemetry.record_sync("torchtpu_lab.sync()", lazy.pending_ops())
    lazy.sync("torchtpu_lab.sync()", record=False)
    event.dur = time.perf_counter() - event.t


compile_cache.enable()


def load_ipython_extension(ip) -> None:
    """``%load_ext torchtpu_lab``: see :mod:`torchtpu_lab.jupyter.session`."""
    from .jupyter import load_ipython_extension as load

    load(ip)


def unload_ipython_extension(ip) -> None:
    from .jupyter import unload_ipython_extension as unload

    unload(ip)
