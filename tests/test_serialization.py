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


def _run_cases(body: str, **env: str) -> dict:
    """Run ``body`` in a child process (``env``: more variables); the cases it reported, by name (a crash: the
    exit code, in the error)."""
    out = subprocess.run([sys.executable, "-c", _PRELUDE + textwrap.dedent(body)], capture_output=True, text=True,
                         timeout=300, env={**child_env(), **env})
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


def test_storage_level_calls_that_cannot_work_raise_naming_the_call_never_crash():
    cases = _run_cases(_STORAGE_CALLS)
    assert len(cases) == 6
    failed = {name: c["detail"] for name, c in cases.items() if not c["ok"]}
    assert not failed, failed


def _native_core() -> bool:
    from torchtpu_lab import native

    return native.module() is not None


@pytest.mark.skipif(not _native_core(),
                    reason="pure-Python mode: PyTorch's Python factory gives tpu storages no bytes (they say so)")
def test_a_tensors_storage_reads_and_writes_its_bytes_as_on_cpu():
    """A live tpu tensor's storage is read and written through a byte view of its data (PyTorch does every
    storage-level call by ``set_`` of a tensor onto the storage): ``cpu()``, ``tolist()``, indexing, ``fill_``,
    ``copy_`` and ``torch.save`` of a storage give CPU's bytes and reach the tensor. They raised "a tpu storage
    holds no bytes" before."""
    import io
    import warnings

    import torch

    import torchtpu_lab  # noqa: F401 — in this process: these calls no longer touch a raw pointer

    warnings.simplefilter("ignore", UserWarning)  # TypedStorage is deprecated

    def calls(d):
        t = torch.arange(6.0, device=d)
        s = t.untyped_storage()
        out = [torch.tensor([], dtype=torch.float32).set_(s.cpu()), torch.tensor(s.tolist()),
               torch.tensor([s[4], s[7], len(s)]), torch.tensor(t.storage().tolist())]
        b = io.BytesIO()
        torch.save(t.storage(), b)
        b.seek(0)
        out.append(torch.tensor(torch.load(b, map_location="cpu").tolist()))
        filled = torch.arange(6.0, device=d)
        filled.untyped_storage().fill_(0)
        copied = torch.zeros(6, device=d)
        copied.untyped_storage().copy_(torch.full((6,), 7.0).untyped_storage())
        poked = torch.arange(6.0, device=d)
        poked.untyped_storage()[0] = 1
        halves = torch.arange(6, dtype=torch.bfloat16, device=d)[2:]  # a view's storage is its base's
        out += [filled.cpu(), copied.cpu(), poked.cpu(), torch.tensor(halves.untyped_storage().tolist())]
        return out

    for got, want in zip(calls("tpu"), calls("cpu")):
        assert torch.equal(got, want)


_PURE_PYTHON_STORAGE = """
t = torch.arange(6.0).to("tpu")
try:
    t.untyped_storage().cpu()
    report("a storage read without the native core", False, "no error")
except RuntimeError as e:
    report("a storage read without the native core", "reports no bytes (pure-Python mode" in str(e), e)
v = torch.tensor((), device="tpu").set_(t.untyped_storage(), 1, (2,), (2,))  # a view with its geometry works
report("set_ with a geometry", torch.equal(v.cpu(), torch.tensor([1.0, 3.0])))
"""


def test_without_the_native_core_a_storage_read_says_why_it_cannot():
    cases = _run_cases(_PURE_PYTHON_STORAGE, TORCHTPU_LAB_NATIVE="0")
    assert len(cases) == 2 and all(c["ok"] for c in cases.values()), cases


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
