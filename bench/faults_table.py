"""Try the faults of issue 14 as a hostile user would and write the whole of docs/reliability.md.

    python bench/faults_table.py [--storm 25] [--cost [--cost-pairs 3] [--cost-reps 2] [--cost-iters 8]
                                 [--cost-clock cpu]] [--out docs/reliability.md]

Every section of the document is generated here, so none can be lost by a regeneration or go stale unnoticed:
the tried/held table, how each category is tried (each category function's docstring), and the cost of the
error checks. ``--cost`` measures that cost by running ``bench/train_step.py`` with the checks on and with
``TORCHTPU_LAB_CHECKS=0``, alternated; without ``--cost`` the cost section of the existing file is kept,
labelled as not re-measured, with the date of the run that measured it.

The cases and the check that decides whether each holds come from ``tests/fault_cases.py`` and the tests
themselves (called here, outside pytest, with the fixtures they declare), so "held" in the table means "that
test passes" and a case added to a test is counted without touching this script.
"""

from __future__ import annotations

import argparse
import atexit
import contextlib
import datetime
import inspect
import os
import pathlib
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import TYPE_CHECKING

ROOT = pathlib.Path(__file__).resolve().parent.parent
# The checkout by its normalized path (not common.py's ``bench/..``): a module imported through ``..`` has code
# filenames that telemetry's "is this frame ours?" test (an absolute-path prefix) does not recognise, so every
# error would name a torchtpu_lab line instead of the user's and the out-of-range checks would fail.
sys.path[:0] = [str(ROOT), str(ROOT / "tests")]
# like tests/conftest.py: %load_ext turns the persistent cache on in its default directory, which must be one of
# this run (a damaged-cache case must not touch the user's cache, and no entry may be left behind)
os.environ["XDG_CACHE_HOME"] = tempfile.mkdtemp(prefix="torchtpu-lab-faults-cache-")
atexit.register(shutil.rmtree, os.environ["XDG_CACHE_HOME"], ignore_errors=True)

import pytest  # noqa: E402
import torch  # noqa: E402

import fault_cases as fc  # noqa: E402
import torchtpu_lab  # noqa: E402

if TYPE_CHECKING:
    from IPython.core.interactiveshell import InteractiveShell

COST_HEADING = "## Cost of the error checks"
KEPT_MARK = "_Kept from"


@dataclass
class Outcome:
    """One row of the table: how many faults were tried, how many held, and what the notes column says."""

    tried: int
    held: int
    notes: str


# ---- running the tests' own checks outside pytest ---------------------------------------------------------------


def _held(fn: Callable[..., object], *args: object) -> bool | None:
    """Whether ``fn(*args)`` (a test or a shared check) passes; ``None`` when it skips itself (not tried)."""
    try:
        fn(*args)
        return True
    except pytest.skip.Exception:
        return None
    except Exception as e:  # noqa: BLE001 — a fault that did not hold is a row figure, not a crash of the script
        print(f"  not held: {getattr(fn, '__name__', fn)}{args!r:.80}: {type(e).__name__}: {e}"[:400])
        return False


def _tally(results: list[bool | None]) -> tuple[int, int]:
    tried = [r for r in results if r is not None]
    return len(tried), sum(tried)


def _parameters(test: Callable[..., object], name: str) -> list:
    """The values a test is parametrized with for ``name``: the script tries exactly what the test tries."""
    for mark in getattr(test, "pytestmark", []):
        if mark.name == "parametrize" and mark.args[0] == name:
            return list(mark.args[1])
    raise LookupError(f"{test.__name__} is not parametrized over {name!r}")


@contextlib.contextmanager
def _fixture(fixture: Callable[..., object], *args: object) -> Iterator[object]:
    """Enter a pytest generator fixture of the tests (its set-up and tear-down, not a copy of them)."""
    with contextlib.contextmanager(inspect.unwrap(fixture))(*args) as value:
        yield value


_SHELL: list = []


def _shell() -> "InteractiveShell":
    """One IPython shell with the extension loaded, set up by test_profile_truth's own ``ip`` fixture."""
    if not _SHELL:
        import test_profile_truth

        stack = contextlib.ExitStack()
        _SHELL.append(stack.enter_context(_fixture(test_profile_truth.ip)))
        _SHELL.append(stack)
    return _SHELL[0]


def _with_monkeypatch(test: Callable[..., object], *args: object, **kwargs: object) -> Callable[[], None]:
    """``test(*args, monkeypatch=..., **kwargs)`` with the monkeypatch undone afterwards, as pytest does."""
    def call() -> None:
        with pytest.MonkeyPatch.context() as mp:
            test(*args, monkeypatch=mp, **kwargs)

    call.__name__ = test.__name__
    return call


def _tmp() -> pathlib.Path:
    return pathlib.Path(tempfile.mkdtemp(prefix="faults-table-"))


# ---- the categories: each docstring's first paragraph is the document's description of the row ----------------


def storm(n: int) -> Outcome:
    """`tests/faults_storm.py` in a child process per mode (fused, strict): a thread sends N SIGINTs at random
    moments into an MLP training loop; held when the process lives, every parameter stays readable and equals
    its value before or after the interrupted step (against a CPU copy), and every completed step equals CPU's."""
    held, notes = 0, []
    for mode in ("fused", "strict"):
        out = subprocess.run([sys.executable, str(ROOT / "tests" / "faults_storm.py"), mode, str(n)],
                             capture_output=True, text=True, timeout=600, env=fc.child_env())
        ok = out.returncode == 0 and "STORM OK" in out.stdout
        held += ok
        notes.append(f"{mode}: " + (out.stdout.strip().splitlines()[-1].replace("STORM OK ", "")
                                    if ok else f"exit {out.returncode}"))
    return Outcome(2, held, "; ".join(notes))


def out_of_range() -> Outcome:
    """Each case of `fault_cases.OUT_OF_RANGE` (indices, targets, probabilities, integer division by zero) in
    strict and in fused mode: held when CPU's error type is raised naming the op and the user's line, nothing is
    left pending and new work computes correctly."""
    results = []
    for mode in ("strict", "fused"):
        with torchtpu_lab.eager_mode(mode):
            results += [_held(fc.check_out_of_range, case) for case in fc.OUT_OF_RANGE]
    return Outcome(*_tally(results), f"{len(fc.OUT_OF_RANGE)} cases x strict, fused")


def threads() -> Outcome:
    """`test_threads_fused_equal_cpu`: 3 threads x 4 trials compute in fused mode while the main thread syncs;
    held when every result equals CPU's."""
    import test_faults

    return Outcome(*_tally([_held(test_faults.test_threads_fused_equal_cpu)]),
                   "3 threads x 4 trials, fused, main thread syncing")


def sizes() -> Outcome:
    """Each expression of `fault_cases.ABSURD` (2**62 elements, negative dimensions, ...) in strict and in
    fused mode, in one child process: held when CPU's message is raised and the child still computes after."""
    outcomes, alive = fc.absurd_sizes_in_a_child()
    return Outcome(len(outcomes), sum(outcomes.values()) if alive else 0,
                   f"{len(fc.ABSURD)} expressions x strict, fused, one child process that must stay alive"
                   + ("" if alive else "; the child died"))


def arguments() -> Outcome:
    """Each call of `fault_cases.BAD_DEVICE_CALLS` and value of `BAD_RNG_STATES`: held when torch.tpu raises
    (naming tpu, or the RNG state it expects) and the current device and RNG state are untouched."""
    results = [_held(fc.check_bad_device, label) for label in fc.BAD_DEVICE_CALLS]
    results += [_held(fc.check_bad_rng_state, label) for label in fc.BAD_RNG_STATES]
    return Outcome(*_tally(results), f"{len(fc.BAD_DEVICE_CALLS)} device arguments, "
                                     f"{len(fc.BAD_RNG_STATES)} RNG states")


def profile_options() -> Outcome:
    """Each line of `fault_cases.PROFILE_BAD_OPTIONS` (`--top -5`, `--output` without `--xprof`, ...) given to
    `%%tpu_profile`: held when a UsageError names the wrong option and the cell body does not run."""
    ip = _shell()
    results = [_held(fc.check_bad_profile_option, ip, line, word) for line, word in fc.PROFILE_BAD_OPTIONS]
    return Outcome(*_tally(results), ", ".join(f"`{line}`" for line, _ in fc.PROFILE_BAD_OPTIONS))


def xprof_failures() -> Outcome:
    """A `%%tpu_profile --xprof` whose trace cannot be written (an unwritable directory; `jax.profiler.stop_trace`
    raising an error or a KeyboardInterrupt), each followed by a working `--xprof` cell: held when the failure is
    reported (an interrupt reaches IPython), no memory listener is left attached and the next trace is written."""
    import test_profile_truth as tp

    ip = _shell()
    results = [_held(tp.test_failed_xprof_shows_the_report_and_the_next_xprof_works, ip, _tmp())]
    test = tp.test_stop_trace_failure_leaks_nothing_and_the_next_xprof_works
    errors = _parameters(test, "error")
    results += [_held(_with_monkeypatch(test, ip, _tmp(), error=error)) for error in errors]
    return Outcome(*_tally(results), "unwritable directory; stop_trace raising "
                   + ", ".join(type(e).__name__ for e in errors))


def flush_errors() -> Outcome:
    """The end-of-cell flush of a plain cell, and every end-of-cell flush of a `%%tpu_profile` cell, failing:
    held when the failure is the cell's error (shown in the report of a profiled cell, then raised) and the
    pending work is computed by the next read."""
    import test_profile_truth as tp

    ip = _shell()
    results = [_held(_with_monkeypatch(test, ip)) for test in (
        tp.test_end_of_cell_flush_failure_is_the_cells_error,
        tp.test_flush_failure_at_the_end_of_a_profiled_cell_is_the_cells_error)]
    return Outcome(*_tally(results), "plain cell; profiled cell (its body's and the profile's own flush)")


def cache_damage() -> Outcome:
    """Each damage kind of `tests/test_executable_cache.py` done to every entry of a persistent executable cache
    (truncated, flipped byte, garbage, empty, /dev/zero link, FIFO, directory, another entry's bytes): held when
    loading warns, compiles instead, computes CPU's values and the rewritten entry hits on the next start."""
    import test_executable_cache as tc

    kinds = _parameters(tc.test_damaged_entries_warn_and_compile, "how")
    results = []
    for how in kinds:
        with _fixture(tc.disk_cache, _tmp()) as directory:
            results.append(_held(tc.test_damaged_entries_warn_and_compile, directory, how))
    return Outcome(*_tally(results), ", ".join(kinds))


def escaping() -> Outcome:
    """Each string of `fault_cases.HOSTILE_STRINGS` (script and image tags, a broken-out attribute, closing
    tags) in a profiled cell's source line and error message: held when the HTML report and the plotly flame
    graph built from it carry it only escaped."""
    ip = _shell()
    results = [_held(fc.check_escaped, ip, s) for s in fc.HOSTILE_STRINGS]
    return Outcome(*_tally(results), f"{len(fc.HOSTILE_STRINGS)} strings x (HTML report, flame graph labels "
                                     "and hover)")


CATEGORIES: tuple[tuple[str, Callable[[], Outcome]], ...] = (
    ("Out-of-range indices and data-dependent errors", out_of_range),
    ("Threads", threads),
    ("Absurd sizes", sizes),
    ("Bad torch.tpu arguments", arguments),
    ("Bad `%%tpu_profile` options", profile_options),
    ("Failed `--xprof` trace, then a working one", xprof_failures),
    ("End-of-cell flush error", flush_errors),
    ("Damaged persistent-cache entries", cache_damage),
    ("User strings in HTML and plotly output", escaping),
)
STORM_TITLE = "Ctrl-C (SIGINT storm in a training loop)"


# ---- the cost of the error checks -------------------------------------------------------------------------------


@dataclass
class CostRun:
    """One ``bench/train_step.py`` run: per model, (fused ms/step, hand-written jax.jit ms/step)."""

    checks: bool
    steps: dict[str, tuple[float, float]]
    load: tuple[float, float]  # 1-minute load average before and after the run


def _train_step_command(reps: int, iters: int, clock: str) -> list[str]:
    return ["bench/train_step.py", "--models", "mlp,transformer", "--paths", "fused", "--reps", str(reps),
            "--iters", str(iters), "--clock", clock]


def _parse_train_step(out: str) -> dict[str, tuple[float, float]]:
    """The fused and jax.jit rows of each ``<model> training step`` table that train_step.py prints."""
    steps = {}
    heads = list(re.finditer(r"^(\w+) training step$", out, re.M))
    for head, following in zip(heads, heads[1:] + [None]):
        section = out[head.end():following.start() if following else len(out)]
        fused = re.search(r"^torchtpu_lab fused\s+([\d.]+)", section, re.M)
        jit = re.search(r"^jax\.jit \(hand-written\)\s+([\d.]+)", section, re.M)
        if fused and jit:
            steps[head.group(1)] = (float(fused.group(1)), float(jit.group(1)))
    return steps


def _cost_run(checks: bool, reps: int, iters: int, clock: str) -> CostRun:
    """Run train_step.py once in a child (``TORCHTPU_LAB_CHECKS`` is read at import), without a persistent
    cache (an executable stored with the checks must not be loaded into a run without them, or vice versa)."""
    env = fc.child_env()
    env.pop("TORCHTPU_LAB_CACHE_DIR", None)
    env.pop("TORCHTPU_LAB_CHECKS", None)
    if not checks:
        env["TORCHTPU_LAB_CHECKS"] = "0"
    before = os.getloadavg()[0]
    out = subprocess.run([sys.executable, *_train_step_command(reps, iters, clock)], capture_output=True,
                         text=True, timeout=1800, env=env, cwd=ROOT)
    steps = _parse_train_step(out.stdout)
    if out.returncode != 0 or set(steps) != {"mlp", "transformer"}:
        raise RuntimeError(f"bench/train_step.py failed or printed no step tables (exit {out.returncode}):\n"
                           f"{out.stdout[-2000:]}\n{out.stderr[-3000:]}")
    run = CostRun(checks, steps, (before, os.getloadavg()[0]))
    print(f"  checks {'on ' if checks else 'off'}: " + ", ".join(f"{m} {f:.2f} ms (jax.jit {j:.2f})"
                                                              for m, (f, j) in steps.items()))
    return run


def measure_cost(pairs: int, reps: int, iters: int, clock: str) -> str:
    """Alternate checks-on and checks-off runs (the order swapped every pair, so a load that drifts during the
    measurement favours neither) and write the section from the medians."""
    runs: list[CostRun] = []
    t0 = time.time()
    for k in range(pairs):
        for checks in ((True, False) if k % 2 == 0 else (False, True)):
            runs.append(_cost_run(checks, reps, iters, clock))
    minutes = (time.time() - t0) / 60
    on = [r for r in runs if r.checks]
    off = [r for r in runs if not r.checks]
    loads = [x for r in runs for x in r.load]

    def median_of(group: list[CostRun], model: str, relative: bool) -> float:
        """Median fused ms/step, or (``relative``) median of fused / jax.jit in the same run: the hand-written
        step has no checks, so dividing by it cancels how busy the machine was during that run."""
        return statistics.median(r.steps[model][0] / (r.steps[model][1] if relative else 1) for r in group)

    rows, relative = [], {}
    for model in ("mlp", "transformer"):
        on_ms, off_ms = median_of(on, model, False), median_of(off, model, False)
        relative[model] = median_of(on, model, True) / median_of(off, model, True)
        pair_ratios = [a.steps[model][0] / b.steps[model][0] for a, b in zip(on, off)]
        jit_moved = statistics.median(r.steps[model][1] for r in on) / statistics.median(r.steps[model][1]
                                                                                        for r in off)
        rows.append(f"| {model} | {on_ms:.2f} | {off_ms:.2f} | {on_ms / off_ms:.2f}x | "
                    f"{min(pair_ratios):.2f}x–{max(pair_ratios):.2f}x | {jit_moved:.2f}x | {relative[model]:.2f}x |")
    band = abs(relative["mlp"] - 1)
    inside = abs(relative["transformer"] - 1) <= band
    verdict = (f"The MLP has no checked op, so its same-run on / off ({relative['mlp']:.2f}x) is what noise alone "
               f"does: a band of ±{band:.0%}. The transformer's, {relative['transformer']:.2f}x, is "
               + ("inside that band: no cost of the checks is measurable above this machine's noise."
                  if inside else "outside that band: the checks cost about "
                  f"{relative['transformer'] - 1:+.0%} of a transformer step here."))
    today = datetime.date.today().isoformat()
    cmd = " ".join(_train_step_command(reps, iters, clock))
    return "\n".join([
        COST_HEADING,
        "",
        f"Measured on {today} by `python bench/faults_table.py --cost` ({minutes:.0f} min): `{cmd}` run "
        f"{len(runs)} times, alternating the error checks on (the default) and `TORCHTPU_LAB_CHECKS=0` "
        f"({pairs} pairs, the order swapped every pair), on {torch.tpu.platform_name()}, {os.cpu_count()} CPU "
        f"cores shared with other jobs: 1-minute load average {min(loads):.1f}–{max(loads):.1f} (median "
        f"{statistics.median(loads):.1f}) during the runs. Each figure is the median over the runs of "
        f"train_step.py's own median ({clock} clock), in ms per fused training step. The MLP has no op with a "
        "check (a control); the transformer's embeddings and cross-entropy check their indices every step.",
        "",
        "| model | checks on (ms) | checks off (ms) | on / off | on / off, each pair | jax.jit step, on-runs / "
        "off-runs | on / off of fused ÷ jax.jit in the same run |",
        "|---|---:|---:|---:|---|---:|---:|",
        *rows,
        "",
        "The hand-written `jax.jit` step (no checks, no torchtpu_lab) moves between the two sets of runs only "
        "because the machine does; the last column divides it out. " + verdict,
    ]) + "\n"


def kept_cost(path: pathlib.Path) -> str:
    """The cost section of the existing document, labelled as not re-measured by this regeneration."""
    text = path.read_text() if path.exists() else ""
    start = text.find(COST_HEADING)
    if start < 0:
        return f"{COST_HEADING}\n\nNot measured yet: run `python bench/faults_table.py --cost`.\n"
    end = text.find("\n## ", start + len(COST_HEADING))
    body = text[start + len(COST_HEADING):end if end >= 0 else len(text)]
    body = "\n".join(ln for ln in body.strip("\n").splitlines() if not ln.startswith(KEPT_MARK)).strip("\n")
    date = re.search(r"Measured on (\d{4}-\d\d-\d\d)", body)
    label = (f"{KEPT_MARK} the `--cost` run of {date.group(1) if date else 'an unknown date'}: this regeneration "
             f"({datetime.date.today().isoformat()}) did not re-measure it._")
    return f"{COST_HEADING}\n\n{label}\n\n{body}\n"


# ---- the document -----------------------------------------------------------------------------------------------


def _description(fn: Callable[..., object]) -> str:
    return " ".join(inspect.getdoc(fn).split("\n\n")[0].split())


def document(rows: list[tuple[str, Outcome, Callable[..., object]]], cost: str, command: str,
             seconds: float) -> str:
    """The whole of docs/reliability.md."""
    lines = [
        "# Reliability: faults tried and held",
        "",
        f"Generated by `{command}` on {torch.tpu.platform_name()} ({datetime.date.today().isoformat()}, "
        f"{seconds:.0f} s); every section below comes from that script, so edit it, not this file.",
        "A fault *holds* when it raises the error PyTorch's CPU path raises (or, for Ctrl-C, interrupts without",
        "aborting the process or damaging a tensor) and the session computes correctly afterwards. Each case is",
        "the one a test runs (`tests/fault_cases.py` and the tests named below), with the test's own check.",
        "",
        "## Faults tried",
        "",
        "| category | tried | held | notes |",
        "|---|---:|---:|---|",
        *(f"| {title} | {o.tried} | {o.held} | {o.notes} |" for title, o, _ in rows),
        "",
        "## How each category is tried",
        "",
        *(f"- **{title}**: {_description(fn)}" for title, _, fn in rows),
        "",
        cost.rstrip("\n"),
    ]
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--storm", type=int, default=25, help="SIGINTs per storm (0: skip the storms)")
    p.add_argument("--cost", action="store_true", help="measure the cost of the error checks (minutes)")
    p.add_argument("--cost-pairs", type=int, default=3, help="checks-on/checks-off run pairs")
    p.add_argument("--cost-reps", type=int, default=2,
                   help="train_step.py --reps (2: the whole --cost run stays near 10 minutes on 2 busy cores)")
    p.add_argument("--cost-iters", type=int, default=8, help="train_step.py --iters")
    p.add_argument("--cost-clock", choices=("wall", "cpu"), default="cpu",
                   help="train_step.py --clock (cpu: the process's CPU time, steadier on a shared machine)")
    p.add_argument("--out", default=str(ROOT / "docs" / "reliability.md"))
    args = p.parse_args(argv)
    out = pathlib.Path(args.out)
    t0 = time.time()
    rows = []
    if args.storm:
        rows.append((STORM_TITLE, storm(args.storm), storm))
    for title, category in CATEGORIES:
        print(f"{title} ...", flush=True)
        rows.append((title, category(), category))
    cost = (measure_cost(args.cost_pairs, args.cost_reps, args.cost_iters, args.cost_clock) if args.cost
            else kept_cost(out))
    command = " ".join(["python bench/faults_table.py", *(argv if argv is not None else sys.argv[1:])])
    text = document(rows, cost, command, time.time() - t0)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(text)
    print(text)


if __name__ == "__main__":
    main()
