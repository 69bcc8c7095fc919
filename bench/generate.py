"""``model.generate`` tokens/s on tpu against PyTorch on the CPU, in one run: cold (first call, empty persistent
compile cache: what a new session pays) and warm (median of later calls), and the programs each built.

Rows per model (tiny random-init Llama and GPT-2 from ``transformers``, one 7-token prompt, greedy):

- ``tpu default cache``: fused eager, ``DynamicCache`` (runtime/growth.py + runtime/padded_attention.py);
- ``tpu static cache``: fused eager, ``cache_implementation="static"`` (``disable_compile=True``);
- ``tpu torch.compile``: static cache with ``transformers``' own ``torch.compile`` of the forward, which on a
  tpu device uses ``backend="tpu"``;
- ``cpu eager``: PyTorch CPU, default cache, PyTorch's default intra-op threads; ``cpu eager 1 thread``: the same
  with ``torch.set_num_threads(1)`` for its calls; ``cpu inductor``: PyTorch CPU, static cache, the forward compiled
  by ``torch.compile`` (Inductor).

"warm vs cpu eager" divides by the *faster* of the two CPU eager rows: on a machine whose cores other processes
also use, PyTorch's intra-op threads wait on each other (measured at load 6 on 2 cores: 27-37 tok/s with 2
threads, 159 with 1), and a ratio against that would flatter the tpu rows. The load average is printed with
the tables.

Every row's tokens are checked against CPU eager's. The warm calls of the rows are interleaved (round robin), so a
shared machine's changing load falls on all rows alike. Usage::

    python bench/generate.py [--tokens 32] [--models llama,gpt2] [--reps 3] [--width 64] [--batch 2]
    python bench/generate.py --kernels   # host microseconds per call of a decode step's generation kernels
    python bench/generate.py --split     # where a warm decode token goes: ops recorded, handed to Python, syncs,
                                         # the decode program's device time
    python bench/generate.py --attention-ab [--static]  # decode attention through the native core vs the Python
                                                        # kernel, alternate rounds of one process (--static: over a
                                                        # static cache's whole buffers)
    python bench/generate.py --bounded-ab --batch 2  # a left-padded batch's mask ops (bounded.py's one-call
                                                     # rewrites) recorded in C++ vs made in Python, the same way
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
import warnings

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))
# an empty persistent cache, set before torchtpu_lab is imported: "cold" means what a new session pays
os.environ.setdefault("TORCHTPU_LAB_CACHE_DIR", tempfile.mkdtemp(prefix="bench_generate_cache_"))

import torch

import torchtpu_lab
from bench.common import table
from torchtpu_lab import telemetry

PROMPT = 7
VOCAB = 97


def build(kind: str, width: int):
    """A tiny random-init model without an end token (every call generates all it is asked for)."""
    from transformers import GPT2Config, GPT2LMHeadModel, LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    none = {"bos_token_id": None, "eos_token_id": None, "pad_token_id": None}
    if kind == "llama":
        return LlamaForCausalLM(LlamaConfig(vocab_size=VOCAB, hidden_size=width, intermediate_size=2 * width,
                                            num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=4,
                                            max_position_embeddings=512, **none)).eval()
    return GPT2LMHeadModel(GPT2Config(n_layer=2, n_embd=width, n_head=4, vocab_size=VOCAB, n_positions=512,
                                      **none)).eval()


def prompts(batch: int) -> tuple:
    """``batch`` prompts of ``PROMPT`` tokens and the ``generate`` arguments they need: above one, the first is
    left-padded by 3 positions, with an attention mask."""
    prompt = torch.randint(1, VOCAB, (batch, PROMPT), generator=torch.Generator().manual_seed(1))
    if batch == 1:
        return prompt, {}
    mask = torch.ones(batch, PROMPT, dtype=torch.long)
    prompt[0, :3], mask[0, :3] = 0, 0
    return prompt, {"attention_mask": mask, "pad_token_id": 0}


def programs() -> int:
    return int(telemetry.counters["compiles"] + telemetry.counters["disk_loads"])


def call(model, prompt, tokens: int, kwargs: dict) -> tuple:
    """(output tokens on the CPU, seconds) of one ``generate`` (``kwargs["threads"]``: PyTorch's intra-op threads
    for this call only)."""
    kwargs = dict(kwargs)
    threads, before = kwargs.pop("threads", None), torch.get_num_threads()
    device = next(model.parameters()).device
    if threads is not None:
        torch.set_num_threads(threads)
    try:
        t0 = time.perf_counter()
        kwargs = {k: v.to(device) if isinstance(v, torch.Tensor) else v for k, v in kwargs.items()}
        with torch.no_grad():
            out = model.generate(prompt.to(device), max_new_tokens=tokens, do_sample=False, **kwargs)
        if device.type == "tpu":
            torchtpu_lab.sync()
        return out.cpu(), time.perf_counter() - t0
    finally:
        torch.set_num_threads(before)


def measure(rows: dict, prompt, tokens: int, reps: int) -> dict:
    """Per row: (cold tokens/s, warm tokens/s, programs built by the first call, by the later ones, tokens equal
    CPU eager's), or a string saying why the row could not run.

    Every row's first call runs first (cold, in order); then the warm calls go round the rows ``reps`` times, so
    a change in the machine's load (other processes on a shared machine) falls on every row alike and the ratios
    to CPU eager stay comparable."""
    results: dict = {}
    expected = None
    for name, (model, kwargs) in rows.items():
        try:
            before = programs()
            out, cold = call(model, prompt, tokens, kwargs)
        except Exception as e:  # noqa: BLE001 — reported in the table, not hidden
            results[name] = f"n/a ({type(e).__name__}: {str(e)[:60]})"
            continue
        expected = out if expected is None else expected  # the first row is CPU eager
        results[name] = {"cold": cold, "first": programs() - before, "later": 0, "warm": [],
                         "equal": torch.equal(out, expected)}
    for _ in range(reps):
        for name, (model, kwargs) in rows.items():
            r = results[name]
            if isinstance(r, str):
                continue
            before = programs()
            out, dt = call(model, prompt, tokens, kwargs)
            r["later"] += programs() - before
            r["warm"].append(dt)
            r["equal"] = r["equal"] and torch.equal(out, expected)
    return {name: r if isinstance(r, str) else
            (tokens / r["cold"], tokens / statistics.median(r["warm"]), r["first"], r["later"], r["equal"])
            for name, r in results.items()}


def kernels(reps: int) -> None:
    """Host CPU time per call (fused eager: recorded, run at the sync after the timing) of the kernels a decode step
    adds per layer — a KV append into padded storage and attention over it — and of its projections (``linear``
    without a gradient, backend/linear_grad.py), next to a plain ``add``, in one
    process, the kinds interleaved (round robin) so a changing load falls on all alike."""
    F = torch.nn.functional
    piece, q = torch.ones(1, 4, 1, 16, device="tpu"), torch.ones(1, 4, 1, 16, device="tpu")
    x, w = torch.ones(1, 1, 64, device="tpu"), torch.ones(128, 64, device="tpu")
    cache = [None]

    def fresh():  # a cache of 7 positions in padded storage (capacity 64): 40 appends stay in one bucket
        cache[0] = torch.cat([torch.tensor([], device="tpu"), torch.zeros(1, 4, 7, 16, device="tpu")], -2)

    def append():
        cache[0] = torch.cat([cache[0], piece], -2)

    calls = {"append (torch.cat into padded storage)": append,
             "attention (F.scaled_dot_product_attention over it)": lambda: F.scaled_dot_product_attention(
                 q, cache[0], cache[0]),
             "linear (F.linear, no gradient: a projection of the step)": lambda: F.linear(x, w),
             "add (a plain op, for scale)": lambda: piece.add(1.0)}
    samples: dict = {name: [] for name in calls}
    with torch.no_grad():
        for rep in range(reps + 2):  # the first two rounds compile and warm up
            for name, fn in calls.items():
                fresh()
                torchtpu_lab.sync()
                t0 = time.process_time()  # CPU time of this process: what the neighbours' load does not inflate
                for _ in range(40):
                    fn()
                dt = (time.process_time() - t0) / 40
                torchtpu_lab.sync()
                if rep >= 2:
                    samples[name].append(dt)
    rows = [(name, f"{statistics.median(v) * 1e6:.1f}") for name, v in samples.items()]
    print(table(f"generation kernels: host CPU us per call, median of {reps} x 40 (load average "
                f"{' '.join(f'{x:.1f}' for x in os.getloadavg())})", rows, ("kernel", "us per call")))


def split(models: list, width: int, reps: int) -> None:
    """Where a warm token of ``generate`` goes, per model and cache (fused eager, and the static cache with
    ``transformers``' own ``torch.compile``): wall ms per token (median of ``reps`` calls) next to CPU eager's with
    the same cache (one intra-op thread); per token, the ops the native core recorded, the calls it handed to
    Python (by op: those kernels are Python), the syncs; and the device time of one run of the program run most
    often (the decode step's), as a profile times it."""
    from torchtpu_lab.profiling import programs as program_rows
    from torchtpu_lab.runtime import recording

    static = {"cache_implementation": "static", "max_cache_len": 128, "disable_compile": True}
    tokens, rows = 32, []
    for kind in models:
        prompt = torch.randint(1, VOCAB, (1, PROMPT), generator=torch.Generator().manual_seed(1))
        cpu, tpu, compiled = build(kind, width), build(kind, width).to("tpu"), build(kind, width).to("tpu")
        compile_kwargs = {k: v for k, v in static.items() if k != "disable_compile"}
        for cache, model, kwargs in (("default", tpu, {}), ("static", tpu, static),
                                     ("static, torch.compile", compiled, compile_kwargs)):
            for _ in range(2):  # compile and warm up
                call(model, prompt, tokens, kwargs)
            times = {"tpu": [], "cpu": []}
            for _ in range(reps):
                times["tpu"].append(call(model, prompt, tokens, kwargs)[1])
                same_cache = {**static, "threads": 1} if kwargs else {"threads": 1}
                times["cpu"].append(call(cpu, prompt, tokens, same_cache)[1])
            before, syncs = recording.stats(), telemetry.counters["syncs"]
            call(model, prompt, tokens, kwargs)
            after, syncs = recording.stats(), telemetry.counters["syncs"] - syncs
            handed = {op: n - before.get("python_ops", {}).get(op, 0) for op, n in after.get("python_ops", {}).items()}
            handed = ", ".join(f"{op.removeprefix('aten::')} {n / tokens:.1f}"
                               for op, n in sorted(handed.items(), key=lambda kv: -kv[1]) if n)
            with torchtpu_lab.profile() as prof:
                call(model, prompt, tokens, kwargs)
            step = max(program_rows.profile_programs(prof), key=lambda r: r.runs)
            per_token = {k: statistics.median(v) / tokens * 1e3 for k, v in times.items()}
            rows.append((kind, cache, f"{per_token['tpu']:.2f}", f"{per_token['cpu']:.2f}",
                         f"{(after.get('recorded', 0) - before.get('recorded', 0)) / tokens:.0f}", handed or "-",
                         f"{syncs / tokens:.2f}",
                         f"{step.device_s / step.runs * 1e3:.2f} ({step.name}, {step.runs} runs)"))
    print(table(f"where a warm token of generate goes (fused eager, {tokens} tokens, width {width}, median of {reps}; "
                f"load average {' '.join(f'{x:.1f}' for x in os.getloadavg())})", rows,
                ("model", "cache", "tpu ms/token", "cpu eager ms/token (1 thread)", "ops recorded in C++",
                 "calls handed to Python, per token", "syncs/token", "step program device ms/run")))


def paired_ab(models: list, width: int, rounds: int, batch: int, what: str, switch, cache: dict | None = None) -> None:
    """Warm ``generate`` with a part of the native core on (``C++``) and off (``Python``: ``switch()`` turns it
    off for a round and returns what turns it back on), in alternate rounds of one process: ms per token,
    medians of the rounds, and the median of the rounds' paired ratios (a noisy machine's drift falls on both
    alike). ``batch`` above 1: left-padded prompts with a mask, as the main table's ``--batch``; ``cache``: more
    ``generate`` arguments (a static cache's)."""
    from torchtpu_lab import native

    if native.module() is None:
        print("no native core: nothing to compare")
        return
    tokens, per_round, rows = 32, 12, []
    for kind in models:
        model = build(kind, width).to("tpu")
        prompt, kwargs = prompts(batch)
        kwargs = {**kwargs, **(cache or {})}
        for _ in range(3):
            call(model, prompt, tokens, kwargs)
        times: dict = {"C++": [], "Python": []}
        for r in range(rounds):
            for path in ("C++", "Python") if r % 2 == 0 else ("Python", "C++"):
                restore = switch() if path == "Python" else None
                call(model, prompt, tokens, kwargs)
                samples = [call(model, prompt, tokens, kwargs)[1] / tokens * 1e3 for _ in range(per_round)]
                times[path].append(statistics.median(samples))
                if restore is not None:
                    restore()
        paired = statistics.median(a / b for a, b in zip(times["C++"], times["Python"]))
        rows.append((kind, f"{statistics.median(times['C++']):.3f}", f"{statistics.median(times['Python']):.3f}",
                     f"{paired:.3f}"))
    print(table(f"warm generate, {what} in C++ vs Python ({tokens} tokens, width {width}, batch {batch}, "
                f"{'static' if cache else 'default'} cache, "
                f"{rounds} alternate rounds of {per_round} calls; load average "
                f"{' '.join(f'{x:.1f}' for x in os.getloadavg())})", rows,
                ("model", "C++ ms/token", "Python ms/token", "paired ratio C++/Python")))


def python_attention():
    """A decode step's attention through the Python autograd kernel (``padded_attention.autograd_attention``,
    registered over the C++ one, whose call below autograd reaches the recording kernel) until the returned
    function removes it."""
    from torchtpu_lab.runtime import padded_attention

    lib = torch.library.Library("aten", "IMPL")
    with warnings.catch_warnings():  # "overriding a previously registered kernel": the point
        warnings.simplefilter("ignore")
        lib.impl(torch.ops.aten.scaled_dot_product_attention.default, padded_attention.autograd_attention,
                 "AutogradPrivateUse1")
    return lib._destroy


def python_rewrites():
    """``runtime/bounded.py``'s rewrites of one inner call (a pointwise op on fronts, ``arange`` of a growing
    length: a left-padded batch's mask ops) left to Python until the returned function gives them back to the
    recording kernel."""
    from torchtpu_lab.runtime import bounded

    bounded.NATIVE[0] = False
    return lambda: bounded.NATIVE.__setitem__(0, True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--tokens", type=int, default=32)
    parser.add_argument("--models", default="llama,gpt2")
    parser.add_argument("--reps", type=int, default=3)
    parser.add_argument("--width", type=int, default=64)
    parser.add_argument("--batch", type=int, default=1,
                        help="prompts per call; above 1 the first is left-padded by 3 positions, with an "
                             "attention_mask (transformers then rebuilds a 4-d mask from the length every token)")
    parser.add_argument("--kernels", action="store_true", help="time the generation kernels per call instead")
    parser.add_argument("--split", action="store_true", help="where a warm decode token goes, per model and cache")
    parser.add_argument("--attention-ab", action="store_true",
                        help="a decode step's attention in C++ vs through the Python autograd kernel, in one process")
    parser.add_argument("--static", action="store_true",
                        help="with --attention-ab: a static cache (attention over its whole buffers)")
    parser.add_argument("--bounded-ab", action="store_true",
                        help="bounded.py's one-call rewrites (a left-padded batch's mask ops) recorded in C++ vs "
                             "made in Python, in one process (use with --batch 2)")
    args = parser.parse_args()
    if args.attention_ab or args.bounded_ab:
        what, switch = (("decode attention", python_attention) if args.attention_ab
                        else ("bounded.py's one-call rewrites", python_rewrites))
        static = {"cache_implementation": "static", "max_cache_len": 128, "disable_compile": True}
        cache = static if args.static else None
        paired_ab(args.models.split(","), args.width, max(args.reps, 8), args.batch, what, switch, cache)
        return
    if args.kernels:
        kernels(max(args.reps, 5))
        return
    if args.split:
        split(args.models.split(","), args.width, max(args.reps, 5))
        return
    static = {"cache_implementation": "static", "max_cache_len": 128}
    load0 = " ".join(f"{x:.1f}" for x in os.getloadavg())
    rows = []
    for kind in args.models.split(","):
        prompt, masked = prompts(args.batch)
        inductor = build(kind, args.width)
        inductor.forward = torch.compile(inductor.forward, backend="inductor")
        tpu = build(kind, args.width).to("tpu")
        eager = build(kind, args.width)
        results = measure({
            "cpu eager": (eager, masked),
            "cpu eager 1 thread": (eager, {**masked, "threads": 1}),
            "cpu inductor": (inductor, {**masked, **static, "disable_compile": True}),
            "tpu default cache": (tpu, masked),
            "tpu static cache": (tpu, {**masked, **static, "disable_compile": True}),
            "tpu torch.compile": (build(kind, args.width).to("tpu"), {**masked, **static}),
        }, prompt, args.tokens, args.reps)
        base = max(r[1] for name, r in results.items() if name.startswith("cpu eager") and not isinstance(r, str))
        for name, r in results.items():
            if isinstance(r, str):
                rows.append((kind, name, r, "", "", "", "", ""))
                continue
            cold, warm, first, later, equal = r
            rows.append((kind, name, f"{cold:.2f}", f"{warm:.2f}", f"{warm / base:.2f}x", f"{warm / cold:.1f}x",
                         f"{first} + {later}", "yes" if equal else "NO"))
        print(table(f"{kind}: {args.tokens} new tokens, prompt {PROMPT}, batch {args.batch}, width {args.width}",
                    rows[-len(results):],
                    ("model", "row", "cold tok/s", "warm tok/s", "warm vs cpu eager", "warm/cold",
                     "programs (first + later)", "tokens = cpu")), flush=True)
    print()
    print(table(f"generate: {args.tokens} new tokens (cold: first call, empty persistent cache; warm: median of "
                f"{args.reps}, the rows' warm calls interleaved; vs the faster CPU eager row; load average "
                f"{' '.join(f'{x:.1f}' for x in os.getloadavg())} at the end, {load0} at the start)", rows,
                ("model", "row", "cold tok/s", "warm tok/s", "warm vs cpu eager", "warm/cold",
                 "programs (first + later)", "tokens = cpu")))


if __name__ == "__main__":
    main()
