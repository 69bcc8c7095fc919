"""``torchtpu_lab.log_scalar(name, tensor)``: log a metric (a loss, an accuracy) without stopping the device.

``print(loss.item())`` in a training loop makes the host wait for the device every step. Here the scalar is
copied on the device (a one-element clone, recorded into the step's graph in fused mode) and kept; pending
scalars are fetched together, in one device-to-host transfer, when a sync happens anyway (an ``.item()``, a
``torchtpu_lab.sync()`` step boundary, a print): at each sync, every logged scalar whose value the device has
already computed comes back. ``flush_every=N`` also fetches once N scalars are pending (one sync per N steps,
for loops that never sync), and :func:`scalars` fetches what is left.

Values computed by the graph a sync is about to run come back at the following sync (or at :func:`scalars`):
fetching them at once would make every step boundary wait for the device, which is what this avoids.
"""

from __future__ import annotations

import threading
from collections import deque

import jax
import torch

from .. import telemetry
from ..device.storage import FailedValue
from ..telemetry import SyncReason
from . import fused

#: the most values kept per name (the oldest go first)
MAX_HISTORY = 100_000


class ScalarLog:
    """Logged scalars: ``pending`` (name, one-element tpu tensor) not fetched yet, ``history`` name -> values."""

    def __init__(self) -> None:
        self.pending: list[tuple[str, torch.Tensor]] = []
        self.history: dict[str, deque] = {}
        self.lock = threading.RLock()
        self.transfers = 0  # device-to-host transfers made (one per fetch, however many scalars)

    def add(self, name: str, value) -> None:
        self.history.setdefault(name, deque(maxlen=MAX_HISTORY)).append(value)

    def fetch(self, ready_only: bool) -> int:
        """Bring back pending scalars in one transfer (``ready_only``: only those the device already computed, so
        nothing waits for a graph that has not run); returns how many came back."""
        with self.lock:
            if not self.pending:
                return 0
            failed = []
            if not ready_only:
                if any(not isinstance(t.tpu_storage.held, jax.Array) for _, t in self.pending):
                    fused.sync(SyncReason.READ)
                failed = [(n, t) for n, t in self.pending if isinstance(t.tpu_storage.held, FailedValue)]
            ready = [(n, t) for n, t in self.pending if isinstance(t.tpu_storage.held, jax.Array)]
            done = {id(t) for _, t in ready + failed}
            self.pending = [(n, t) for n, t in self.pending if id(t) not in done]
            if ready:
                values = jax.device_get([t.tpu_storage.array for _, t in ready])
                self.transfers += 1
                for (name, _), v in zip(ready, values):
                    self.add(name, v.reshape(-1)[0].item())
            if failed:  # reported once, then dropped: the other scalars and later logs go on
                names = sorted({n for n, _ in failed})
                error = failed[0][1].tpu_storage.held.error
                raise RuntimeError(f"log_scalar: {len(failed)} value(s) logged as {', '.join(names)} were never "
                                   f"computed (the graph that computed them failed: {error})") from error
            return len(ready)


LOG = ScalarLog()


def _at_sync() -> None:
    """A telemetry live hook: a sync is happening; fetch what is ready (never raises: it runs inside a sync)."""
    if not LOG.pending:
        return
    try:
        LOG.fetch(ready_only=True)
    except Exception:  # noqa: BLE001,S110 — a failed fetch is retried at the next sync or at scalars()
        pass


def log_scalar(name: str, value, flush_every: int | None = None) -> None:
    """Log ``value`` (a one-element tensor, or a Python number) under ``name`` without a host sync; it is fetched
    with the other pending scalars at the next sync that happens anyway (``flush_every=N``: or as soon as N
    scalars are pending). :func:`scalars` returns the history."""
    if not isinstance(name, str) or not name:
        raise ValueError(f"log_scalar: name must be a non-empty string, got {name!r}")
    if flush_every is not None and (not isinstance(flush_every, int) or flush_every < 1):
        raise ValueError(f"log_scalar: flush_every must be a positive number of scalars, got {flush_every!r}")
    if not isinstance(value, torch.Tensor):
        if not isinstance(value, (int, float, bool)):
            raise TypeError(f"log_scalar({name!r}, ...): expected a one-element tensor or a number, "
                            f"got {type(value).__name__}")
        with LOG.lock:
            LOG.add(name, value)
        return
    if value.numel() != 1:
        raise ValueError(f"log_scalar({name!r}, ...): expected a one-element tensor, got shape {tuple(value.shape)}")
    if value.device.type != "tpu":
        with LOG.lock:
            LOG.add(name, value.detach().reshape(-1)[0].item())
        return
    snapshot = value.detach().reshape(1).clone()  # the value now, whatever later in-place ops do to ``value``
    with LOG.lock:
        LOG.pending.append((name, snapshot))
        if _at_sync not in telemetry.live_hooks:
            telemetry.live_hooks.append(_at_sync)
        if flush_every is not None and len(LOG.pending) >= flush_every:
            LOG.fetch(ready_only=False)


def scalars(clear: bool = False) -> dict[str, list]:
    """Every logged scalar by name, in logging order (pending ones fetched now, in one transfer);
    ``clear=True`` forgets them after returning them."""
    with LOG.lock:
        LOG.fetch(ready_only=False)
        out = {name: list(values) for name, values in LOG.history.items()}
        if clear:
            LOG.history.clear()
    return out
