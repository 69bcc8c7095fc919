"""The persistent compilation cache: JAX's on-disk cache, in a directory of ours, so that a restarted kernel
does not recompile what it compiled before.

It is process-wide JAX configuration, so ``import torchtpu_lab`` does not switch it on by itself: it is enabled
by ``%load_ext torchtpu_lab``, by :func:`torchtpu_lab.configure`, or at import when the user asked for it by
setting ``$TORCHTPU_LAB_CACHE_DIR``. If the user's own code already set ``jax_compilation_cache_dir``, that
directory is kept (never overridden) and used as ours. :func:`torchtpu_lab.global_changes` lists what is on.

The directory is ``$TORCHTPU_LAB_CACHE_DIR`` or the user cache directory (``$XDG_CACHE_HOME/torchtpu_lab/xla``,
by default ``~/.cache/torchtpu_lab/xla``). Every executable is cached, however small or fast to compile (JAX's
defaults skip entries under one second, which is all of them on small models). An unwritable or corrupt
directory produces a warning and the session carries on without a disk cache. JAX's monitoring events tell us
which compilations were served from disk.
"""

from __future__ import annotations

import os
import warnings

import jax

from .. import telemetry

_state = {"dir": None, "listening": False}


def default_dir() -> str:
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return os.path.join(base, "torchtpu_lab", "xla")


def _on_event(event: str, **kwargs) -> None:
    if event == "/jax/compilation_cache/cache_hits":
        telemetry.count("persistent_cache_hits")
    elif event == "/jax/compilation_cache/cache_misses":
        telemetry.count("persistent_cache_misses")


def _on_duration(event: str, duration: float, **kwargs) -> None:
    # JAX times every request for an executable this way, whether XLA compiled it or the disk cache served it:
    # XLA compilations performed = requests - persistent_cache_hits.
    if event == "/jax/core/compile/backend_compile_duration":
        telemetry.count("xla_compile_requests")
        telemetry.count("xla_compile_request_seconds", duration)


def enable(directory: str | None = None) -> str | None:
    """Turn on the persistent cache in ``directory`` (default: see module docstring); returns the directory,
    or ``None`` (with a warning) when it cannot be used."""
    theirs = jax.config.jax_compilation_cache_dir
    if theirs and theirs != _state["dir"]:
        directory = theirs  # the user configured JAX's cache themselves: share it, never override it
    directory = directory or os.environ.get("TORCHTPU_LAB_CACHE_DIR") or default_dir()
    try:
        os.makedirs(directory, exist_ok=True)
        probe = os.path.join(directory, ".torchtpu_lab_write_test")
        with open(probe, "w") as f:
            f.write("ok")
        os.remove(probe)
    except OSError as e:
        warnings.warn(f"torchtpu_lab: compilation cache directory {directory!r} is not writable ({e}); "
                      "continuing without a persistent cache", RuntimeWarning, stacklevel=2)
        return None
    jax.config.update("jax_compilation_cache_dir", directory)
    jax.config.update("jax_persistent_cache_min_compile_time_secs", 0)
    jax.config.update("jax_persistent_cache_min_entry_size_bytes", -1)
    if not _state["listening"]:
        jax.monitoring.register_event_listener(_on_event)
        jax.monitoring.register_event_duration_secs_listener(_on_duration)
        _state["listening"] = True
    _state["dir"] = directory
    return directory


def directory() -> str | None:
    return _state["dir"]


def entries() -> int:
    """Number of executables stored on disk (0 when the cache is off)."""
    d = _state["dir"]
    if not d or not os.path.isdir(d):
        return 0
    return sum(1 for name in os.listdir(d) if not name.startswith("."))


def clear() -> int:
    """Delete the on-disk entries; returns how many were removed."""
    d = _state["dir"]
    removed = 0
    if d and os.path.isdir(d):
        for name in os.listdir(d):
            path = os.path.join(d, name)
            if os.path.isfile(path):
                os.remove(path)
                removed += 1
    return removed
