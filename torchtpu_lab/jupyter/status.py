"""The session status shown by the banner, ``%tpu`` and the live panel (plain data; rendering elsewhere)."""

from __future__ import annotations

from .. import platform, telemetry
from ..device import memory
from ..runtime import compile_cache, executor, lazy, modes


def status() -> dict:
    info = platform.info()
    stats = info.devices[0].memory_stats() or {}
    # executions served by an executable compiled before: fused graphs at syncs, ops run in strict/debug mode
    hits = telemetry.counters.get("graph_cache_hits", 0) + telemetry.counters.get("op_cache_hits", 0)
    compiles = telemetry.counters.get("compiles", 0)
    return {
        "platform": info.description,
        "devices": len(info.devices),
        "eager mode": modes.current(),
        "memory allocated": memory.allocated(0),
        "memory peak": memory.peak(0),
        "memory limit": stats.get("bytes_limit"),
        "compiles": int(compiles),
        "cache hits": int(hits),
        "cache hit rate": (hits / (hits + compiles)) if hits + compiles else None,
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
    }


def status_lines(s: dict) -> list[str]:
    from ..render.text import fmt_bytes

    rate = "n/a" if s["cache hit rate"] is None else f"{100 * s['cache hit rate']:.0f}%"
    return [
        f"torchtpu_lab: tpu device on {s['platform']} ({s['devices']} device(s))",
        f"  eager mode {s['eager mode']} | memory {fmt_bytes(s['memory allocated'])} (peak "
        f"{fmt_bytes(s['memory peak'])}, limit {fmt_bytes(s['memory limit'])})",
        f"  compiles {s['compiles']} | cache hits {s['cache hits']} ({rate}) | syncs {s['syncs']} | "
        f"CPU fallbacks {s['CPU fallbacks']}",
        f"  compile cache: {s['cache dir']} ({s['cache entries on disk']} entries)",
    ] + ([f"  torch.compile: {s['torch.compile graphs']} graphs ({s['torch.compile recompiles']} recompiles), "
          f"{s['graph breaks']} graph breaks"] if s.get("torch.compile graphs") else [])
