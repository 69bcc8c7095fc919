"""transformers' ``generate()`` reads its stop flag one token late on tpu, as it does on MPS.

Greedy and sampled decoding check after every token whether every sequence has finished
(``unfinished_sequences.max() == 0``). Read at once, that check makes the host wait for the device each token:
in fused eager mode the token's graph is launched and the host sits idle until it has run, instead of recording
the next token meanwhile. transformers (5.x) already has the remedy, ``DeferredStopCheck``: it copies the flag
with ``copy_(..., non_blocking=True)``, records a ``torch.Event`` and reads the flag a step later, then undoes
the one extra step at the end. It enables it only where it measured a gain (``DeferredStopCheck.is_supported``:
MPS). On tpu the non-blocking copy and the event do what it needs (:mod:`torchtpu_lab.runtime.host_copies`), so
:func:`install` wraps that one static method when ``transformers.generation.utils`` is imported: True for a tpu
device under the conditions transformers sets for MPS (not an assistant model; a cache it can crop, or one it
does not return) where ``config.deferred_stop_check`` says so, transformers' own answer otherwise. Listed in
:func:`torchtpu_lab.global_changes`; the tokens are the same either way (``tests/test_host_copies.py``).

``deferred_stop_check="auto"`` (the default) defers where the device is a TPU or a GPU, not on XLA:CPU. There the
"device" is the host's own cores: a token's program is ready ~40 µs after its launch returns, so there is almost
nothing to overlap, and the one extra token costs more (tiny Llama, 32 tokens: 0.97 against 0.92 ms a token).
On an accelerator a token's device time is what the host waits for, and overlapping it is the point.
"""

from __future__ import annotations

from .. import config, native, platform
from .after_import import when_imported

_installed: list[str] = []


def _wrap(utils_module) -> None:
    cls = getattr(utils_module, "DeferredStopCheck", None)
    original = cls.__dict__.get("is_supported") if cls is not None else None
    if not isinstance(original, staticmethod) or getattr(original.__func__, "_torchtpu_lab", False):
        return
    transformers_answer = original.__func__

    def is_supported(device, cache, cache_is_returned, is_assistant) -> bool:
        if getattr(device, "type", None) != "tpu" or is_assistant or not defers():
            return transformers_answer(device, cache, cache_is_returned, is_assistant)
        return cache is None or bool(cache.is_croppable) or not cache_is_returned

    is_supported._torchtpu_lab = True
    is_supported.__doc__ = transformers_answer.__doc__
    cls.is_supported = staticmethod(is_supported)
    _installed.append("transformers.generation.utils.DeferredStopCheck.is_supported")


def defers() -> bool:
    """Whether ``generate()`` on tpu defers its stop check (``config.deferred_stop_check``). Never without the
    native core: the check waits on a ``torch.Event``, which PyTorch's Python registration path cannot give."""
    if native.module() is None:
        return False
    choice = config.deferred_stop_check.value
    return platform.info().platform != "cpu" if choice == "auto" else choice


def install() -> None:
    """Wrap the deferred stop check's device test now if transformers' generation is imported, else when it is
    (idempotent)."""
    when_imported("transformers.generation.utils", _wrap)


def wrapped() -> list[str]:
    return list(_installed)
