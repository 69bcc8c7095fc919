"""``%tpu watch``: an ipywidgets panel refreshed by a background timer while later cells run.

The timer thread only reads counters (plain Python numbers) and writes widget values, which ipywidgets
sends over the kernel's comm; it never touches tensors or the runtime, so it is safe while a cell executes.
"""

from __future__ import annotations

import threading

from ..records import Status

_state: dict = {"thread": None, "stop": None, "widget": None}


def _text(s: Status) -> str:
    from .status import status_lines

    return "\n".join(status_lines(s))


def start(interval: float = 1.0):
    import ipywidgets as widgets

    from .status import status

    stop()
    label = widgets.HTML()
    box = widgets.VBox([widgets.HTML("<b>torchtpu_lab watch</b>"), label])
    stop_event = threading.Event()

    def refresh() -> None:
        from html import escape

        label.value = "<pre style='margin:0'>" + escape(_text(status())) + "</pre>"

    def loop() -> None:
        while not stop_event.wait(interval):
            try:
                refresh()
            except Exception:  # noqa: BLE001 — a failed refresh must never kill the kernel
                pass

    refresh()
    thread = threading.Thread(target=loop, name="torchtpu_lab-watch", daemon=True)
    thread.start()
    _state.update(thread=thread, stop=stop_event, widget=box)
    return box


def stop() -> None:
    if _state["stop"] is not None:
        _state["stop"].set()
        _state["thread"].join(timeout=2)
    _state.update(thread=None, stop=None, widget=None)


def running() -> bool:
    return _state["thread"] is not None and _state["thread"].is_alive()
