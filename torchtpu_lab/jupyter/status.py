"""The session status shown by the banner, ``%tpu`` and the live panel (plain data; rendering elsewhere)."""

from __future__ import annotations

from .. import distributed, native, platform, telemetry
from ..device import memory
from ..runtime import compile_cache, executor, lazy, modes


def status() -> dict:
    info = platform.info()
    stats = info.devices[0].memory_stats() or {}
    # executions served by an executable compiled before: fused graphs at syncs, ops run in strict/debug mode
    hits = telemetry.counters.get("graph_cache_hits", 0) + telemetry.counters.get("op_cache_hits", 0)
    compiles = telemetry.counters.get("compiles", 0)  # XLA compiled (a load from the disk cache is not one)
    loads = telemetry.counters.get("disk_loads", 0)
    return {
        "platform": info.description,
        "devices": len(info.devices),
        "device core": native.status().describe(),
        "eager mode": modes.current(),
        "memory allocated": memory.allocated(0),
        "memory peak": memory.peak(0),
        "memory limit": stats.get("bytes_limit"),
        "compiles": int(compiles),
        "disk loads": int(loads),
        "cache hits": int(hits),
        "cache hit rate": (hits / (hits + compiles + loads)) if hits + compiles + loads else None,
        "syncs": int(telemetry.counters.get("syncs", 0)),
        "CPU fallbacks": int(telemetry.counters.get("cpu_fallbacks", 0)),
        "torch.compile graphs": int(telemetry.counters.get("dynamo_graphs", 0)),
        "torch.compile recompiles": int(telemetry.counters.get("dynamo_recompiles", 0)),
        "graph breaks": int(telemetry.counters.get("graph_breaks", 0)),
        "pending fused ops": lazy.pending_ops(),
        "op executables": executor.cache_size(),
        "fused graphs": lazy.graph_cache_size(),
        "cache dir": compile_cache.directory() or "(persistent cache off)",
        "cache entries on disk": compile_cache.entries(),
        "distributed": distributed.describe(),
    }


def status_lines(s: dict) -> list[str]:
    """``%tpu`` and the live panel as text: every number formatted."""
    from ..render.text import status_rows

    rows = status_rows(s)
    width = max(len(k) for k, _ in rows)
    return [f"torchtpu_lab: tpu device on {s['platform']}"] + [f"  {k:<{width}}  {v}" for k, v in rows[1:]]


def banner_lines(s: dict) -> list[str]:
    """The short ``%load_ext`` banner: platform, devices, mode, memory, cache, and what changed globally."""
    from ..render.text import fmt_bytes

    limit = f" of {fmt_bytes(s['memory limit'])}" if s["memory limit"] else ""
    changes = s.get("global changes") or {}
    facts = ("torch.privateuse1_backend", "native core")  # what is, not what changed
    on = [k.rsplit(".", 1)[-1] for k, v in changes.items() if v and k not in facts]
    return [
        f"torchtpu_lab: tpu device on {s['platform']} ({s['devices']} device{'s' if s['devices'] != 1 else ''})",
        f"  device core: {s.get('device core', 'n/a')}",
        f"  eager mode {s['eager mode']} | memory {fmt_bytes(s['memory allocated'])} allocated{limit}",
        f"  compile cache: {s['cache dir']} ({s['cache entries on disk']} entries)",
        f"  changed globally: {', '.join(on) or 'nothing'} (torchtpu_lab.global_changes() says why)",
    ] + ([f"  torch.distributed (tpu backend): {s['distributed']}"] if s.get("distributed") else [])
