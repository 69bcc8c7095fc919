"""Upsampling (``F.interpolate``) on tpu against PyTorch's CPU kernels where they are more than a float product:
float64 weights computed in double."""

import pytest
import torch
import torch.nn.functional as F

import torchtpu_lab  # noqa: F401
from compare import same

_INTERP = [("linear", 1), ("bilinear", 2), ("bicubic", 2), ("trilinear", 3)]


@pytest.mark.parametrize("mode,nd", _INTERP)
@pytest.mark.parametrize("antialias", [False, True])
@pytest.mark.parametrize("align_corners", [False, True])
@pytest.mark.parametrize("scale_factor", [1.3, 0.6])
def test_float64_weights_are_double(mode, nd, antialias, align_corners, scale_factor):
    """CPU computes a float64 input's source positions and weights in double: float32 ones were ~1e-6 off."""
    if antialias and nd != 2:
        pytest.skip("antialias is for bilinear and bicubic only")
    x = torch.randn((1, 2) + (7,) * nd, dtype=torch.float64, generator=torch.Generator().manual_seed(0))
    same(lambda v: F.interpolate(v, scale_factor=scale_factor, mode=mode, antialias=antialias,
                                 align_corners=align_corners), x, exact=False, rtol=1e-13, atol=1e-13)
