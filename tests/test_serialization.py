"""``torch.load`` onto the tpu device with every ``map_location`` form, and storage-level calls on tpu storages
(issue 24: ``map_location="tpu"`` used to end the process with a segmentation fault). Each case runs in a child
process and prints one line as it finishes, so a crash fails the test (naming the case it reached) instead of
killing pytest."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap

import pytest

from fault_cases import child_env

_PRELUDE = """
import json, sys, torch, torchtpu_lab

def report(name, ok, detail=""):
    print(json.dumps({"case": name, "ok": bool(ok), "detail": str(detail)[:400]}), flush=True)
"""


def _run_cases(body: str) -> dict:
    """Run ``body`` in a child process; the cases it reported, by name (a crash: the exit code, in the error)."""
    out = subprocess.run([sys.executable, "-c", _PRELUDE + textwrap.dedent(body)], capture_output=True, text=True,
                         timeout=300, env=child_env())
    cases = {}
    for line in out.stdout.splitlines():
        if line.startswith("{"):
            case = json.loads(line)
            cases[case["case"]] = case
    assert out.returncode == 0, (f"the child process ended with {out.returncode} after the cases {list(cases)}",
                                 out.stderr[-3000:])
    return cases


_LOAD = """
import tempfile, os
path = os.path.join(tempfile.mkdtemp(), "ckpt.pt")
base = torch.arange(12.0).reshape(3, 4)
want = {"w": base, "col": base[:, 1], "t": base.t(), "i": torch.arange(5) * 7, "b": torch.tensor([True, False]),
        "h": torch.arange(4.0).to(torch.bfloat16), "c": torch.tensor([1 + 2j, -3j], dtype=torch.complex64)}
torch.save(want, path)
saved_on_tpu = os.path.join(os.path.dirname(path), "tpu.pt")
torch.save({k: v.to("tpu") for k, v in want.items()}, saved_on_tpu)
forms = {
    "'tpu'": "tpu", "torch.device('tpu')": torch.device("tpu"), "'tpu:0'": "tpu:0",
    "torch.device('tpu', 0)": torch.device("tpu", 0), "{'cpu': 'tpu'}": {"cpu": "tpu"},
    "lambda storage, loc: storage.tpu()": lambda storage, loc: storage.tpu(),
}
for file, label in ((path, "cpu checkpoint"), (saved_on_tpu, "tpu checkpoint")):
    for name, form in forms.items():
        if callable(form) and label == "tpu checkpoint":
            # tpu tensors are pickled as CPU copies rebuilt for their device, where PyTorch itself refuses a
            # callable map_location (as for XLA tensors): its error, not a crash
            try:
                torch.load(file, map_location=form)
                report(f"{label}, map_location={name}", False, "loaded")
            except RuntimeError as e:
                report(f"{label}, map_location={name}", "Callable map_location not supported" in str(e), e)
            continue
        got = torch.load(file, map_location=form)
        bad = [k for k, v in want.items()
               if got[k].device.type != "tpu" or got[k].dtype != v.dtype or not torch.equal(got[k].cpu(), v)]
        report(f"{label}, map_location={name}", not bad, bad)
got = torch.load(saved_on_tpu)  # no map_location: tensors saved from the device come back to it
report("tpu checkpoint, no map_location", all(v.device.type == "tpu" and torch.equal(v.cpu(), want[k])
                                               for k, v in got.items()))
model = torch.nn.Linear(4, 2)
torch.save(model.state_dict(), path)
loaded = torch.nn.Linear(4, 2).to("tpu")
loaded.load_state_dict(torch.load(path, map_location="tpu", weights_only=True))
x = torch.randn(3, 4)
report("state_dict into a tpu model", torch.allclose(loaded(x.to("tpu")).cpu(), model(x), atol=1e-6))
try:
    torch.load(path, map_location="tpu:7")
    report("a tpu device that does not exist", False, "loaded")
except RuntimeError as e:
    report("a tpu device that does not exist", "tpu:7 does not exist" in str(e), e)
"""


def test_every_map_location_form_loads_onto_the_device():
    cases = _run_cases(_LOAD)
    assert len(cases) == 2 * 6 + 3
    failed = {name: c["detail"] for name, c in cases.items() if not c["ok"]}
    assert not failed, failed


_STORAGE_CALLS = """
t = torch.arange(1000.0).to("tpu")
s = t.untyped_storage()
c = torch.arange(1000.0).untyped_storage()
calls = {
    "torch.UntypedStorage(10, device='tpu')": (lambda: torch.UntypedStorage(10, device="tpu"), "torch.UntypedStorage"),
    "tpu_storage.clone()": (lambda: s.clone(), "storage.clone()"),
    "t.storage().clone()": (lambda: t.storage().clone(), "storage.clone()"),
    "cpu_storage.to(device='tpu')": (lambda: c.to(device="tpu"), "storage.to(device='tpu')"),
    "tpu_storage.cpu()": (lambda: s.cpu(), "storage.cpu()"),
    "tpu_storage.to(device='cpu')": (lambda: s.to(device="cpu"), "storage.cpu() / storage.to(...)"),
    "tpu_storage.fill_(0)": (lambda: s.fill_(0), "storage call"),
    "tpu_storage.is_pinned()": (lambda: s.is_pinned(), "storage.is_pinned()"),
    "torch.save(tpu_storage)": (lambda: torch.save(s, __import__("io").BytesIO()), "storage.cpu()"),
    "empty.set_(tpu tensor's storage)": (lambda: torch.empty(0, device="tpu").set_(s), "Tensor.set_(storage)"),
}
for name, (call, names) in calls.items():
    try:
        call()
        report(name, False, "no error")
    except RuntimeError as e:
        report(name, names in str(e) and "tpu" in str(e), e)
r = torch.empty(0, device="tpu").set_(c.tpu(), 2, (3,), (2,))
report("set_ on storage.tpu() with offset and stride",
       r.device.type == "tpu" and torch.equal(r.cpu(), torch.tensor([2.0, 4.0, 6.0])))
report("the tensor is still usable", torch.equal((t + 1).cpu(), torch.arange(1000.0) + 1))
"""


def test_storage_level_calls_raise_naming_the_call_never_crash():
    cases = _run_cases(_STORAGE_CALLS)
    assert len(cases) == 12
    failed = {name: c["detail"] for name, c in cases.items() if not c["ok"]}
    assert not failed, failed


def test_storages_say_whether_they_are_on_tpu():
    """``storage.is_tpu``, as ``storage.is_cuda`` (OpenReg's test_backend_generate_methods)."""
    import warnings

    import torch

    import torchtpu_lab  # noqa: F401

    on_tpu, on_cpu = torch.ones(2, device="tpu"), torch.ones(2)
    assert on_tpu.untyped_storage().is_tpu and not on_cpu.untyped_storage().is_tpu
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # TypedStorage's deprecation
        assert on_tpu.storage().is_tpu and not on_cpu.storage().is_tpu
