"""The kernel side of the JupyterLab extension's data path: the ``torchtpu_lab`` Jupyter comm.

No server process: ``%load_ext torchtpu_lab`` calls :func:`setup`, which registers the comm target and opens
one comm to the frontend (the extension in ``extension/`` registers the target there, and after a page reload
finds this comm with a ``comm_info`` request). Messages are small versioned JSON:

kernel -> frontend
    ``{"v": 1, "type": "status", "reason": "cell" | "live" | "request" | "open", "data": {...}}`` after every
    cell, and while a cell runs at most every 0.5 s after a compile or a sync ("live")
    ``{"v": 1, "type": "reply", "id": ..., "command": ..., "message": "...", "data": {...}}`` a command's outcome
    ``{"v": 1, "type": "error", "id": ..., "error": "..."}`` a refused request (nothing was changed)
    ``{"v": 1, "type": "compile", "phase": "start" | "end", "kind": ..., "seconds": ...}`` an XLA compile that
    is still running after a moment, and its end (see ``compile_watch.py``: the one message sent off the main
    thread)
    ``{"v": 1, "type": "unloaded"}`` after ``%unload_ext torchtpu_lab`` (then the comm closes)

The status ``data`` holds the session's figures (``payload``), the recent compilations, the memory history
(``[t, allocated, peak or null]``: the peak reached since the previous sample when it moved, so the chart can
mark peaks that fell between two samples), the compile running now, the rows of the last ``launch()``'s ranks,
and the last ``%%tpu_profile`` with its panel views (``render/panel.py``, versioned on their own).
frontend -> kernel
    ``{"v": 1, "id": "<str>", "command": "status" | "set_mode" | "clear_cache", "args": {...}}``

The kernel accepts only those three commands, checks every field, and never evaluates anything it receives;
a request that is not exactly right gets an error reply and changes nothing. Everything is sent from the main
thread: from the ``post_run_cell`` hook and from comm message handlers (ipykernel runs those on the main
shell thread); a push from any other thread sends nothing. The lock guards the open comms and the history.
"""

from __future__ import annotations

import linecache
import threading
import time
from collections.abc import Callable

from .. import telemetry
from ..device import memory
from ..distributed import rank_status
from ..ops.registry import op_name
from ..records import Status
from ..runtime.modes import MODES
from ..telemetry import Counter
from . import compile_watch

TARGET = "torchtpu_lab"
VERSION = 1
COMMANDS = ("status", "set_mode", "clear_cache")
MAX_COMPILES = 25  # recent compilations sent with each status
HISTORY = 240  # memory samples kept (one per cell and per status request)
MAX_ID = 100  # characters in a request id

_lock = threading.Lock()
#: ``loaded``: the extension's own "am I still loaded?" (handed over by :func:`setup`; the session module
#: imports this one, so this one cannot import it back)
_state: dict = {"shell": None, "comms": {}, "history": [], "profile": (None, None), "loaded": lambda: False,
                "comparison": (None, None)}
#: distinct ops named in a graph compile's label
MAX_LABEL_OPS = 4


# ---- status payload ------------------------------------------------------------------------------------------

def _compile_rows() -> list[dict]:
    rows = []
    for e in list(telemetry.compile_log)[-MAX_COMPILES:]:
        src = e.source
        code = ""
        if src is not None and src.lineno > 0:
            code = linecache.getline(src.filename, src.lineno).strip()[:200]
        cause = e.detail.get("cause")
        rows.append({"name": str(e.name)[:200], "kind": str(e.detail.get("kind", "")), "n_ops": e.detail.get("n_ops"),
                     "ops": _op_counts(e.detail.get("ops")),
                     "seconds": float(e.dur), "cause": "" if cause is None else str(cause)[:500],
                     "recompile": bool(e.detail.get("recompile")), "disk": bool(e.detail.get("disk")),
                     "where": telemetry.describe(src), "code": code})
    return rows


def _short_op(op) -> str:
    """``aten::mul.Tensor`` -> ``mul``: what a panel row has room for."""
    name = op_name(op).split("::", 1)[-1]
    name = name.removeprefix("aten.")
    return name.split(".", 1)[0] or name


def _op_counts(ops) -> list[list]:
    """The most frequent ops of a compiled graph as ``[[short name, count], ...]`` (empty when unknown)."""
    if not ops:
        return []
    from collections import Counter as Tally

    return [[name[:40], n] for name, n in Tally(_short_op(o) for o in ops).most_common(MAX_LABEL_OPS)]


def note_comparison(prof, comparison) -> None:
    """``%%tpu_profile --compare`` compared ``prof`` with a saved profile: the panel shows the comparison with
    that profile (and only with it: the next profiled cell without ``--compare`` shows none)."""
    _state["comparison"] = (prof, comparison)


def _profile_info(shell) -> dict | None:
    """The last ``%%tpu_profile``'s summary and text report (the text is computed once per profile)."""
    from ..profiling.repeat import Repeated
    from ..profiling.session import Profile

    prof = getattr(shell, "user_ns", {}).get("_tpu_profile") if shell is not None else None
    if not isinstance(prof, (Profile, Repeated)):  # one run, or the medians of --repeat N
        return None
    compared, comparison = _state["comparison"]
    key = (prof, comparison if compared is prof else None)  # a comparison noted later makes new views
    cached_key, cached = _state["profile"]
    if cached_key is not None and cached_key[0] is key[0] and cached_key[1] is key[1]:
        return cached
    summary = {k: v for k, v in prof.summary().items() if isinstance(v, (str, int, float, bool, type(None)))}
    try:
        text = prof.text(top=5)
    except Exception as e:  # noqa: BLE001 — a report that cannot render must not stop the status
        text = f"(report unavailable: {type(e).__name__})"
    count = _state.get("count")
    info = {"summary": summary, "text": text[:20000], "cell": f"cell [{count}]" if count is not None else "",
            "views": _views(prof)}
    _state["profile"] = (key, info)
    return info


def _views(prof) -> dict | None:
    """The panel's views of the profile (``render/panel.py``), with the comparison when the cell made one."""
    from ..render.panel import panel_views

    try:
        compared, comparison = _state["comparison"]
        report = comparison.report() if comparison is not None and compared is prof else None
        return panel_views(prof.report(), report)
    except Exception:  # noqa: BLE001 — the views are extras: a failure leaves the summary and the text
        return None


def _sample(s: Status) -> tuple:
    """One memory history point: ``(t, allocated, peak)`` where ``peak`` is the highest point since the previous
    sample when it was above what is allocated now (a peak that sampling alone would miss), else ``None``."""
    between = memory.take_sample_peak(0)
    return round(time.time(), 3), int(s.memory_allocated), int(between) if between > s.memory_allocated else None


def _compiling() -> dict | None:
    running = telemetry.compile_in_progress()
    return None if running is None else {"kind": running[0], "seconds": round(running[1], 3)}


def snapshot(shell=None) -> dict:
    """The status the frontend shows, as plain JSON-able data (and one memory sample added to the history)."""
    from .status import status

    s = status()
    with _lock:
        history = _state["history"]
        history.append(_sample(s))
        del history[:-HISTORY]
        history = [list(p) for p in history]
    return {**payload(s), "compilations": _compile_rows(), "memory_history": history, "compiling": _compiling(),
            "ranks": rank_status.rows(), "profile": _profile_info(shell if shell is not None else _state["shell"])}


def payload(s: Status) -> dict:
    """A :class:`~..records.Status` in the names the JupyterLab extension reads (``extension/src/model.ts``)."""
    return {
        "platform": s.platform,
        "devices": s.devices,
        "mode": s.eager_mode,
        "memory": {"allocated": s.memory_allocated, "peak": s.memory_peak, "limit": s.memory_limit},
        Counter.COMPILES.value: s.compiles,
        Counter.DISK_LOADS.value: s.disk_loads,
        "cache_hits": s.cache_hits,
        "cache_hit_rate": s.cache_hit_rate,
        Counter.SYNCS.value: s.syncs,
        Counter.CPU_FALLBACKS.value: s.cpu_fallbacks,
        "pending_ops": s.pending_ops,
        "cache_dir": s.cache_dir,
        "cache_entries": s.cache_entries,
        "compile_seconds": s.compile_seconds,
        "cell_seconds": s.cell_seconds,
        "compile_share": s.compile_share,
    }


# ---- requests ------------------------------------------------------------------------------------------------

class Refused(ValueError):
    """A request that is not one of the fixed commands with exactly the right arguments."""


def _validate(data) -> tuple[str | None, str, dict]:
    """``(id, command, args)`` of a well-formed request; raises :class:`Refused` (with the id when readable)."""
    if not isinstance(data, dict):
        raise Refused(None, f"a request must be a JSON object, not {type(data).__name__}")
    rid = data.get("id")
    if rid is not None and not (isinstance(rid, str) and len(rid) <= MAX_ID):
        raise Refused(None, f"'id' must be a string of at most {MAX_ID} characters")
    extra = set(data) - {"v", "id", "command", "args"}
    if extra:
        raise Refused(rid, f"unexpected fields {sorted(map(str, extra))}")
    if type(data.get("v")) is not int or data["v"] != VERSION:
        raise Refused(rid, f"unsupported protocol version {data.get('v')!r} (this kernel speaks v{VERSION})")
    command = data.get("command")
    if not isinstance(command, str) or command not in COMMANDS:
        shown = command[:40] if isinstance(command, str) else command
        raise Refused(rid, f"unknown command {shown!r}; accepted: {', '.join(COMMANDS)}")
    args = data.get("args", {})
    if not isinstance(args, dict):
        raise Refused(rid, "'args' must be an object")
    if command == "set_mode":
        if set(args) != {"mode"} or args["mode"] not in MODES:
            raise Refused(rid, f"set_mode takes args {{'mode': one of {', '.join(MODES)}}}")
    elif args:
        raise Refused(rid, f"{command} takes no arguments")
    return rid, command, args


def handle(data, shell=None) -> dict:
    """The reply to one request from the frontend (a dict to send back). Only here does a request act."""
    try:
        rid, command, args = _validate(data)
    except Refused as e:
        rid, reason = e.args
        return {"v": VERSION, "type": "error", "id": rid, "error": reason}
    try:
        if command == "set_mode":
            from ..runtime import modes

            modes.set_eager_mode(args["mode"])
            message = f"eager mode: {modes.current()}"
        elif command == "clear_cache":
            from ..runtime import state

            message = state.clear_everything()
        else:
            message = "status"
        return {"v": VERSION, "type": "reply", "id": rid, "command": command, "message": message,
                "data": snapshot(shell)}
    except Exception as e:  # noqa: BLE001 — report it to the frontend; never take the kernel down
        return {"v": VERSION, "type": "error", "id": rid, "error": f"{command} failed: {type(e).__name__}: {e}"}


# ---- comms ---------------------------------------------------------------------------------------------------

def _on_main_thread() -> bool:
    return threading.current_thread() is threading.main_thread()


def _send(comm, payload: dict) -> None:
    try:
        comm.send(payload)
    except Exception:  # noqa: BLE001 — a frontend that went away must not break the kernel
        _forget(comm)


def _forget(comm) -> None:
    with _lock:
        _state["comms"].pop(getattr(comm, "comm_id", id(comm)), None)


def _adopt(comm) -> None:
    """Answer this comm's requests and include it in the status pushes."""
    with _lock:
        _state["comms"][getattr(comm, "comm_id", id(comm))] = comm

    def on_msg(msg) -> None:
        data = (msg or {}).get("content", {}).get("data") if isinstance(msg, dict) else None
        _send(comm, handle(data, _state["shell"]))

    comm.on_msg(on_msg)
    comm.on_close(lambda msg=None: _forget(comm))


def _on_open(comm, msg) -> None:
    """A frontend opened a comm to our target: adopt it and send the status at once."""
    _adopt(comm)
    _send(comm, {"v": VERSION, "type": "status", "reason": "open", "data": snapshot(_state["shell"])})


def _comms() -> list:
    with _lock:
        return list(_state["comms"].values())


def broadcast(message: dict) -> None:
    """Send a small message built from plain values to every open comm, from any thread (ipykernel schedules the
    send on its IOPub thread). Only :mod:`.compile_watch` uses it; statuses go through :func:`push`."""
    payload = {"v": VERSION, **message}
    for c in _comms():
        _send(c, payload)


def push(reason: str = "cell") -> None:
    """Send the status to every open comm (main thread only; cheap when nobody listens)."""
    if not _on_main_thread():
        return
    comms = _comms()
    if not comms:
        return
    payload = {"v": VERSION, "type": "status", "reason": reason, "data": snapshot(_state["shell"])}
    for c in comms:
        _send(c, payload)


#: seconds between two status pushes while a cell runs
LIVE_INTERVAL_S = 0.5


def live() -> None:
    """Push the status while a cell runs (called by telemetry after each compile and sync), at most every
    :data:`LIVE_INTERVAL_S` seconds, so the status bar and the panel move during a long loop. The throttle check
    is one clock read; the push itself is skipped when no frontend listens."""
    now = time.monotonic()
    if now - _state.get("last_live", 0.0) < LIVE_INTERVAL_S:
        return
    _state["last_live"] = now
    if _state["comms"]:
        push("live")


def _post_run_cell(result=None) -> None:
    try:
        if not _state["loaded"]():  # %unload_ext ran in this cell: say so, close, and stop
            teardown()
            return
        _state["count"] = getattr(result, "execution_count", None)
        push("cell")
    except Exception:  # noqa: BLE001 — the status panel must never break a cell
        pass


def setup(ip, loaded: Callable[[], bool]) -> bool:
    """Register the comm target and open a comm to the frontend; ``False`` (and nothing done) outside a kernel.
    ``loaded``: whether the extension is still loaded (after ``%unload_ext`` the next cell's hook tears down)."""
    try:
        kernel = getattr(ip, "kernel", None)
        manager = getattr(kernel, "comm_manager", None)
        if manager is None:
            return False  # a terminal IPython: no frontend to talk to
        if _state["shell"] is ip:
            return True  # loading twice: already set up
        _state["shell"] = ip
        _state["loaded"] = loaded
        manager.register_target(TARGET, _on_open)
        ip.events.register("post_run_cell", _post_run_cell)
        if live not in telemetry.live_hooks:
            telemetry.live_hooks.append(live)
        compile_watch.start(broadcast)
        from comm import create_comm

        c = create_comm(target_name=TARGET, data={"v": VERSION, "type": "hello"})
        _adopt(c)
        return True
    except Exception:  # noqa: BLE001 — the extension must load even if the comm cannot be set up
        return False


def teardown() -> None:
    """Tell the frontends, close the comms, unregister the target and the hook (called after ``%unload_ext``)."""
    ip = _state["shell"]
    for c in _comms():
        _send(c, {"v": VERSION, "type": "unloaded"})
        try:
            c.close()
        except Exception:  # noqa: BLE001
            pass
        _forget(c)
    if ip is not None:
        try:
            ip.kernel.comm_manager.unregister_target(TARGET, _on_open)
        except Exception:  # noqa: BLE001
            pass
        try:
            ip.events.unregister("post_run_cell", _post_run_cell)
        except ValueError:
            pass
    if live in telemetry.live_hooks:
        telemetry.live_hooks.remove(live)
    compile_watch.stop()
    _state["shell"] = None
