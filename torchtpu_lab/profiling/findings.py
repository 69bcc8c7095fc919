"""What a report tells the user to do: findings ranked so that what they can act on comes first.

Rules, each read from the profile's fields (never from our own sentences):

* **One-time warm-up is not an issue.** A first compile, and a first step that differs from the steps after it
  (an optimizer creating its state in its first ``step()``, buffers created lazily), is compiled once: it is
  said as "one-time warm-up", after the actionable findings, and "steady state compiles N" counts the rest.
  A recompile is warm-up when it came at the first or second time its triggering line ran and that line ran
  again afterwards without compiling, or when its line ran only once in the block (code after a loop).
* **Shares are of the steady-state time** (the cell's wall time less its warm-up compiles): a run ten times
  longer repeats the steady state, not the warm-up. Findings below :data:`NOISE` of it are noise and left out;
  the report then says "no significant issue". Recompiles that recur are said however cheap (they grow).
* **Advice must be followable.** A sync or compile inside library code (torch.optim, transformers) names the
  library frame and the fix its caller can apply (an argument of the call), never "keep the value on the
  device" at a line the user cannot edit.
* **Host-bound steps are a finding** (many ops per step, the host busy while the device idles) with the fixes
  that remove per-op host work: ``torch.compile(backend="tpu")``, a foreach optimizer.
* **Each torch.compile graph break is a finding** with the fix for its reason.
"""

from __future__ import annotations

import bisect
import os
from collections import Counter

from ..causes import CauseKind
from ..records import CompileGroup, FallbackGroup, Finding, GenerationStats, GraphBreakRow, Summary, SyncGroup
from ..telemetry import Source, code_text, describe
from . import gc_pauses

#: findings under this share of the steady-state time are noise (timer jitter, a one-off read)
NOISE = 0.05

#: ops that create a tensor from nothing: a first step that has them where the next step computes is creating
#: state (an optimizer's moments, a lazily built buffer)
_CREATION_OPS = ("full_like", "zeros_like", "ones_like", "empty_like", "aten::full", "aten::zeros", "aten::empty",
                 "new_zeros", "new_full", "new_empty", "scalar_tensor", "aten::ones")

#: what a profile suggests for a value read in a loop (a ``.item()`` or ``print`` per step) in the user's code
KEEP_ON_DEVICE = ("keep the value on the device (accumulate in a tensor) and read it once at the end, or log it "
                  "with torchtpu_lab.log_scalar(name, tensor): logged values come back together at a sync that "
                  "happens anyway (torchtpu_lab.scalars() returns them)")


def is_state_creation(cause) -> bool:
    """The cause says a first step created tensors where the next step computes."""
    if cause is None or cause.kind not in (CauseKind.SEQUENCE, CauseKind.DATA_FLOW, CauseKind.GROW):
        return False
    return any(isinstance(v, str) and any(op in v for op in _CREATION_OPS) for v in (cause.old, cause.new))


#: how far back from a compile to look for the sync or op that holds it (they nest: the holder starts just
#: before the compile, on the same thread)
_LOOK_BACK = 256


def _enclosing(event, triggers: list, starts: list):
    """The innermost trigger (sync or op; sorted by start) whose time span holds ``event``: the latest-starting
    one that holds it."""
    i = bisect.bisect_right(starts, event.t + 1e-9)
    for t in reversed(triggers[max(0, i - _LOOK_BACK):i]):
        if event.t + event.dur <= t.t + t.dur + 1e-9:
            return t
    return None


def compile_visits(prof) -> dict[int, tuple[int, bool, int]]:
    """For each compile event (by id) that a sync or op triggered: how many times that trigger (same kind,
    reason and line) ran before it in this block, whether it ran again afterwards without compiling, and how
    many times it ran afterwards. Computed once per state of the profile (the summary and the groups ask)."""
    key = (len(prof.events), prof.wall_s)
    memo = getattr(prof, "_compile_visits", None)
    if memo is not None and memo[0] == key:
        return memo[1]
    triggers = sorted((e for e in prof.events if e.kind in ("sync", "op")), key=lambda e: e.t)
    starts = [t.t for t in triggers]
    compiles = sorted(prof.compiles, key=lambda e: e.t)
    holder = {id(c): _enclosing(c, triggers, starts) for c in compiles}
    compiled_in = {id(t) for t in holder.values() if t is not None}
    runs: dict[tuple, list] = {}  # each trigger's runs, in order
    for t in triggers:
        runs.setdefault((t.kind, t.name, t.source), []).append(t)
    out: dict[int, tuple[int, bool, int]] = {}
    for c in compiles:
        trigger = holder[id(c)]
        if trigger is None:
            continue
        same = runs[(trigger.kind, trigger.name, trigger.source)]
        visit = next(i for i, t in enumerate(same) if t is trigger)
        last = max(i for i, t in enumerate(same) if id(t) in compiled_in)  # the trigger's last compiling run
        # settled: the trigger compiled only in its first two runs, then ran on without compiling
        out[id(c)] = (visit, last <= 1 and len(same) > last + 1, len(same) - visit - 1)
    prof._compile_visits = (key, out)
    return out


def warmup_compiles(prof, visits: dict[int, tuple[int, bool, int]]) -> set[int]:
    """Ids of the compile events that are one-time warm-up (see the module docstring): first compiles, a
    compile at the first or second run of its trigger that later runs reuse, and one for code that ran once in
    the block (it cannot recur in it; a re-run of the cell finds it cached)."""
    out: set[int] = set()
    for c in prof.compiles:
        cause = c.detail.get("cause")
        visit, settled, repeats = visits.get(id(c), (None, False, 0))
        once = visit == 0 and repeats == 0
        if cause is None or cause.kind.first or once or (visit is not None and visit <= 1 and settled):
            out.add(id(c))
    return out


def bucket_hint(values: list[int], dim: int) -> str:
    """Pad or bucket a dim, only when a bucket size makes fewer shapes than the cell's own values; else ``""``."""
    distinct = sorted(set(values))
    for size in (8, 16, 32, 64, 128, 256, 512):
        buckets = len({-(-v // size) for v in distinct})
        if buckets < len(distinct):
            return (f"pad or bucket dim {dim} to a multiple of {size} ({buckets} shape{'s' if buckets != 1 else ''} "
                    f"instead of {len(distinct)} for this cell's sizes {', '.join(map(str, distinct[:8]))}"
                    f"{'…' if len(distinct) > 8 else ''})")
    return ""


def _library_name(lib: Source) -> str:
    parts = lib.filename.replace(os.sep, "/").split("/")
    for anchor in ("site-packages", "dist-packages"):
        if anchor in parts:
            rest = parts[parts.index(anchor) + 1:]
            if rest[:1] == ["torch"] and len(rest) > 1:
                return "torch." + rest[1]
            return rest[0] if rest else lib.filename
    if "torch" in parts:
        i = len(parts) - 1 - parts[::-1].index("torch")
        return "torch." + parts[i + 1] if i + 1 < len(parts) else "torch"
    return os.path.basename(lib.filename)


def library_where(lib: Source) -> str:
    """``torch.optim (adamw.py:123, _single_tensor_adamw())``: the library frame, named for people."""
    return f"{_library_name(lib)} ({os.path.basename(lib.filename)}:{lib.lineno}, {lib.function}())"


def sync_advice(lib: Source | None, line: str, count: int) -> tuple[str, str]:
    """``(hint, fix)`` for value reads at ``line``: where and how often, and the fix; when the reads happen
    inside a library, the fix its caller can apply."""
    if lib is None:
        fix = KEEP_ON_DEVICE
        hint = f"{count} value reads at {line}: a line that runs repeatedly and stops the device each time; {fix}"
        return hint, fix
    name, text = _library_name(lib), code_text(lib, 200)
    where = f"{count} value reads inside {library_where(lib)}, called from {line}"
    if name == "torch.optim":
        fix = ("the optimizer reads a tensor back each step (a tensor lr, or its step count): construct it with "
               "capturable=True (state and step stay on the device) and keep lr a Python float")
    elif name == "transformers" and "pad_token_id" in text:
        fix = ("transformers looks for padding in input_ids when no attention mask is given: pass "
               "attention_mask=... to the call")
    elif name == "transformers" and "unfinished_sequences" in text:
        fix = ("generate() reads after every token whether all sequences have finished (its stopping criteria), "
               "so every token waits for its program; the read is generate's own, and what shortens the wait is "
               'a cheaper token: cache_implementation="static", which transformers compiles (torch.compile, '
               "backend 'tpu' on a tpu device)")
    else:
        fix = (f"this library code reads a value back (`{text}`): look for an argument of the call that avoids "
               "it, or call it once outside the loop")
    return f"{where}: {fix}", fix


def scalar_advice(lib: Source | None) -> str:
    """What to do about a Python number that changes every step and is baked into the graph."""
    if lib is None:
        return ("the number is baked into the graph as a constant: pass it as a tpu tensor "
                "(torch.tensor(x, device='tpu')) so it becomes an input")
    if _library_name(lib) == "torch.optim":
        return (f"the number is computed inside {library_where(lib)} from the step count (bias correction): "
                "construct the optimizer with capturable=True so it is computed on the device; keep lr a "
                "Python float (a tensor lr is read back every step)")
    return (f"the number is computed inside {library_where(lib)}: look for an argument of the call that keeps "
            "it constant, or compile the step with torch.compile(backend='tpu')")


def graph_break_fix(reason: str) -> str:
    """The fix for one torch.compile graph break, from Dynamo's reason."""
    r = reason.lower()
    if "item" in r or "scalar output" in r or "capture_scalar_outputs" in r:
        return ("a tensor's value is read inside the compiled function: move the .item() out of it, or set "
                "torch._dynamo.config.capture_scalar_outputs = True")
    if "print" in r or "logging" in r or "builtin" in r:
        return "move the print or logging call out of the compiled function (log a detached tensor after it)"
    if "data-dependent" in r or "generic_jump" in r or "jump" in r or "branch" in r:
        return ("Python control flow depends on a tensor's value: use torch.where or torch.cond, or decide the "
                "branch outside the compiled function")
    if "unsupported" in r or "call_function" in r:
        return ("move this call out of the compiled function, or replace it with torch ops; "
                "torch._dynamo.explain(fn)(*args) lists every break")
    return "torch._dynamo.explain(fn)(*args) lists every break with its reason; move the line out of the function"


def _visits(events) -> Counter:
    """How many separate times each source line issued ops (consecutive ops at one line are one visit)."""
    visits: Counter = Counter()
    prev = None
    for e in events:
        if e.source != prev:
            visits[e.source] += 1
            prev = e.source
    return visits


def _host_bound(prof, s: Summary, steady_s: float, syncs: list[SyncGroup],
                generated: GenerationStats | None) -> Finding | None:
    """The host (Python, recording ops, our overhead) takes most of the steady state while the device waits
    little: many small ops per step.

    A step is what the cell repeats: the pass between the syncs repeated most at one line (``loss.item()``,
    ``torchtpu_lab.sync()``, ``generate``'s stop check), else a token of a generation without such syncs
    (``generated``, from :func:`.generation.generation_stats`: one sequence's appends, so not several ``generate``
    calls' tokens), else one visit of the busiest line, which undercounts a step whose line runs once per layer.
    A cell that generated counts per token."""
    ops = [e for e in prof.ops if e.source is not None]
    if not ops or steady_s <= 0:
        return None
    host = s.host_s
    if host / steady_s < 0.5:
        return None
    per_line = Counter(e.source for e in ops)
    busiest, n_busiest = per_line.most_common(1)[0]
    repeated = max((g.count for g in syncs), default=0)
    if repeated >= 2:
        steps = repeated
    else:
        steps = generated.tokens if generated is not None else _visits(ops)[busiest]
    unit = "step" if generated is None else "token"
    per_step = len(prof.ops) / max(steps, 1)
    if steps < 2 or per_step < 20:
        return None
    code = code_text(busiest)
    fixes = []
    if generated is not None:
        fixes.append('for transformers\' generate(): cache_implementation="static", and transformers compiles the '
                     "decode step (torch.compile, backend 'tpu' on a tpu device): one program call per token")
    fixes.append(f"run the {unit} as one program: torch.compile(step_fn, backend='tpu') (no per-op host work)")
    if "step(" in code:
        fixes.append("a foreach optimizer (foreach=True) issues one op per kind of update instead of one per "
                     "parameter")
    fixes.append(f"fewer, larger ops (batch more per {unit})")
    return Finding(f"host-bound: {per_step:.0f} ops/{unit}, mostly at {describe(busiest)}", host,
                   f"{n_busiest // steps} of them per {unit} at `{code}`; the host spends "
                   f"{100 * host / steady_s:.0f}% of the steady state issuing ops while the device waits",
                   "; ".join(fixes), host / steady_s, True, "of the steady state")


def _collector_pauses(prof, s: Summary) -> Finding | None:
    """Python's garbage collector stopped the block for a noticeable share of it. Last among the actionable
    findings: its cause is everything the process holds, not a line of the cell."""
    share = s.gc_s / (prof.wall_s or 1e-9)
    if share < NOISE:
        return None
    full = sum(1 for *_, generation in gc_pauses.pauses(prof.gc_spans) if generation == 2)
    n = s.gc_pauses
    return Finding("pauses of Python's garbage collector", s.gc_s,
                   f"{n} collection{'s' if n != 1 else ''}, {full} of them full: a full collection scans every "
                   "object the process holds (models, data, compiled graphs from earlier cells), however little "
                   "this cell allocates",
                   "call gc.freeze() once after building the model and loading data (what exists then is never "
                   "scanned again), and drop references to large object graphs you no longer need",
                   share, True, "of the cell")


def findings(prof, s: Summary, groups: list[CompileGroup], syncs: list[SyncGroup], fallbacks: list[FallbackGroup],
             breaks: list[GraphBreakRow], generation: GenerationStats | None) -> list[Finding]:
    """Actionable findings first (line-level mistakes costliest first, then a host-bound step; noise left out),
    then one-time warm-up."""
    warm = [g for g in groups if g.kind in ("first", "warmup")]
    warm_s = sum(g.seconds for g in warm if not g.disk or g.kind == "warmup")
    # the collector's pauses are the process's heap, said on their own line: inside the steady state they would
    # shrink every share below the noise threshold
    steady = max(prof.wall_s - warm_s - s.gc_s, 1e-9)
    base = "of the steady state" if warm_s > 0 else "of the cell"
    found: list[tuple[Finding, bool]] = []  # (finding, said however cheap)

    def add(title: str, cost_s: float, detail: str, fix: str, grows: bool = False) -> None:
        found.append((Finding(title, cost_s, detail, fix, cost_s / steady, True, base), grows))

    for g in groups:
        if g.kind == "unrolled":
            add(f"{g.count} compile{'s' if g.count != 1 else ''} of an unrolled loop", g.seconds, g.pattern, g.hint,
                grows=True)
        elif g.is_recompile:
            add(f"{g.count} recompilation{'s' if g.count != 1 else ''}", g.seconds,
                g.pattern + (f" at {g.line}" if g.line else ""), g.hint, grows=True)
    for g in syncs:
        if g.loop:
            add(f"{g.count} host syncs from {g.reason}", g.wait_s, f"at {g.line}" + (f": {g.code}" if g.code else ""),
                g.fix or g.hint)
    if fallbacks:
        n = sum(f.count for f in fallbacks)
        add(f"{n} CPU fallback{'s' if n != 1 else ''}", sum(e.dur for e in prof.fallbacks),
            ", ".join(f"{f.op} at {f.line}" for f in fallbacks[:3]),
            "these ops have no tpu lowering and copy their data to the CPU and back")
    for b in breaks:
        add("torch.compile graph break", 0.0, f"at {b.line}: {b.reason}", graph_break_fix(b.reason), grows=True)
    kept = sorted((f for f, grows in found if f.share >= NOISE or grows), key=lambda f: -f.cost_s)[:3]
    # last among the actionable: its fix restructures the step (and would also remove the line-level costs
    # above), where theirs are one line each
    host = _host_bound(prof, s, steady, syncs, generation)
    if host is not None:
        kept.append(host)
    collector = _collector_pauses(prof, s)
    if collector is not None:
        kept.append(collector)
    one_time = [Finding(f"one-time warm-up: {g.count} compile{'s' if g.count != 1 else ''}", g.seconds,
                        g.pattern + (f" at {g.line}" if g.line else ""),
                        "" if g.kind == "first" else g.hint, g.seconds / (prof.wall_s or 1e-9), False)
                for g in warm if g.seconds / (prof.wall_s or 1e-9) >= NOISE]
    return kept + one_time
