"""CPU fallback: run an op the tpu device cannot run on the CPU, and move the results back.

Like TorchTPU's ``enable_cpu_fallback`` and PyTorch/XLA's ``aten::`` fallbacks. It is on by default; every
fallback is counted in telemetry with the op and the user's source line (so profiles and ``%tpu`` show it), and
the first one per op warns. ``torchtpu_lab.set_cpu_fallback(False)`` makes such ops raise the usual
``NotImplementedError`` instead. A fallback is a sync point: the inputs are copied to the host.

Arguments the op mutates (schema ``Tensor(a!)``) are written back into the original tpu tensors.
"""

from __future__ import annotations

import warnings

import torch
from torch.utils._pytree import tree_map

from .. import config, telemetry
from ..device import tensor
from ..ops.registry import op_name
from . import fused

_warned: set = set()
#: op name -> {"count": n, "sources": {source string: n}}
stats: dict[str, dict] = {}


def set_cpu_fallback(enabled: bool) -> None:
    """Turn the CPU fallback on (default) or off (unsupported ops then raise ``NotImplementedError``)."""
    config.cpu_fallback.set(enabled)


def enabled() -> bool:
    return config.cpu_fallback.value


def _device_of(args, kwargs) -> torch.device:
    found = []

    def visit(v):
        if tensor.on_tpu(v) and not found:
            found.append(v.device)
        return v

    tree_map(visit, (args, kwargs))
    if found:
        return found[0]
    dev = kwargs.get("device")
    return torch.device(dev) if dev is not None else torch.device("tpu")


@fused.entry_point  # a runtime entry point: the op's reads, run and write-backs happen whole
def run(op, args: tuple, kwargs: dict, error: BaseException | None = None):
    """Run ``op`` on CPU copies of its arguments and return tpu results; raise if the fallback is off."""
    name = op_name(op)
    if not config.cpu_fallback.value:
        if error is not None:
            raise error
        raise NotImplementedError(f"torchtpu_lab: {name} has no lowering for the tpu device (CPU fallback is off)")
    source = telemetry.user_source(3)
    entry = stats.setdefault(name, {"count": 0, "sources": {}})
    entry["count"] += 1
    where = str(source) if source else "<unknown>"
    entry["sources"][where] = entry["sources"].get(where, 0) + 1
    telemetry.count("cpu_fallbacks")
    telemetry.emit("fallback", name, source=source, with_source=False)
    if name not in _warned:
        _warned.add(name)
        warnings.warn(f"torchtpu_lab: {name} is not lowered for the tpu device; running it on the CPU "
                      f"(first call at {where}). This is a host round trip each time.", RuntimeWarning, stacklevel=3)
    device = _device_of(args, kwargs)

    def to_cpu(v):
        if tensor.on_tpu(v):
            return v.detach().to("cpu")
        if isinstance(v, torch.device) and v.type == "tpu":
            return torch.device("cpu")
        return v

    cpu_args, cpu_kwargs = tree_map(to_cpu, (tuple(args), dict(kwargs)))
    out = op(*cpu_args, **cpu_kwargs)
    # write mutated arguments back into the caller's tpu tensors
    for i, a in enumerate(op._schema.arguments):
        if a.alias_info is None or not a.alias_info.is_write:
            continue
        original = kwargs.get(a.name) if a.kwarg_only or i >= len(args) else args[i]
        updated = cpu_kwargs.get(a.name) if a.kwarg_only or i >= len(cpu_args) else cpu_args[i]
        pairs = zip(original, updated) if isinstance(original, (list, tuple)) else [(original, updated)]
        for orig, upd in pairs:  # a Tensor(a!)[] argument (fused optimizers) is written back element by element
            if tensor.on_tpu(orig) and isinstance(upd, torch.Tensor):
                if orig.shape != upd.shape:  # an out= argument the CPU kernel resized
                    orig.resize_(upd.shape)
                orig.copy_(upd)
    mutated = {id(v) for v in list(cpu_args) + list(cpu_kwargs.values()) if isinstance(v, torch.Tensor)}

    def back(v):
        if isinstance(v, torch.Tensor) and v.device.type == "cpu":
            if v.is_nested or v.layout != torch.strided:
                raise NotImplementedError(_unsupported_layout(name, v))
            if id(v) in mutated:  # an in-place/out op returns its (now written back) argument
                for orig, cpu_v in zip(list(args) + list(kwargs.values()), list(cpu_args) + list(cpu_kwargs.values())):
                    if cpu_v is v:
                        return orig
            return v.contiguous().to(device)
        return v

    return tree_map(back, out)


def _unsupported_layout(name: str, v: torch.Tensor) -> str:
    """Why a CPU result cannot come back: tpu tensors are dense and strided (no nested or sparse layouts)."""
    kind = "a nested tensor" if v.is_nested else f"a {v.layout} tensor"
    hint = (" (nn.TransformerEncoder takes this path in evaluation mode with a src_key_padding_mask: build it with "
            "enable_nested_tensor=False)") if v.is_nested else ""
    return f"torchtpu_lab: {name} returns {kind}, which the tpu device does not have{hint}"


def summary() -> dict:
    return {name: dict(entry, sources=dict(entry["sources"])) for name, entry in stats.items()}
