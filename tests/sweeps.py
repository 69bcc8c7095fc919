"""What ``make test`` leaves to ``make test-sweeps`` (``pytest -m sweep``): the extra values of long sweeps.

A sweep keeps its most telling values in ``make test`` (the default eager mode, the most used optimizers) and
marks the rest ``sweep``; CI (``.ci/run``) runs ``make test``, and the sweeps are run by hand and reported.
"""

from __future__ import annotations

from collections.abc import Iterable

import pytest


def swept(values: Iterable, keep: Iterable) -> list:
    """``values`` as parameters, those not in ``keep`` marked ``sweep``."""
    keep = set(keep)
    return [v if v in keep else pytest.param(v, marks=pytest.mark.sweep) for v in values]


#: every eager mode; ``fused`` (the default, and what a notebook runs) in ``make test``
EAGER_MODES = swept(["fused", "strict", "debug"], keep={"fused"})
