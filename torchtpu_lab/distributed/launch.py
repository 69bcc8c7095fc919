"""Run a function on N ranks on this host from a notebook (which is one process), like ``torchrun`` does.

``launch(fn, nprocs=2)`` starts ``nprocs`` fresh Python processes with torchrun's environment (``RANK``,
``WORLD_SIZE``, ``LOCAL_RANK``, ``LOCAL_WORLD_SIZE``, ``MASTER_ADDR``, ``MASTER_PORT``), calls ``fn(*args)`` in
each — ``fn`` calls ``dist.init_process_group("tpu")`` itself, exactly as a script under torchrun does — and
returns one :class:`RankResult` per rank: the return value (tensors come back as CPU tensors) and the captured
stdout and stderr. The calling process never starts JAX's multi-process runtime, so a notebook can launch
again and again.

How ``fn`` reaches the ranks: a function importable by module and name is imported there; a function defined
in a notebook cell or ``__main__`` is sent *by its source code* (it must do its own imports inside its body,
and may use only its arguments); a string ``"module:function"`` names one.

Failures never hang: when a rank fails, the launcher tells the others (their collective watchdog ends them,
naming the collective they were waiting in), kills whatever is left after a grace period, and raises
:class:`LaunchError` with every rank's exit status, error and output. ``timeout`` bounds the whole run.
"""

from __future__ import annotations

import contextlib
import inspect
import os
import pickle
import shutil
import socket
import subprocess
import sys
import tempfile
import textwrap
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from .. import telemetry
from . import rank_status

_GRACE_S = 10.0


@dataclass
class RankResult:
    """What one rank produced: its return value, captured output and exit code."""

    rank: int
    value: Any = None
    stdout: str = ""
    stderr: str = ""
    returncode: int | None = None
    error: str | None = None


class LaunchError(RuntimeError):
    """One or more ranks failed or timed out; ``results`` holds every rank's :class:`RankResult`."""

    def __init__(self, message: str, results: list[RankResult]):
        super().__init__(message)
        self.results = results


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _function_spec(fn: Callable | str) -> dict:
    if isinstance(fn, str):
        module, _, name = fn.partition(":")
        if not module or not name:
            raise ValueError(f"launch: expected 'module:function', got {fn!r}")
        return {"module": module, "name": name}
    if not callable(fn):
        raise TypeError(f"launch: fn must be a function or 'module:function', got {type(fn).__name__}")
    module = getattr(fn, "__module__", None)
    name = getattr(fn, "__qualname__", "")
    if module and module != "__main__" and "<locals>" not in name and "<lambda>" not in name:
        return {"module": module, "name": name}
    if fn.__name__ == "<lambda>":
        raise ValueError("launch: a lambda cannot be sent to other processes; use a def (its source is sent)")
    try:
        source = textwrap.dedent(inspect.getsource(fn))
    except (OSError, TypeError) as e:
        raise ValueError(f"launch: cannot read the source of {fn.__name__!r} to send it to the ranks ({e}); "
                         "define it in a module, or pass 'module:function'") from e
    return {"source": source, "name": fn.__name__}


def _env(rank: int, nprocs: int, port: int, abort_file: str, extra: dict | None) -> dict:
    env = dict(os.environ)
    env.update({
        "RANK": str(rank), "WORLD_SIZE": str(nprocs), "LOCAL_RANK": str(rank), "LOCAL_WORLD_SIZE": str(nprocs),
        "GROUP_RANK": "0", "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port),
        "TORCHTPU_LAB_ABORT_FILE": abort_file, "PYTHONUNBUFFERED": "1",
    })
    # The ranks import what this process imports (the notebook's working directory and sys.path first).
    env["PYTHONPATH"] = os.pathsep.join([os.getcwd()] + [p for p in sys.path if p])
    env.update(extra or {})
    return env


def launch(fn: Callable | str, nprocs: int = 2, *, args: tuple = (), timeout: float = 300.0,
           env: dict | None = None) -> list[RankResult]:
    """Run ``fn(*args)`` on ``nprocs`` ranks on this host; returns each rank's :class:`RankResult` (rank order).

    Raises :class:`LaunchError` if any rank fails or the run exceeds ``timeout`` seconds (all ranks are
    stopped first; the error shows each rank's error and the tail of its output)."""
    if nprocs < 1:
        raise ValueError(f"launch: nprocs must be at least 1, got {nprocs}")
    spec = {"fn": _function_spec(fn), "args": args}
    workdir = tempfile.mkdtemp(prefix="torchtpu_lab_launch_")
    abort_file = os.path.join(workdir, "abort")
    port = _free_port()
    procs, files = [], []
    with open(os.path.join(workdir, "spec.pkl"), "wb") as f:
        pickle.dump(spec, f)
    rank_status.begin(nprocs)
    try:
        for rank in range(nprocs):
            out = open(os.path.join(workdir, f"rank{rank}.out"), "w+")
            err = open(os.path.join(workdir, f"rank{rank}.err"), "w+")
            files.append((out, err))
            procs.append(subprocess.Popen(
                [sys.executable, "-m", "torchtpu_lab._rank_main", workdir],
                env=_env(rank, nprocs, port, abort_file, env), stdout=out, stderr=err, stdin=subprocess.DEVNULL,
                start_new_session=True))
        failure = _supervise(procs, abort_file, timeout, workdir)
    finally:
        for p in procs:  # nothing outlives the call, whatever happened
            if p.poll() is None:
                p.kill()
            p.wait()
        _report_ranks(workdir, procs)
    try:
        results = _collect(workdir, procs, files)
    finally:
        shutil.rmtree(workdir, ignore_errors=True)
    if failure or any(r.error or r.returncode for r in results):
        lines = [failure or "launch: a rank failed"]
        for r in results:
            lines.append(f"--- rank {r.rank}: exit code {r.returncode}" + (f"\n{r.error}" if r.error else ""))
            tail = "\n".join(r.stderr.strip().splitlines()[-6:])
            if tail and (r.error is None or tail not in r.error):
                lines.append(textwrap.indent(tail, "    "))
        raise LaunchError("\n".join(lines), results)
    return results


def _collect(workdir: str, procs: list, files: list) -> list[RankResult]:
    """Each rank's outputs and result file, read back."""
    results = []
    for rank, (out, err) in enumerate(files):
        out.seek(0)
        err.seek(0)
        r = RankResult(rank, stdout=out.read(), stderr=err.read(), returncode=procs[rank].returncode)
        out.close()
        err.close()
        path = os.path.join(workdir, f"rank{rank}.result")
        if os.path.exists(path):
            with open(path, "rb") as f:
                status, payload = pickle.load(f)
            if status == "ok":
                r.value = payload
            else:
                r.error = payload
        elif r.returncode:
            r.error = _last_line(r.stderr) or f"exited with code {r.returncode}"
        results.append(r)
    return results


def _last_line(text: str) -> str:
    lines = [ln for ln in text.strip().splitlines() if ln.strip()]
    return lines[-1] if lines else ""


def _report_ranks(workdir: str, procs: list) -> None:
    """Read the ranks' progress (:mod:`.rank_status`) and tell the live displays (the JupyterLab panel) if it
    changed; never raises."""
    with contextlib.suppress(Exception):  # progress display must never break a launch
        if rank_status.poll(workdir, [p.poll() for p in procs]):
            telemetry.live_update()


def _supervise(procs: list, abort_file: str, timeout: float, workdir: str = "") -> str | None:
    """Wait for every rank; on the first failure tell the others to stop. Returns why the run failed, if so."""
    deadline = time.monotonic() + timeout
    failed_at = None
    why = None
    next_report = 0.0
    while True:
        if workdir and time.monotonic() >= next_report:
            _report_ranks(workdir, procs)
            next_report = time.monotonic() + rank_status.REPORT_INTERVAL_S
        codes = [p.poll() for p in procs]
        if all(c is not None for c in codes):
            return why
        bad = [(i, c) for i, c in enumerate(codes) if c not in (None, 0)]
        if bad and failed_at is None:
            rank, code = bad[0]
            why = f"launch: rank {rank} failed (exit code {code}); the other ranks were stopped"
            with open(abort_file, "w") as f:
                f.write(f"rank {rank} failed (exit code {code})")
            failed_at = time.monotonic()
        if failed_at is not None and time.monotonic() - failed_at > _GRACE_S:
            for p in procs:
                if p.poll() is None:
                    p.kill()
        if time.monotonic() > deadline:
            with open(abort_file, "w") as f:
                f.write(f"launch timeout ({timeout:.0f} s)")
            time.sleep(1.0)
            for p in procs:
                if p.poll() is None:
                    p.kill()
            return f"launch: timed out after {timeout:.0f} s"
        time.sleep(0.05)
