"""The current device: which ``tpu:i`` a bare ``device="tpu"`` means (``torch.tpu.set_device`` changes it).

Part of the data model so that every layer above (kernels, the runtime, ``torch.tpu``) reads the same value.
With the native core the value is the core's (per thread, as CUDA's current device is), so PyTorch's own
``DeviceGuard`` and ``torch.accelerator.set_device_index`` change the same current device as
``torch.tpu.set_device``; in pure-Python mode it is one process-wide value.
"""

from __future__ import annotations

from .. import native

_current = [0]


def current_index() -> int:
    core = native.module()
    return core.current_device() if core is not None else _current[0]


def set_current_index(index: int) -> None:
    """Make ``tpu:index`` the default device (the caller has checked that it exists)."""
    core = native.module()
    if core is not None:
        core.set_current_device(int(index))
    else:
        _current[0] = int(index)
