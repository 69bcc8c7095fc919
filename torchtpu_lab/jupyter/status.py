"""The session status shown by the banner, ``%tpu`` and the live panel (plain data; rendering elsewhere)."""

from __future__ import annotations

from .. import distributed, native, platform, telemetry
from ..device import memory
from ..records import Status
from ..runtime import compile_cache, executor, fused, modes
from ..telemetry import Counter

#: the counter ``%load_ext``'s cell hooks add each cell's wall time to
CELL_SECONDS = "cell_seconds"


def status() -> Status:
    """The session now: platform, mode, memory, executables, syncs, caches (a :class:`~..records.Status`)."""
    info = platform.info()
    stats = info.devices[0].memory_stats() or {}
    c = telemetry.counters
    return Status(
        platform=info.description,
        devices=len(info.devices),
        device_core=native.status().describe(),
        eager_mode=modes.current(),
        memory_allocated=memory.allocated(0),
        memory_peak=memory.peak(0),
        memory_limit=stats.get("bytes_limit"),
        compiles=int(c.get(Counter.COMPILES, 0)),  # XLA compiled (a load from the disk cache is not one)
        disk_loads=int(c.get(Counter.DISK_LOADS, 0)),
        cache_hits=telemetry.memory_hits(),
        syncs=int(c.get(Counter.SYNCS, 0)),
        cpu_fallbacks=int(c.get(Counter.CPU_FALLBACKS, 0)),
        dynamo_graphs=int(c.get(Counter.DYNAMO_GRAPHS, 0)),
        dynamo_recompiles=int(c.get(Counter.DYNAMO_RECOMPILES, 0)),
        graph_breaks=int(c.get(Counter.GRAPH_BREAKS, 0)),
        pending_ops=fused.pending_ops(),
        op_executables=executor.cache_size(),
        fused_graphs=fused.graph_cache_size(),
        cache_dir=compile_cache.directory() or "(persistent cache off)",
        cache_entries=compile_cache.entries(),
        distributed=distributed.describe(),
        compile_seconds=float(c.get(Counter.COMPILE_SECONDS, 0) + c.get(Counter.DISK_LOAD_SECONDS, 0)),
        cell_seconds=float(c.get(CELL_SECONDS, 0)),
    )


def status_lines(s: Status) -> list[str]:
    """``%tpu`` and the live panel as text: every number formatted."""
    from ..render.text import status_rows

    rows = status_rows(s)
    width = max(len(k) for k, _ in rows)
    return [f"torchtpu_lab: tpu device on {s.platform}"] + [f"  {k:<{width}}  {v}" for k, v in rows[1:]]


def banner_lines(s: Status) -> list[str]:
    """The short ``%load_ext`` banner: platform, devices, mode, memory, cache, and what changed globally."""
    from ..render.text import fmt_bytes

    limit = f" of {fmt_bytes(s.memory_limit)}" if s.memory_limit else ""
    changes = s.global_changes or {}
    facts = ("torch.privateuse1_backend", "native core")  # what is, not what changed
    on = [k.rsplit(".", 1)[-1] for k, v in changes.items() if v and k not in facts]
    return [
        f"torchtpu_lab: tpu device on {s.platform} ({s.devices} device{'s' if s.devices != 1 else ''})",
        f"  device core: {s.device_core}",
        f"  eager mode {s.eager_mode} | memory {fmt_bytes(s.memory_allocated)} allocated{limit}",
        f"  compile cache: {s.cache_dir} ({s.cache_entries} entries)",
        f"  changed globally: {', '.join(on) or 'nothing'} (torchtpu_lab.global_changes() says why)",
    ] + ([f"  torch.distributed (tpu backend): {s.distributed}"] if s.distributed else [])
