"""``transformers.Trainer`` with default arguments (accelerate underneath, pinned-memory DataLoader) trains a tiny
random-init GPT-2 on tpu with the losses it has on CPU, with no extra code or environment variable."""

import json
import os
import subprocess
import sys
import textwrap

import pytest

from torchtpu_lab import native

pytest.importorskip("transformers")
pytest.importorskip("accelerate")
ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

_SCRIPT = """
import json, sys, torch, torchtpu_lab
from torch.utils.data import Dataset
from transformers import GPT2Config, GPT2LMHeadModel, Trainer, TrainingArguments

class Tokens(Dataset):
    def __init__(self):
        self.x = torch.randint(0, 64, (16, 12), generator=torch.Generator().manual_seed(0))
    def __len__(self):
        return len(self.x)
    def __getitem__(self, i):
        return {"input_ids": self.x[i], "labels": self.x[i]}

use_cpu = sys.argv[1] == "cpu"
torch.manual_seed(0)
config = GPT2Config(vocab_size=64, n_positions=16, n_embd=32, n_layer=2, n_head=2, resid_pdrop=0.0, embd_pdrop=0.0,
                    attn_pdrop=0.0)
model = GPT2LMHeadModel(config)
args = TrainingArguments(output_dir=sys.argv[2], per_device_train_batch_size=4, max_steps=4, logging_steps=1,
                         report_to=[], save_strategy="no", use_cpu=use_cpu, disable_tqdm=True)
trainer = Trainer(model=model, args=args, train_dataset=Tokens())
fused_calls = []
_fused_adamw = torch._fused_adamw_
torch._fused_adamw_ = lambda *a, **k: fused_calls.append(1) or _fused_adamw(*a, **k)
trainer.train()
from accelerate import PartialState
from torchtpu_lab import caches
print(json.dumps({"losses": [h["loss"] for h in trainer.state.log_history if "loss" in h],
                  "model": str(next(model.parameters()).device), "accelerate": str(PartialState().device),
                  "pin_memory": args.dataloader_pin_memory, "optim": str(args.optim),
                  "fused_calls": len(fused_calls),
                  "one_op_steps": caches.stats()["fused_adam_programs"]["hits"]
                                  + caches.stats()["fused_adam_programs"]["misses"]}))
"""


def _train(device: str, tmp_path) -> dict:
    env = dict(os.environ, TORCHTPU_LAB_PLATFORM="cpu")
    env.pop("ACCELERATE_TORCH_DEVICE", None)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (ROOT, env.get("PYTHONPATH", "")) if p)
    out = subprocess.run([sys.executable, "-c", textwrap.dedent(_SCRIPT), device, str(tmp_path / device)], env=env,
                         capture_output=True, text=True, timeout=900)
    assert out.returncode == 0, out.stderr[-4000:]
    return json.loads(out.stdout.strip().splitlines()[-1])


@pytest.mark.skipif(native.module() is None, reason=f"pin_memory needs the native core: {native.status().describe()}")
def test_trainer_with_default_arguments_trains_gpt2_on_tpu_like_on_cpu(tmp_path):
    tpu, cpu = _train("tpu", tmp_path), _train("cpu", tmp_path)
    assert tpu["model"] == "tpu:0" and tpu["accelerate"].startswith("tpu") and tpu["pin_memory"]
    assert cpu["model"] == "cpu" and cpu["accelerate"] == "cpu"
    assert len(tpu["losses"]) == len(cpu["losses"]) == 4
    assert tpu["losses"] == pytest.approx(cpu["losses"], rel=1e-4, abs=1e-4)
    # the default optimizer (adamw_torch_fused) ran each step as one op (runtime/optimizer_step.py) per parameter
    # group: the weights' and the biases' and norms' (GPT-2's Conv1D bias gradients are whole-storage views)
    assert "FUSED" in tpu["optim"] and tpu["fused_calls"] == 8 and tpu["one_op_steps"] == 8
