"""Debug helpers: ``torchtpu_lab.debug.check_finite(True)`` makes debug mode stop at the first NaN/Inf."""

from .runtime.modes import check_finite

__all__ = ["check_finite"]
