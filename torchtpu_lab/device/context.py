"""The current device: which ``tpu:i`` a bare ``device="tpu"`` means (``torch.tpu.set_device`` changes it).

Part of the data model so that every layer above (kernels, the runtime, ``torch.tpu``) reads the same value.
"""

from __future__ import annotations

_current = [0]


def current_index() -> int:
    return _current[0]


def set_current_index(index: int) -> None:
    """Make ``tpu:index`` the default device (the caller has checked that it exists)."""
    _current[0] = int(index)
