"""OpInfo conformance: run PyTorch's own op database through the tpu device and compare with CPU.

    python bench/conformance.py                       # every op_db entry, float32 + int64 forward, float32 backward
    python bench/conformance.py --ops add,mul,sum     # a subset (exact OpInfo names, or name.variant)
    python bench/conformance.py --json out.json       # also write per-entry results
    python bench/conformance.py --dtypes bfloat16     # low-precision run (tolerances scaled to the dtype)
    python bench/conformance.py --no-fallback         # ops that would run on the CPU fallback count as failing

An entry passes for a dtype when its first ``--samples`` sample inputs all match CPU (values within rtol 1e-4 /
atol 1e-5 for float32, 1.6e-2 / 1e-2 for bfloat16 and float16, exactly for integers, same dtype and shape).
Random ops compare shape and dtype only. Entries whose CPU reference does not support the dtype are not counted
for it. Entries that needed the CPU fallback are reported separately (they pass, but not on the device).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
import traceback
import warnings
from collections import Counter

import torch
from torch.utils._pytree import tree_flatten, tree_map

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))
sys.path.insert(0, os.path.dirname(__file__))
import torchtpu_lab  # noqa: E402,F401

RANDOM_OPS = {
    "bernoulli", "normal", "normal.number_mean", "nn.functional.dropout", "nn.functional.dropout2d",
    "nn.functional.dropout3d", "nn.functional.alpha_dropout", "nn.functional.feature_alpha_dropout",
    "rand_like", "randn_like", "randint_like", "randint", "multinomial", "uniform", "nn.functional.rrelu",
    "cauchy", "exponential", "geometric", "log_normal", "empty_like", "empty", "new_empty", "empty_strided",
    "new_empty_strided", "empty_permuted", "nn.functional.fractional_max_pool2d",
    "nn.functional.fractional_max_pool3d", "randn", "rand", "normal.in_place", "bernoulli.p",
    "nn.functional.feature_alpha_dropout", "svd_lowrank", "pca_lowrank",
}


# Entries whose samples are random only when this keyword is non-zero (attention dropout): such samples are
# compared by shape and dtype, the others by value.
RANDOM_WHEN = {
    "nn.functional.scaled_dot_product_attention": lambda s: s.kwargs.get("dropout_p", 0.0) > 0,
    # multi_head_attention_forward(q, k, v, embed_dim, num_heads, w, b, bias_k, bias_v, add_zero_attn, dropout_p, ...)
    "nn.functional.multi_head_attention_forward": lambda s: s.args[9] > 0 and s.kwargs.get("training", True),
}


def _sample_is_random(op, sample) -> bool:
    predicate = RANDOM_WHEN.get(entry_name(op))
    return predicate is not None and bool(predicate(sample))


# Arguments PyTorch itself requires on the CPU (by entry name and position in ``sample.args``).
CPU_ARGS = {"tensor_split": {0}}


def entry_name(op) -> str:
    return op.name + (f".{op.variant_test_name}" if op.variant_test_name else "")


def to_tpu(x):
    if isinstance(x, torch.Tensor):
        t = x.detach().to("tpu")
        return t.requires_grad_(x.requires_grad)
    if isinstance(x, torch.device) and x.type == "cpu":
        return torch.device("tpu")
    return x


def sample_to_tpu(op, args: tuple, kwargs: dict) -> tuple[tuple, dict]:
    keep = CPU_ARGS.get(entry_name(op), set())
    moved = tuple(a if (i - 1) in keep else tree_map(to_tpu, a) for i, a in enumerate(args))
    kw = tree_map(to_tpu, kwargs)
    if kw.get("device") in ("cpu", "cpu:0"):  # factory samples name the device: make them build on tpu
        kw["device"] = "tpu"
    return moved, kw


_TOLERANCES = {torch.bfloat16: (1.6e-2, 1e-2), torch.float16: (1e-3, 1e-3)}


def _compare(name, cpu_out, tpu_out, dtype, random: bool):
    cpu_flat, _ = tree_flatten(cpu_out)
    tpu_flat, _ = tree_flatten(tpu_out)
    if len(cpu_flat) != len(tpu_flat):
        raise AssertionError(f"{len(tpu_flat)} outputs, expected {len(cpu_flat)}")
    for c, t in zip(cpu_flat, tpu_flat):
        if isinstance(c, torch.Tensor):
            if not isinstance(t, torch.Tensor):
                raise AssertionError(f"output is {type(t).__name__}, expected a tensor")
            if t.device.type != "tpu" and c.device.type == "cpu" and t.device.type != "cpu":
                raise AssertionError(f"output on {t.device}")
            tc = t.detach().cpu()
            if tc.dtype != c.dtype:
                raise AssertionError(f"dtype {tc.dtype}, expected {c.dtype}")
            if tc.shape != c.shape:
                raise AssertionError(f"shape {tuple(tc.shape)}, expected {tuple(c.shape)}")
            if random:
                continue
            if dtype.is_floating_point or c.dtype.is_floating_point or c.dtype.is_complex:
                rtol, atol = _TOLERANCES.get(c.dtype, _TOLERANCES.get(dtype, (1e-4, 1e-5)))
                torch.testing.assert_close(tc, c.detach(), rtol=rtol, atol=atol, equal_nan=True,
                                           check_dtype=True)
            else:
                torch.testing.assert_close(tc, c.detach(), rtol=0, atol=0, equal_nan=True)
        elif isinstance(c, (int, float, bool)) and not random:
            if isinstance(t, torch.Tensor):
                t = t.item()
            if not (c == t or (isinstance(c, float) and c != c and t != t) or abs(c - t) <= 1e-5 + 1e-4 * abs(c)):
                raise AssertionError(f"value {t}, expected {c}")


def _first_error(e: BaseException) -> str:
    msg = f"{type(e).__name__}: {e}".strip().splitlines()
    return msg[0][:300] if msg else type(e).__name__


def run_forward(op, dtype, samples_limit: int) -> tuple[bool, str]:
    random = entry_name(op) in RANDOM_OPS or op.name in RANDOM_OPS
    n = 0
    for sample in op.sample_inputs("cpu", dtype, requires_grad=False):
        if n >= samples_limit:
            break
        n += 1
        args = (sample.input, *sample.args)
        try:
            torch.manual_seed(0)
            expected = op(*args, **sample.kwargs)
        except Exception:
            n -= 1
            continue
        try:
            t_args, t_kwargs = sample_to_tpu(op, args, sample.kwargs)
            actual = op(*t_args, **t_kwargs)
            _compare(op.name, expected, actual, dtype, random or _sample_is_random(op, sample))
        except Exception as e:  # noqa: BLE001 — every failure is a data point
            return False, _first_error(e)
    if n == 0:
        return True, "no usable samples"
    return True, ""


def _grads(out, inputs):
    flat = [o for o in tree_flatten(out)[0] if isinstance(o, torch.Tensor) and o.requires_grad]
    if not flat:
        return None
    total = sum((o.float().sum() if not o.is_complex() else o.real.sum()) for o in flat)
    want = [i for i in inputs if isinstance(i, torch.Tensor) and i.requires_grad]
    return torch.autograd.grad(total, want, allow_unused=True)


def run_backward(op, samples_limit: int) -> tuple[bool, str]:
    random = entry_name(op) in RANDOM_OPS or op.name in RANDOM_OPS
    n = 0
    for sample in op.sample_inputs("cpu", torch.float32, requires_grad=True):
        if n >= samples_limit:
            break
        n += 1
        if _sample_is_random(op, sample):
            n -= 1
            continue
        args = (sample.input, *sample.args)
        leaves = [x for x in tree_flatten((args, sample.kwargs))[0] if isinstance(x, torch.Tensor)]
        try:
            torch.manual_seed(0)
            expected = _grads(op(*args, **sample.kwargs), leaves)
        except Exception:
            n -= 1
            continue
        if expected is None:
            n -= 1
            continue
        try:
            t_args, t_kwargs = sample_to_tpu(op, args, sample.kwargs)
            t_leaves = [x for x in tree_flatten((t_args, t_kwargs))[0] if isinstance(x, torch.Tensor)]
            actual = _grads(op(*t_args, **t_kwargs), t_leaves)
            for e, a in zip(expected, actual):
                if e is None or a is None:
                    if (e is None) != (a is None) and not (e is not None and not e.any()):
                        raise AssertionError("gradient missing" if a is None else "unexpected gradient")
                    continue
                if random:  # random draws differ from CPU's: only the gradient's shape and dtype can match
                    if a.shape != e.shape or a.dtype != e.dtype:
                        raise AssertionError(f"gradient {tuple(a.shape)} {a.dtype}, expected {tuple(e.shape)} {e.dtype}")
                    continue
                torch.testing.assert_close(a.detach().cpu(), e, rtol=1e-3, atol=1e-4, equal_nan=True)
        except Exception as e:  # noqa: BLE001
            return False, _first_error(e)
    return True, ""


def _checks(row: dict):
    """The (check name, (passed, message)) pairs of a result row."""
    return [(k, v) for k, v in row.items() if isinstance(v, tuple)]


def select(names: list[str] | None):
    from torch.testing._internal.common_methods_invocations import op_db

    if not names:
        return list(op_db)
    wanted = set(names)
    return [op for op in op_db if op.name in wanted or entry_name(op) in wanted]


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--ops", help="comma-separated OpInfo names (default: all of op_db)")
    p.add_argument("--samples", type=int, default=4, help="sample inputs per entry and dtype (default 4)")
    p.add_argument("--no-backward", action="store_true")
    p.add_argument("--dtypes", default="float32,int64", help="forward dtypes (default float32,int64)")
    p.add_argument("--no-fallback", action="store_true", help="turn the CPU fallback off")
    p.add_argument("--json", help="write per-entry results here")
    p.add_argument("--quiet", action="store_true", help="only the summary")
    args = p.parse_args(argv)
    warnings.filterwarnings("ignore")
    from torchtpu_lab.runtime import cpu_fallback, executor

    torchtpu_lab.set_cpu_fallback(not args.no_fallback)
    ops = select(args.ops.split(",") if args.ops else None)
    forward_dtypes = [(getattr(torch, name), name) for name in args.dtypes.split(",")]
    results = []
    t0 = time.time()
    for op in ops:
        row = {"entry": entry_name(op)}
        executor.OPS_SEEN.clear()
        fallbacks_before = {k: v["count"] for k, v in cpu_fallback.stats.items()}
        for dtype, key in forward_dtypes:
            if dtype not in op.supported_dtypes("cpu"):
                continue
            try:
                row[key] = run_forward(op, dtype, args.samples)
            except Exception as e:  # noqa: BLE001 — sample generation itself failed
                row[key] = (False, "harness: " + _first_error(e))
        if not args.no_backward and op.supports_autograd and torch.float32 in op.supported_backward_dtypes("cpu"):
            try:
                row["backward"] = run_backward(op, min(args.samples, 2))
            except Exception as e:  # noqa: BLE001
                row["backward"] = (False, "harness: " + _first_error(e))
        used = {k for k, v in cpu_fallback.stats.items() if v["count"] != fallbacks_before.get(k, 0)}
        row["fallback_ops"] = sorted(used)
        row["lowered_ops"] = sorted(str(o) for o in executor.OPS_SEEN)
        results.append(row)
        if not args.quiet:
            bad = {k: v[1] for k, v in _checks(row) if not v[0]}
            print(f"{'FAIL' if bad else 'ok  '} {row['entry']}" + (f"  {bad}" if bad else ""), flush=True)
    print(f"\n== conformance over {len(results)} op_db entries ({time.time() - t0:.0f}s, "
          f"eager mode {torchtpu_lab.eager_mode_name()}, CPU fallback {'off' if args.no_fallback else 'on'}) ==")
    for key in [k for _, k in forward_dtypes] + ["backward"]:
        rows = [r for r in results if key in r]
        passed = [r for r in rows if r[key][0]]
        if rows:
            label = f"{key:9s} forward" if key != "backward" else "float32  backward"
            via = sum(1 for r in passed if r["fallback_ops"])
            print(f"{label}: {len(passed)}/{len(rows)} = {100 * len(passed) / len(rows):.1f}%"
                  f"  ({via} of them used the CPU fallback)")
    fallback_ops = Counter(op for r in results for op in r["fallback_ops"])
    if fallback_ops:
        print("ops run by the CPU fallback:", ", ".join(f"{k} x{n}" for k, n in fallback_ops.most_common()))
    failing = Counter()
    for r in results:
        for k, v in _checks(r):
            if not v[0]:
                failing[v[1].split(":")[0]] += 1
    if failing:
        print("most common failure kinds:", ", ".join(f"{k} x{n}" for k, n in failing.most_common(6)))
    from known_failures import KNOWN_FAILURES

    failed = {(r["entry"], k) for r in results for k, v in _checks(r) if not v[0]}
    ran = {(r["entry"], k) for r in results for k, _ in _checks(r)}
    unexpected = sorted(failed - set(KNOWN_FAILURES))
    fixed = sorted(k for k in KNOWN_FAILURES if k in ran and k not in failed)
    print(f"known failures (bench/known_failures.py): {len(failed & set(KNOWN_FAILURES))} still fail; "
          f"{len(unexpected)} unexpected failures; {len(fixed)} listed entries now pass")
    for k in fixed:
        print(f"  now passing, remove from the list: {k}")
    print("\nfailing entries (first error):")
    for r in results:
        for k, v in _checks(r):
            if not v[0]:
                print(f"  {r['entry']} [{k}]: {v[1]}")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(results, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
