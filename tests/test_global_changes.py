"""``torchtpu_lab.global_changes()`` says every process-wide change the package makes (issue 24, item 7).

A child process snapshots the process-wide state (signal handlers, ``sys`` hooks, ``sys.meta_path``, threads,
``gc`` callbacks, warnings filters, the environment, the attributes of ``torch``, ``Tensor``, ``Module``,
storages, ``torch.accelerator``, ``FakeTensor``, the serialization registry, ``HANDLED_TYPES``, torch and JAX
settings) before and after importing the package, importing Dynamo and running ops, next to a control child
doing the same without the package. Every change of ours must be named by a true entry of ``global_changes()``
(:data:`SAID_BY`), so a future silent change fails here until it is said."""

from __future__ import annotations

import json
import pathlib
import subprocess
import sys

import pytest

from fault_cases import child_env

HERE = pathlib.Path(__file__).resolve().parent

#: each observed change -> the start of the global_changes() entry that says it
SAID_BY = {
    "FakeTensor.__new__": "FakeTensor.__new__",
    "FakeTensorMode.avoid_device_init": "FakeTensorMode.avoid_device_init",
    "torch._TorchCompileInductorWrapper.__call__": "torch._TorchCompileInductorWrapper.__call__",
    "jax_enable_x64": "jax_enable_x64",
    "os.environ": "XLA_FLAGS",
    "privateuse1 backend name": "torch.privateuse1_backend",
    "torch.tpu": "torch.privateuse1_backend",
    "torch.Tensor.tpu": "torch.privateuse1_backend",
    "torch.Tensor.is_tpu": "torch.privateuse1_backend",
    "torch.nn.Module.tpu": "torch.privateuse1_backend",
    "proxy_tensor.HANDLED_TYPES": "HANDLED_TYPES",
    "torch.optim.optimizer._foreach_supported_types": "_foreach_supported_types",
    "torch.utils._foreach_utils._foreach_supported_types": "_foreach_supported_types",
    "signal handler SIGINT": "SIGINT handler",
    "threads": "SIGINT handler",  # its redelivery thread (checked by name below)
    "sys.unraisablehook": "sys.unraisablehook",
    "sys.meta_path": "sys.meta_path finder",
    "torch.serialization._package_registry": "torch.serialization.register_package",
    "torch.UntypedStorage.__new__": "torch.UntypedStorage.__new__",
    "torch.storage._StorageBase.tpu": "torch.UntypedStorage.tpu",
    "torch.TypedStorage.tpu": "torch.UntypedStorage.tpu",
    "torch.storage._StorageBase.is_tpu": "torch.UntypedStorage.tpu",
    "torch.TypedStorage.is_tpu": "torch.UntypedStorage.tpu",
    "torch.distributed backends": "torch.distributed backends",
    "torch.distributed default_device_backend_map": "torch.distributed backends",
}
_ACCELERATOR = "torch.accelerator (wrapped)"


def _child(*args: str) -> dict:
    env = dict(child_env(), TORCH_DEVICE_BACKEND_AUTOLOAD="0")
    out = subprocess.run([sys.executable, str(HERE / "global_changes_child.py"), *args], capture_output=True,
                         text=True, timeout=300, env=env)
    assert out.returncode == 0, out.stderr[-3000:]
    return json.loads(out.stdout.strip().splitlines()[-1])


@pytest.fixture(scope="module")
def observed() -> tuple[dict, dict]:
    return _child(), _child("--control")


def _entry(said: dict, start: str):
    keys = [k for k in said if k.startswith(start)]
    assert len(keys) == 1, f"global_changes() has {len(keys)} entries starting {start!r}: {keys}"
    return said[keys[0]]


@pytest.mark.parametrize("phase", ["import", "dynamo", "use"])
def test_every_change_is_said(observed, phase):
    ours, control = observed[0][phase], observed[1][phase]
    said = ours["said"]
    theirs = control["changed"]  # what the same steps change without the package (PyTorch's own)
    unsaid = []
    for name, detail in ours["changed"].items():
        if name == "threads":
            detail = [t for t in detail if t not in (theirs.get("threads") or [])]
            if not detail:
                continue
            assert detail == ["torchtpu_lab-interrupts"], detail
            assert "torchtpu_lab-interrupts" in _entry(said, "SIGINT handler")
        elif name in theirs and name != "sys.meta_path":
            continue
        if name.startswith("torch.accelerator."):
            assert name in said[_ACCELERATOR], name
            continue
        start = SAID_BY.get(name)
        if start is None:
            unsaid.append(name)
            continue
        value = _entry(said, start)
        if name == "sys.meta_path":  # the finders come with the import; Dynamo's leaves with Dynamo's import
            value = value or _entry(said, "loader.exec_module wrapped")
        assert value, (name, start, value)
    assert not unsaid, f"changed by torchtpu_lab but not in global_changes(): {unsaid}"


def test_what_is_said_is_what_happened(observed):
    """The entries follow the state: the Dynamo finder waits until Dynamo's import, then the backend is there."""
    ours = observed[0]
    assert "torch._dynamo" in _entry(ours["import"]["said"], "sys.meta_path finder")
    assert "torch._dynamo" not in _entry(ours["import"]["said"], "loader.exec_module wrapped")
    assert _entry(ours["import"]["said"], "torch._dynamo: backend 'tpu' registered") is False
    assert "torch._dynamo" not in _entry(ours["dynamo"]["said"], "sys.meta_path finder")
    assert "torch._dynamo" in _entry(ours["dynamo"]["said"], "loader.exec_module wrapped")
    assert _entry(ours["dynamo"]["said"], "torch._dynamo: backend 'tpu' registered") is True
    assert "torch.fx.experimental.proxy_tensor" in _entry(ours["import"]["said"], "HANDLED_TYPES")
    assert "torch._functorch._aot_autograd.runtime_wrappers" in _entry(ours["dynamo"]["said"], "HANDLED_TYPES")
    assert sorted(_entry(ours["import"]["said"], _ACCELERATOR)) == sorted(
        n for n in ours["import"]["changed"] if n.startswith("torch.accelerator."))
    assert "calling Python's default" in _entry(ours["import"]["said"], "SIGINT handler")
