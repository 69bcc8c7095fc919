"""``transformers.Trainer`` with default arguments (``adamw_torch_fused``, gradient clipping, its nan/inf loss
filter) training a tiny random-init GPT-2: host CPU time per step on tpu (fused eager) against the same Trainer on
PyTorch's CPU, each in a process of its own (median over the steps after a warm-up), with the syncs per step and
the calls handed to Python per step on tpu.

    python bench/trainer_step.py [--steps 60] [--warmup 20]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import textwrap

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))

from bench.common import table  # noqa: E402

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

_SCRIPT = """
import json, statistics, sys, time, torch, torchtpu_lab
from torch.utils.data import Dataset
from transformers import GPT2Config, GPT2LMHeadModel, Trainer, TrainerCallback, TrainingArguments
from torchtpu_lab import telemetry
from torchtpu_lab.runtime import recording

device, out_dir, steps, warmup = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4])

class Tokens(Dataset):
    def __init__(self):
        self.x = torch.randint(0, 64, (4 * steps, 12), generator=torch.Generator().manual_seed(0))
    def __len__(self):
        return len(self.x)
    def __getitem__(self, i):
        return {"input_ids": self.x[i], "labels": self.x[i]}

class Timer(TrainerCallback):
    times, syncs, python = [], [], []
    def on_step_begin(self, args, state, control, **kw):
        self.t, self.s = time.process_time(), telemetry.counters["syncs"]
        self.p = recording.stats().get("python", 0)
    def on_step_end(self, args, state, control, **kw):
        if state.global_step > warmup:
            self.times.append(time.process_time() - self.t)
            self.syncs.append(telemetry.counters["syncs"] - self.s)
            self.python.append(recording.stats().get("python", 0) - self.p)

torch.set_num_threads(1)
torch.manual_seed(0)
config = GPT2Config(vocab_size=64, n_positions=16, n_embd=32, n_layer=2, n_head=2, resid_pdrop=0.0,
                    embd_pdrop=0.0, attn_pdrop=0.0)
args = TrainingArguments(output_dir=out_dir, per_device_train_batch_size=4, max_steps=steps, logging_steps=10 ** 6,
                         report_to=[], save_strategy="no", use_cpu=device == "cpu", disable_tqdm=True)
Trainer(model=GPT2LMHeadModel(config), args=args, train_dataset=Tokens(), callbacks=[Timer()]).train()
print(json.dumps({"ms": statistics.median(Timer.times) * 1e3, "syncs": statistics.median(Timer.syncs),
                  "python": statistics.median(Timer.python), "optim": str(args.optim)}))
"""


def run(device: str, steps: int, warmup: int) -> dict:
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(p for p in (ROOT, os.environ.get("PYTHONPATH")) if p))
    env.setdefault("TORCHTPU_LAB_PLATFORM", "cpu")
    with tempfile.TemporaryDirectory() as out_dir:
        done = subprocess.run([sys.executable, "-c", textwrap.dedent(_SCRIPT), device, out_dir, str(steps),
                               str(warmup)], env=env, capture_output=True, text=True, timeout=1800)
    if done.returncode != 0:
        raise RuntimeError(f"the {device} run failed:\n{done.stderr[-3000:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=60)
    parser.add_argument("--warmup", type=int, default=20)
    args = parser.parse_args()
    tpu, cpu = run("tpu", args.steps, args.warmup), run("cpu", args.steps, args.warmup)
    rows = [("tpu (fused eager)", f"{tpu['ms']:.2f}", f"{tpu['ms'] / cpu['ms']:.2f}x", f"{tpu['syncs']:g}",
             f"{tpu['python']:g}"),
            ("PyTorch CPU eager", f"{cpu['ms']:.2f}", "1.00x", "", "")]
    print(table(f"transformers Trainer, default arguments ({tpu['optim']}), tiny GPT-2, host CPU ms per step "
                f"(median of {args.steps - args.warmup})", rows,
                ("device", "ms/step", "vs CPU", "syncs/step", "calls handed to Python/step")))


if __name__ == "__main__":
    main()
