"""How far each float32 elementwise function on tpu is from PyTorch's CPU result, in ulps of CPU's.

    python bench/ulp_survey.py

About 60,000 arguments per function (log-spaced magnitudes from 1e-30 up, both signs, the integers to 199),
clamped to the function's domain. A result CPU gives as a subnormal is left out of the figures and counted
apart: XLA:CPU (as a TPU) flushes subnormals to zero. Prints, per function, the largest distance, the count
beyond 4 ulps and the argument of the largest.
"""

from __future__ import annotations

import common  # noqa: F401

import torch


def _arguments() -> dict[str, torch.Tensor]:
    positive = torch.cat([torch.logspace(-30, 1.95, 30000), torch.arange(1, 200).float()])
    both = torch.cat([positive, -positive])
    return {
        "exp": both.clamp(-100, 88), "exp2": (both * 1.3).clamp(-140, 127), "expm1": both.clamp(-100, 88),
        "cosh": both.clamp(-89, 89), "sinh": both.clamp(-89, 89), "tanh": both, "sigmoid": both,
        "log": positive, "log2": positive, "log10": positive, "log1p": positive, "sqrt": positive,
        "rsqrt": positive, "reciprocal": both, "sin": both.clamp(-1e4, 1e4), "cos": both.clamp(-1e4, 1e4),
        "tan": both.clamp(-1e3, 1e3), "asin": both.clamp(-1, 1), "acos": both.clamp(-1, 1), "atan": both,
        "asinh": both, "acosh": positive + 1, "atanh": both.clamp(-0.999, 0.999), "erf": both.clamp(-10, 10),
        "erfc": both.clamp(-10, 10), "erfinv": both.clamp(-0.9999, 0.9999), "lgamma": positive, "digamma": positive,
    }


def main() -> None:
    from common import table

    import torchtpu_lab  # noqa: F401 — the tpu device

    tiny, eps = torch.finfo(torch.float32).tiny, torch.finfo(torch.float32).eps
    rows = []
    for name, x in _arguments().items():
        fn = getattr(torch, name)
        cpu, tpu = fn(x), fn(x.to("tpu")).cpu()
        same = (cpu == tpu) | (cpu.isnan() & tpu.isnan())
        subnormal = cpu.isfinite() & (cpu != 0) & (cpu.abs() < tiny)
        counted = ~subnormal & cpu.isfinite()
        ulps = ((cpu.double() - tpu.double()).abs() / (cpu.double().abs().clamp_min(tiny) * eps))
        ulps[same] = 0
        ulps[~counted & same] = 0
        worst = int(torch.where(counted, ulps, torch.zeros_like(ulps)).argmax())
        overflow = int((~cpu.isfinite() & ~same).sum())
        rows.append((name, f"{float(ulps[counted].max()):.3g}", int((ulps[counted] > 4).sum()),
                     int((subnormal & ~same).sum()), overflow, f"{float(x[worst]):.6g}"))
    rows.sort(key=lambda r: -float(r[1]))
    print(table("float32 on tpu vs PyTorch CPU, ulps of CPU's result", rows,
                ("function", "max ulps", "> 4 ulps", "subnormal differs", "inf/nan differs", "worst argument")))


if __name__ == "__main__":
    main()
