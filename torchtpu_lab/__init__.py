"""torchtpu-lab: a ``tpu`` device for PyTorch backed by JAX/XLA, built for notebooks.

``import torchtpu_lab`` registers the device; then ``torch.ones(3, device="tpu")``, ``model.to("tpu")`` and
``torch.tpu.*`` work as they do for CUDA. The device is a TPU when JAX finds one, otherwise XLA on GPU or CPU,
and says which (``torch.tpu.platform_name()``).
"""

from __future__ import annotations

import os


def _autoload() -> None:
    """The ``torch.backends`` entry point (pyproject.toml): PyTorch calls it at the end of ``import torch``, so
    ``torch.device("tpu")`` works without ``import torchtpu_lab`` (importing this package already registered the
    device). ``TORCH_DEVICE_BACKEND_AUTOLOAD=0`` turns autoloading off.

    Defined before anything imports torch: when the user imports this package first, our own ``import torch``
    runs PyTorch's autoload while this module is still initialising, and it looks this function up then (it
    has nothing to do: the import under way registers the device)."""


from .backend.registration import register as _register

_register()

from . import config  # noqa: E402
from . import debug  # noqa: E402
from . import distributed  # noqa: E402
from .backend import autocast as _autocast  # noqa: E402,F401  (torch.autocast("tpu") policy)
from .backend import tpu_module as tpu  # noqa: E402
from .metrics import metrics_report  # noqa: E402

distributed.register()  # the "tpu"/"tpu_dist" torch.distributed backend
from .profiling import Profile, profile  # noqa: E402
from .profiling.compare import compare  # noqa: E402
from .profiling.expect import ExpectationError, expect  # noqa: E402
from .runtime.scalar_log import log_scalar, scalars  # noqa: E402
from .platform import info as platform_info  # noqa: E402
from .runtime import compile_cache  # noqa: E402
from .runtime.cpu_fallback import set_cpu_fallback  # noqa: E402
from .runtime.modes import current as eager_mode_name  # noqa: E402
from .runtime.modes import eager_mode, set_eager_mode  # noqa: E402
from .runtime.state import SESSION as session  # noqa: E402
from .compile import install as _install_compile  # noqa: E402
from .kernels import call_jax, jax_op  # noqa: E402

_install_compile()  # torch.compile(..., backend="tpu"), registered when Dynamo is imported

__version__ = "0.1.0"
__all__ = [
    "tpu", "platform_info", "sync", "set_eager_mode", "eager_mode", "eager_mode_name", "metrics_report",
    "debug", "set_cpu_fallback", "profile", "Profile", "configure", "global_changes", "__version__",
    "jax_op", "call_jax", "config", "session", "compare", "expect", "ExpectationError", "log_scalar", "scalars",
]


def sync() -> None:
    """Run all pending fused work now (a sync point; a no-op in strict and debug modes)."""
    from . import telemetry
    from .runtime import fused

    with telemetry.sync_event(telemetry.SyncReason.USER_SYNC, fused.pending_ops()):
        fused.sync(telemetry.SyncReason.USER_SYNC, record=False)
    from .runtime import pending_errors

    pending_errors.raise_pending(block=False)  # errors reported by work that has finished (the rest: at the next read)


if os.environ.get("TORCHTPU_LAB_CACHE_DIR"):  # asked for explicitly; otherwise %load_ext or configure() enable it
    compile_cache.enable()


def configure(*, cache_dir: str | None | bool = None, eager_mode: str | None = None,
              jax_cache: bool = False) -> dict:
    """Set up the session explicitly (what ``%load_ext torchtpu_lab`` does for a notebook).

    ``cache_dir``: a directory for the persistent executable cache, ``True`` for the default one
    (``~/.cache/torchtpu_lab/xla``), ``False`` to leave it off. It is torchtpu_lab's own cache (keyed by op and
    graph signatures) and leaves JAX's configuration alone; ``jax_cache=True`` also turns on JAX's process-wide
    compilation cache in ``<cache_dir>/jax``, which then serves the user's own ``jax.jit`` code too.
    ``eager_mode``: ``"debug"``, ``"strict"`` or ``"fused"``. Returns :func:`global_changes`."""
    if cache_dir is True or (jax_cache and cache_dir is None):
        compile_cache.enable(share_with_jax=jax_cache)
    elif isinstance(cache_dir, str):
        compile_cache.enable(cache_dir, share_with_jax=jax_cache)
    if eager_mode is not None:
        set_eager_mode(eager_mode)
    return global_changes()


def global_changes() -> dict:
    """What torchtpu_lab changed outside its own objects, so nothing is a surprise: each entry says what and why
    (``tests/test_global_changes.py`` compares this list with what an import and a first use actually change).

    * ``jax_enable_x64``: on at import (int64 indices and float64 keep their meaning); ``TORCHTPU_LAB_X64=0``
      opts out.
    * ``XLA_FLAGS``: ``--xla_cpu_max_isa=AVX2`` appended before JAX starts its CPU client, so XLA:CPU rounds each
      float16 op as CPU does on AVX-512 machines too (see :func:`torchtpu_lab.platform.configure_cpu_codegen`);
      not where ``XLA_FLAGS`` names an ISA already, nor with ``TORCHTPU_LAB_CPU_ISA=native``.
    * ``jax_compilation_cache_dir``: never set by torchtpu_lab (its persistent cache is its own) unless asked
      for with ``configure(jax_cache=True)``; shown so a value the user set is visible.
    * The PrivateUse1 backend renamed ``tpu`` through PyTorch's own setup: ``torch.tpu``, ``Tensor.tpu()``,
      ``Tensor.is_tpu``, ``Module.tpu()``, the device guard and hooks.
    * ``FakeTensor.__new__`` wrapped, so fake tensors of device ``tpu`` stay in meta kernels (``torch.compile``,
      ``torch.export``, ``FakeTensorMode``); ``TpuTensor`` added to the ``HANDLED_TYPES`` of ``torch.fx``'s proxy
      tracing and AOTAutograd's runtime wrappers; ``FakeTensorMode.avoid_device_init`` no longer counts the tpu
      backend as a device to initialise, so ``torch.tensor(data, device="tpu")`` fakes like on a CPU-only
      machine (see :mod:`torchtpu_lab.backend.fake`).
    * ``torch._TorchCompileInductorWrapper.__call__`` wrapped: ``torch.compile``'s default backend compiles a
      graph on tpu tensors with ``"tpu"`` and every other graph with Inductor (see
      :mod:`torchtpu_lab.compile.default_backend`).
    * ``_foreach_supported_types`` of ``torch.optim.optimizer`` and ``torch.utils._foreach_utils``:
      ``TpuTensor`` added, so optimizers (``foreach=None``) and ``clip_grad_norm_`` take their foreach path on
      tpu tensors as on CUDA (see :mod:`torchtpu_lab.backend.foreach_types`).
    * ``sys.meta_path``: finders that wait for the import of ``torch._dynamo`` (to register the ``"tpu"`` backend
      right after it, Dynamo told to call, never trace, torchtpu_lab and JAX code), of ``accelerate.state`` and of
      ``transformers.generation.utils``;
      each wraps that one loader's ``exec_module`` and removes itself (see :mod:`torchtpu_lab.backend.after_import`).
    * An ``os.register_at_fork`` handler: a child forked after the device started refuses tpu work with PyTorch's
      "Cannot re-initialize tpu in forked subprocess" instead of hanging (see
      :mod:`torchtpu_lab.backend.fork_guard`).
    * ``native core``: whether the device's C++ core (guard, hooks, generators, pinned memory) is loaded, or why
      the device runs in pure-Python mode and what that mode lacks (see :mod:`torchtpu_lab.native`).
    * ``accelerate``'s ``PartialState.default_device``, wrapped when accelerate is imported: it is the current
      tpu device while ``tpu`` is the current accelerator, so ``transformers.Trainer`` trains on tpu unasked.
    * ``transformers``' ``DeferredStopCheck.is_supported``, wrapped when ``transformers.generation.utils`` is
      imported: ``generate()`` on tpu reads its stop flag a token late, as on MPS, so the host records the next
      token while the device runs this one (see :mod:`torchtpu_lab.backend.hf_generation`).
    * ``torch.accelerator`` wrappers: synchronize and memory functions route to ``torch.tpu`` while ``tpu`` is the
      current accelerator (PyTorch's own versions need C++ hooks a Python backend cannot provide).
    * The SIGINT handler: ours, in front of Python's default one or a handler of the user's, which it calls at a
      safe point; ``sys.unraisablehook`` chained, so a Ctrl-C cut short in ``__del__`` is not lost (see
      :mod:`torchtpu_lab.interrupts`).
    * Serialization: a ``torch.serialization`` deserializer for ``tpu`` locations, ``UntypedStorage.__new__``
      refusing tpu allocations with an error (PyTorch would crash), ``.tpu()`` and ``is_tpu`` on storages (see
      :mod:`torchtpu_lab.backend.serialization`).
    * ``torch.distributed``: the ``tpu``/``tpu_dist`` backends; with the first tpu process group, DTensor's meta
      rebuild and FSDP2's storage free/alloc wrapped (see :mod:`torchtpu_lab.distributed`).
    """
    import jax
    import torch

    from . import compile as _compile
    from . import interrupts
    from . import native as _native
    from .backend import accelerator as _accelerator
    from .backend import after_import, fake, foreach_types, serialization
    from .backend import hf_accelerate as _hf_accelerate
    from .backend import fork_guard as _fork_guard
    from .backend import hf_generation as _hf_generation
    from .platform import cpu_isa_cap, x64_enabled

    return {
        "jax_enable_x64": x64_enabled(),
        "XLA_FLAGS (--xla_cpu_max_isa appended: float16 rounded per op on AVX-512 CPUs)": cpu_isa_cap(),
        "jax_compilation_cache_dir": jax.config.jax_compilation_cache_dir,
        "torch.privateuse1_backend": torch._C._get_privateuse1_backend_name(),
        "FakeTensor.__new__ (tpu fake tensors stay meta)": _fake_patch_installed(),
        "HANDLED_TYPES (TpuTensor is a plain tensor to proxy tracing and AOTAutograd)": fake.handled_types_patched(),
        "FakeTensorMode.avoid_device_init (the tpu backend is not a device to initialise: torch.tensor(..., "
        "device='tpu') lifts its data on the CPU)": fake.lifts_constants_on_cpu(),
        "_foreach_supported_types (TpuTensor added: optimizers and clip_grad_norm_ take their foreach path on "
        "tpu tensors)": foreach_types.installed(),
        "torch.accelerator (wrapped)": _accelerator.wrapped(),
        **interrupts.changes(),
        **after_import.changes(),
        **_compile.changes(),
        **serialization.changes(),
        **distributed.changes(),
        "native core": _native.status().describe(),
        "accelerate (wrapped)": _hf_accelerate.wrapped(),
        "transformers generation (wrapped)": _hf_generation.wrapped(),
        "os.register_at_fork handler (a child forked after the device started refuses tpu work)":
            _fork_guard.installed(),
    }


def _fake_patch_installed() -> bool:
    from .backend import fake

    return fake.installed()


def load_ipython_extension(ip) -> None:
    """``%load_ext torchtpu_lab``: see :mod:`torchtpu_lab.jupyter.session`."""
    from .jupyter import load_ipython_extension as load

    load(ip, global_changes)


def unload_ipython_extension(ip) -> None:
    from .jupyter import unload_ipython_extension as unload

    unload(ip)
