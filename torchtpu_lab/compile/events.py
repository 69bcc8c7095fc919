"""Telemetry for ``torch.compile``: Dynamo graphs (with graph-break reasons and user lines), recompiles (with
Dynamo's guard-failure reason), our compiles of the lowered graphs, and graphs that run eagerly.

Dynamo tells a backend why it cut a graph (``gm.compile_subgraph_reason``: the reason and the user's stack)
and records why it recompiles a frame in its metrics context; both are read here when our backend is called,
so they cost nothing outside compilation.
"""

from __future__ import annotations

import torch

from .. import telemetry
from ..causes import Cause, CauseKind
from ..telemetry import Counter

#: kinds of the compile events emitted here (``detail["kind"]``)
DYNAMO = "dynamo"


def _user_source(frames) -> telemetry.Source | None:
    """The innermost frame of Dynamo's user stack that is the user's code (not torch, jax or us)."""
    for frame in reversed(list(frames or [])):
        if not telemetry.is_internal_file(frame.filename):
            return telemetry.Source(frame.filename, frame.lineno or 0, frame.name)
    return None


def _dynamo_metrics() -> dict:
    """What Dynamo recorded about the frame it is compiling (name, recompile reason), or ``{}``."""
    try:
        from torch._dynamo.utils import get_metrics_context

        return dict(getattr(get_metrics_context(), "_metrics", {}) or {})
    except Exception:  # noqa: BLE001 — a PyTorch without these metrics still compiles; it just says less
        return {}


def dynamo_graph(gm: torch.fx.GraphModule) -> telemetry.Event:
    """Dynamo handed us a graph: record the compile, a graph break that ended it, a recompile's reason."""
    n_ops = sum(1 for n in gm.graph.nodes if n.op in ("call_function", "call_method", "call_module"))
    reason = getattr(gm, "compile_subgraph_reason", None)
    metrics = _dynamo_metrics()
    recompile = metrics.get("recompile_reason")
    code = metrics.get("co_name") or _frame_name(gm)
    if reason is not None and getattr(reason, "graph_break", False):
        source = _user_source(getattr(reason, "user_stack", None))
        telemetry.record_graph_break(str(reason.reason), source, kind=DYNAMO, frame=code)
    cause = (Cause(CauseKind.DYNAMO_RECOMPILE, detail=str(recompile)) if recompile
             else Cause(CauseKind.FIRST_FUNCTION))
    telemetry.count(Counter.DYNAMO_GRAPHS)
    if recompile:
        telemetry.count(Counter.DYNAMO_RECOMPILES)
    return telemetry.record_compile(DYNAMO, f"dynamo graph {code} [{n_ops} ops]", cause, 0.0, n_ops,
                                    reason="recompile" if recompile else "")


def traced(event, seconds: float) -> None:
    """The Dynamo graph's AOTAutograd trace took ``seconds`` (its XLA compiles are separate events)."""
    event.dur = seconds
    telemetry.count(Counter.COMPILE_SECONDS, seconds)


def frame_name(gm) -> str:
    """The name of the code Dynamo is compiling ``gm`` from."""
    return _dynamo_metrics().get("co_name") or _frame_name(gm)


def _frame_name(gm) -> str:
    for node in gm.graph.nodes:
        stack = node.meta.get("stack_trace")
        if stack:
            last = [line for line in stack.strip().splitlines() if line.strip().startswith("File ")]
            if last:
                return last[0].strip().split(", in ")[-1]
    try:  # Dynamo's "[frame/attempt]" id, as its own logs print it
        from torch._guards import CompileContext

        compile_id = CompileContext.current_compile_id()
        if compile_id is not None:
            return f"[{compile_id}]"
    except Exception:  # noqa: BLE001
        pass
    return "<graph>"


def graph_compiled(graph, seconds: float, cause: Cause, disk: bool = False) -> None:
    """An executable of a lowered graph was built, with the ATen ops inside: compiled by XLA, or (``disk``)
    loaded from the persistent cache, counted as a load, not a compile (as the runtime counts its own)."""
    telemetry.count(Counter.DISK_LOADS if disk else Counter.COMPILES)
    telemetry.count(Counter.DISK_LOAD_SECONDS if disk else Counter.COMPILE_SECONDS, seconds)
    event = telemetry.record_compile("compiled", graph.name, cause, seconds, graph.plan.n_ops, disk=disk)
    event.detail["ops"] = list(graph.plan.ops)
    if graph.plan.group is not None:  # lowered into the program, which runs over the group's mesh
        event.detail["collectives"] = list(graph.plan.collectives)
        event.detail["group"] = graph.plan.group.describe()


def graph_runs_eagerly(gm, kind: str, why: str) -> None:
    telemetry.count(Counter.COMPILED_GRAPHS_EAGER)
    telemetry.record_compile("eager-graph", f"{kind} graph runs eagerly", Cause(CauseKind.FIRST_EAGER, detail=why), 0.0,
                             sum(1 for n in gm.graph.nodes if n.op == "call_function"))
