"""``%load_ext torchtpu_lab``: turn the kernel into a tpu session; ``%unload_ext`` turns it back.

Loading registers the device (already done by the import), switches to fused eager mode, enables the persistent
compile cache, starts remembering which line created each device buffer, flushes pending fused work at the end
of every cell, names notebook cells in reports ("cell [3], line 2") and shows a banner. Loading twice only shows
the banner again. Unloading flushes, removes the hook and the magics, and switches to strict mode, where every
op runs when it is called, as in plain PyTorch (the device itself stays registered: PyTorch cannot unregister it).
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable

from IPython.display import display

from .. import telemetry
from ..device import memory
from ..records import Status
from ..runtime import compile_cache, fused, host_copies, modes
from . import comm
from .status import CELL_SECONDS, banner_lines, status

_state: dict = {"loaded": False}


class Banner:
    """The load banner: HTML in a notebook, text in a terminal."""

    def __init__(self, data: Status):
        self.data = data

    def _repr_mimebundle_(self, include=None, exclude=None):
        from html import escape

        lines = banner_lines(self.data)
        html = ('<div style="font-family:var(--jp-code-font-family,monospace);font-size:12px;line-height:1.4">'
                + "<br>".join(escape(x).replace("  ", "&nbsp;&nbsp;") for x in lines) + "</div>")
        return {"text/plain": "\n".join(lines), "text/html": html}


def _start_of_cell(info=None) -> None:
    _state["cell_t0"] = time.perf_counter()


def _end_of_cell(result=None) -> None:
    """Flush the cell's pending fused work and land its non-blocking copies to the host (the next cell may read
    them: a cell is as far as a copy stays in flight). A failure becomes the cell's error (its execution result, so the
    kernel replies "error" and "Run All", nbclient and papermill stop) with its traceback shown; the kernel
    and every tensor computed before stay usable. The cell's wall time is counted (the status's compile
    share is of it)."""
    try:
        fused.sync(telemetry.SyncReason.END_OF_CELL, source=telemetry.END_OF_CELL)
        host_copies.land()
    except Exception as e:  # noqa: BLE001
        from IPython import get_ipython

        shell = get_ipython()
        if result is not None and getattr(result, "error_in_exec", None) is None \
                and getattr(result, "error_before_exec", None) is None:
            result.error_in_exec = e
            if shell is not None:
                shell.showtraceback()  # also what ipykernel sends as the reply's traceback
                return
        print(f"torchtpu_lab: pending work of this cell failed: {type(e).__name__}: {e}")
    finally:
        t0 = _state.pop("cell_t0", None)
        if t0 is not None:
            telemetry.count(CELL_SECONDS, time.perf_counter() - t0)


def _cell_labeler(shell):
    def label(filename: str):
        count = getattr(shell.compile, "_filename_map", {}).get(filename)
        return f"cell [{count}]" if count is not None else None

    return label


def load_ipython_extension(ip, global_changes: Callable[[], dict] | None = None) -> None:
    """Load (or, loaded already, show the banner again). ``global_changes``: what the package changed outside
    its own objects, for the banner; the package's entry point passes its :func:`torchtpu_lab.global_changes`
    (this layer sits below the package root and never imports it)."""
    from .magics import TpuMagics

    if not _state["loaded"]:
        _state["previous_track"] = memory.TRACK_SOURCES.value
        modes.set_eager_mode("fused")
        if compile_cache.directory() is None:
            compile_cache.enable()
        memory.TRACK_SOURCES.set(True)
        ip.events.register("pre_run_cell", _start_of_cell)
        ip.events.register("post_run_cell", _end_of_cell)
        _state["labeler"] = _cell_labeler(ip)
        telemetry.labelers.append(_state["labeler"])
        ip.register_magics(TpuMagics)
        comm.setup(ip, loaded)  # JupyterLab panel; never raises
        _state["loaded"] = True
        telemetry.count("extension_loads")
    data = status()
    if global_changes is not None:
        data = dataclasses.replace(data, global_changes=global_changes())
    display(Banner(data))


def unload_ipython_extension(ip) -> None:
    if not _state["loaded"]:
        return
    from . import watch

    watch.stop()
    fused.sync(telemetry.SyncReason.UNLOAD)
    for event, hook in (("pre_run_cell", _start_of_cell), ("post_run_cell", _end_of_cell)):
        try:
            ip.events.unregister(event, hook)
        except ValueError:
            pass
    telemetry.labelers.remove(_state["labeler"])
    for kind, names in (("line", ("tpu",)), ("cell", ("tpu_profile",))):
        for name in names:
            ip.magics_manager.magics[kind].pop(name, None)
    memory.TRACK_SOURCES.set(_state["previous_track"])
    modes.set_eager_mode("strict")  # plain PyTorch behaviour: every op runs when it is called
    _state["loaded"] = False


def loaded() -> bool:
    return _state["loaded"]
