"""What importing and using torchtpu_lab changes in the process, next to what ``global_changes()`` says (run as a
child process by tests/test_global_changes.py, with PyTorch's backend autoload off so that ``import torch``
does not import the package first). Prints one JSON object.

    python tests/global_changes_child.py [--control]

Phases: ``import`` (the package imported, nothing run), ``dynamo`` (``torch._dynamo`` imported afterwards, which
is when the compile backend registers itself), ``use`` (ops run on the device). Each phase records which of the
process-wide things below changed and what ``global_changes()`` says then. ``--control``: the same phases
without the package, so the test can tell PyTorch's own changes (importing Dynamo sets some) from ours."""

from __future__ import annotations

import gc
import json
import os
import signal
import sys
import threading
import types
import warnings

import jax
import torch
import torch.distributed as dist
import torch.optim.optimizer
import torch.utils._foreach_utils
from torch._subclasses.fake_tensor import FakeTensor, FakeTensorMode
from torch.fx.experimental import proxy_tensor


def _attributes(label: str, obj) -> dict:
    # a submodule appearing as an attribute is an import, not a change
    return {f"{label}.{k}": id(v) for k, v in vars(obj).items() if not isinstance(v, types.ModuleType)}


def snapshot() -> dict:
    snap: dict = {}
    for s in signal.valid_signals():
        try:
            snap[f"signal handler {signal.Signals(s).name}"] = id(signal.getsignal(s))
        except (ValueError, OSError):
            pass
    for name in ("unraisablehook", "excepthook", "displayhook", "breakpointhook"):
        snap[f"sys.{name}"] = id(getattr(sys, name))
    snap["sys.gettrace"], snap["sys.getprofile"] = id(sys.gettrace()), id(sys.getprofile())
    snap["threading.excepthook"] = id(threading.excepthook)
    snap["sys.meta_path"] = [type(f).__qualname__ for f in sys.meta_path]
    snap["sys.path_hooks"] = [id(h) for h in sys.path_hooks]
    snap["gc.callbacks"] = [id(c) for c in gc.callbacks]
    snap["warnings.filters"] = len(warnings.filters)
    snap["os.environ"] = sorted(os.environ.items())
    for label, obj in (("torch", torch), ("torch.Tensor", torch.Tensor), ("torch.nn.Module", torch.nn.Module),
                       ("torch.UntypedStorage", torch.UntypedStorage),
                       ("torch.storage._StorageBase", torch.storage._StorageBase),
                       ("torch.TypedStorage", torch.TypedStorage), ("torch.accelerator", torch.accelerator),
                       ("torch.accelerator.memory", torch.accelerator.memory), ("FakeTensor", FakeTensor),
                       ("FakeTensorMode", FakeTensorMode),
                       ("torch._TorchCompileInductorWrapper", torch._TorchCompileInductorWrapper)):
        snap.update(_attributes(label, obj))
    snap["torch.serialization._package_registry"] = [id(fn) for _, _, fn in torch.serialization._package_registry]
    snap["proxy_tensor.HANDLED_TYPES"] = [id(t) for t in proxy_tensor.HANDLED_TYPES]
    for name in ("torch.optim.optimizer", "torch.utils._foreach_utils"):
        snap[f"{name}._foreach_supported_types"] = [id(t) for t in sys.modules[name]._foreach_supported_types]
    snap["torch.__future__.swap_module_params_on_conversion"] = torch.__future__.get_swap_module_params_on_conversion()
    snap["privateuse1 backend name"] = torch._C._get_privateuse1_backend_name()
    snap["torch.distributed backends"] = sorted(dist.Backend._plugins)
    snap["torch.distributed default_device_backend_map"] = sorted(dist.Backend.default_device_backend_map.items())
    snap["jax_enable_x64"] = bool(jax.config.jax_enable_x64)
    snap["jax_compilation_cache_dir"] = jax.config.jax_compilation_cache_dir
    snap["torch default dtype"] = str(torch.get_default_dtype())
    snap["torch matmul precision"] = torch.get_float32_matmul_precision()
    snap["threads"] = sorted(t.name for t in threading.enumerate())
    return snap


def changed(before: dict, after: dict) -> dict:
    """The names whose value changed, with the names of threads started (the one list compared by content)."""
    names = sorted(k for k in set(before) | set(after) if before.get(k) != after.get(k))
    return {k: sorted(set(after.get(k, [])) - set(before.get(k, []))) if k == "threads" else None for k in names}


CONTROL = "--control" in sys.argv


def said() -> dict:
    return {} if CONTROL else sys.modules["torchtpu_lab"].global_changes()


report = {}
before = snapshot()
if not CONTROL:
    import torchtpu_lab  # noqa: F401
after_import = snapshot()
report["import"] = {"changed": changed(before, after_import), "said": said()}
import torch._dynamo  # noqa: E402,F401

after_dynamo = snapshot()
report["dynamo"] = {"changed": changed(after_import, after_dynamo), "said": said()}
device, backend = ("cpu", "aot_eager") if CONTROL else ("tpu", "tpu")  # the control compiles too (through AOTAutograd)
x = torch.ones(3, device=device)
assert torch.equal((x * 2 + 1).cpu(), torch.full((3,), 3.0))
assert torch.equal(torch.compile(lambda t: t * 3, backend=backend)(x).cpu(), torch.full((3,), 3.0))
report["use"] = {"changed": changed(after_dynamo, snapshot()), "said": said()}
print(json.dumps(report, default=str))
