"""Upsampling (``F.interpolate``) on tpu against PyTorch's CPU kernels where they are more than a float product:
float64 weights computed in double, ``uint8`` images in fixed-point arithmetic, integer inputs refused."""

import itertools

import pytest
import torch
import torch.nn.functional as F

import torchtpu_lab  # noqa: F401
from compare import raises_like_cpu, same

_INTERP = [("linear", 1), ("bilinear", 2), ("bicubic", 2), ("trilinear", 3)]


_FLOAT64_CASES = [(mode, nd, antialias) for (mode, nd), antialias in itertools.product(_INTERP, [False, True])
                  if nd == 2 or not antialias]  # antialias is for bilinear and bicubic only


@pytest.mark.parametrize("mode,nd,antialias", _FLOAT64_CASES)
@pytest.mark.parametrize("align_corners", [False, True])
@pytest.mark.parametrize("scale_factor", [1.3, 0.6])
def test_float64_weights_are_double(mode, nd, antialias, align_corners, scale_factor):
    """CPU computes a float64 input's source positions and weights in double: float32 ones were ~1e-6 off."""
    x = torch.randn((1, 2) + (7,) * nd, dtype=torch.float64, generator=torch.Generator().manual_seed(0))
    same(lambda v: F.interpolate(v, scale_factor=scale_factor, mode=mode, antialias=antialias,
                                 align_corners=align_corners), x, exact=False, rtol=1e-13, atol=1e-13)


@pytest.mark.parametrize("mode", ["bilinear", "bicubic"])
@pytest.mark.parametrize("antialias,align_corners", list(itertools.product([False, True], [False, True])))
@pytest.mark.parametrize("channels", [3, 5])
@pytest.mark.parametrize("size", [(5, 7), (31, 40), (40, 17)])
def test_uint8_image_matches_cpu_fixed_point(mode, antialias, align_corners, channels, size):
    """CPU resamples a uint8 image with int16 weights, width then height, rounding each pass: the same pixels, not
    all zeros (the weights had been cast to uint8) nor a float interpolation rounded once."""
    x = torch.randint(0, 256, (2, channels, 23, 29), dtype=torch.uint8, generator=torch.Generator().manual_seed(1))
    got = same(lambda v: F.interpolate(v, size=size, mode=mode, antialias=antialias, align_corners=align_corners), x)
    assert got.cpu().float().mean() > 50


def test_uint8_scale_factor_and_one_axis():
    x = torch.randint(0, 256, (1, 3, 11, 10), dtype=torch.uint8, generator=torch.Generator().manual_seed(2))
    for sf in (0.3, 1.7, (1.0, 2.5)):
        same(lambda v: F.interpolate(v, scale_factor=sf, mode="bicubic", antialias=False), x)
        same(lambda v: F.interpolate(v, scale_factor=sf, mode="bilinear", antialias=True), x)


@pytest.mark.parametrize("dtype,mode,nd,antialias", [
    (torch.uint8, "linear", 1, False), (torch.uint8, "trilinear", 3, False), (torch.int32, "bilinear", 2, False),
    (torch.int64, "bilinear", 2, True), (torch.int64, "bicubic", 2, False), (torch.int32, "bicubic", 2, True)])
def test_integer_input_without_cpu_kernel_raises(dtype, mode, nd, antialias):
    """CPU has no kernel for these: its NotImplementedError, never zeros."""
    x = torch.arange(4 ** nd, dtype=dtype).reshape((1, 1) + (4,) * nd)
    error = raises_like_cpu(lambda v: F.interpolate(v, scale_factor=0.75, mode=mode, antialias=antialias), x)
    assert "not implemented for" in str(error)
