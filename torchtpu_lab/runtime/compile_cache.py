"""The persistent executable cache: compiled XLA executables on disk, keyed by *our* signatures, so a restarted
kernel neither recompiles nor even traces what it ran before.

Why our own cache rather than JAX's: JAX's cache is keyed by the lowered HLO, so a warm process must still trace
every op and graph and lower it before the disk can answer — on small models that is most of the first step.
Here the key is a digest of the op or graph signature (:func:`.signatures.digest`: ops by ATen name, dtypes,
shapes, view geometry, static values), plus everything else that decides the program: the jax, jaxlib and torch
versions, a digest of this package's own source (a changed lowering never reuses an old executable), the
platform, device kind and device, and the x64 / XLA flags. A hit deserializes the executable
(:mod:`jax.experimental.serialize_executable`) and runs it — no tracing, no lowering, no XLA compile. A signature
with a value that has no stable encoding is simply not stored.

Robustness: keys never contain the cache directory's path (a copied or shared cache hits); a directory we may
read but not write is used read-only; each entry is checked (magic, lengths, SHA-256 of its contents, the key it
claims) and capped in size (``$TORCHTPU_LAB_CACHE_MAX_ENTRY_MB``, default 512; only regular files are read, and
never more than the cap, so a symlink to an endless file or a FIFO is refused). A damaged entry produces a
warning and a normal compile (which then replaces it); writes are atomic (a temporary file, then a rename).

Trust: like JAX's own cache, an entry is executable code for the device (and its envelope is a pickle), so the
cache directory must be as trusted as the Python environment itself; never point it at a directory others may
write.

It is off until asked for: ``%load_ext torchtpu_lab``, :func:`torchtpu_lab.configure` or
``$TORCHTPU_LAB_CACHE_DIR``. It never changes JAX's global configuration: JAX's own compilation cache (which
would also cache the user's own ``jax.jit`` code) is configured only with ``enable(..., share_with_jax=True)``.
The directory is ``$TORCHTPU_LAB_CACHE_DIR`` or ``$XDG_CACHE_HOME/torchtpu_lab/xla`` (``~/.cache/...``).

Each entry also stores XLA's cost analysis of its executable (:mod:`.program_cost`), so a loaded executable
carries its FLOPs and bytes without being analysed again. Beside the executables (``*.tpx``) the directory holds
small JSON "facts" entries in the same envelope (``*.facts``: what tracing an op with checks told fused mode,
:mod:`.op_facts`) and each origin's list of the entries it used, which the next process of that origin loads
ahead on a background thread (``recent-*.json``, :mod:`.prefetch`).

Counters: ``xla_compile_requests`` (executables asked for), ``persistent_cache_hits`` / ``persistent_cache_misses``
(served from disk / compiled with the cache on), ``persistent_cache_errors`` (damaged entries skipped),
``jax_traces`` / ``jax_lowerings`` / ``xla_compiles`` (JAX's own monitoring events: anything traced, lowered or
compiled in this process, ours or not).
"""

from __future__ import annotations

import hashlib
import json
import os
import stat
import struct
import sys
import tempfile
import threading
import warnings

import jax

from .. import platform, telemetry
from ..device import memory
from ..ops.error_flags import Check
from . import code_budget, program_cost
from .prefetch import PREFETCHER
from .signatures import digest

_MAGIC = b"TTPXEC01"
_HEADER = struct.Struct("<QQ")  # meta length, payload length
_SUFFIX = ".tpx"
_FACTS_SUFFIX = ".facts"
_state: dict = {"dir": None, "writable": False, "listening": False, "context": None}
_lock = threading.Lock()


def default_dir() -> str:
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return os.path.join(base, "torchtpu_lab", "xla")


def max_entry_bytes() -> int:
    """The largest entry read or written (``$TORCHTPU_LAB_CACHE_MAX_ENTRY_MB``, default 512 MiB)."""
    raw = os.environ.get("TORCHTPU_LAB_CACHE_MAX_ENTRY_MB", "512")
    try:
        return max(1, int(float(raw) * (1 << 20)))
    except ValueError:
        raise ValueError(f"TORCHTPU_LAB_CACHE_MAX_ENTRY_MB={raw!r}: expected a number of MiB") from None


_JAX_EVENTS = {
    "/jax/core/compile/jaxpr_trace_duration": "jax_traces",
    "/jax/core/compile/jaxpr_to_mlir_module_duration": "jax_lowerings",
    "/jax/core/compile/backend_compile_duration": "xla_compiles",
}


def _on_duration(event: str, duration: float, **kwargs) -> None:
    name = _JAX_EVENTS.get(event)
    if name is not None:
        telemetry.count(name)
        telemetry.count(name + "_seconds", duration)


def listen() -> None:
    """Count JAX's traces, lowerings and XLA compiles (idempotent; cheap: JAX reports each one once)."""
    if not _state["listening"]:
        jax.monitoring.register_event_duration_secs_listener(_on_duration)
        _state["listening"] = True


def enable(directory: str | None = None, share_with_jax: bool = False) -> str | None:
    """Turn on the persistent cache in ``directory`` (default: see module docstring); returns the directory, or
    ``None`` (with a warning) when it can neither be created nor read. A populated directory we cannot write is
    used read-only (with a warning). ``share_with_jax=True`` also points JAX's own compilation cache at
    ``<directory>/jax`` (process-wide: it caches the user's own ``jax.jit`` code too)."""
    directory = directory or os.environ.get("TORCHTPU_LAB_CACHE_DIR") or default_dir()
    writable = True
    try:
        os.makedirs(directory, exist_ok=True)
        probe = tempfile.NamedTemporaryFile(dir=directory, prefix=".write_test", delete=True)
        probe.close()
    except OSError as e:
        if os.path.isdir(directory) and os.access(directory, os.R_OK | os.X_OK):
            writable = False
            warnings.warn(f"torchtpu_lab: compilation cache directory {directory!r} is not writable ({e}); "
                          "using it read-only", RuntimeWarning, stacklevel=2)
        else:
            warnings.warn(f"torchtpu_lab: compilation cache directory {directory!r} is not writable ({e}); "
                          "continuing without a persistent cache", RuntimeWarning, stacklevel=2)
            return None
    listen()
    with _lock:
        _state["dir"], _state["writable"] = directory, writable
    platform.when_known(_prefetch)
    if share_with_jax:
        jax.config.update("jax_compilation_cache_dir", os.path.join(directory, "jax"))
        jax.config.update("jax_persistent_cache_min_compile_time_secs", 0)
    return directory


def _prefetch(info) -> None:
    """Start loading what the previous process of this origin used (:mod:`.prefetch`) once the device exists."""
    directory = _state["dir"]
    if directory is None:
        return
    try:
        PREFETCHER.start(directory, _SUFFIX, info.devices[0], _load_ahead, run_on_zeros=info.platform == "cpu",
                         prepare=_context)
    except Exception as e:  # noqa: BLE001 — runs inside platform.info(); a prefetch that cannot start is only slower
        warnings.warn(f"torchtpu_lab: not prefetching cached executables ({type(e).__name__}: {e})",
                      RuntimeWarning, stacklevel=2)


def _load_ahead(key: str, device):
    """:func:`load` on the prefetch thread: quiet (a damaged entry is reported when a request loads it), and with
    the executable's memory analysis asked now (remembered), off the path of the sync that first runs it."""
    loaded = load(key, device, report=False)
    if loaded is not None:
        memory.analysis(loaded[0])
    return loaded


def disable() -> None:
    """Stop reading and writing the persistent cache (its files stay)."""
    with _lock:
        _state["dir"], _state["writable"] = None, False


def directory() -> str | None:
    return _state["dir"]


def settings() -> tuple[str | None, bool]:
    """``(directory, writable)``: where the cache is and whether it is written (for :func:`use_settings`)."""
    return _state["dir"], _state["writable"]


def use_settings(saved: tuple[str | None, bool]) -> None:
    """Put back what :func:`settings` returned (no probing: the directory was checked when it was enabled)."""
    with _lock:
        _state["dir"], _state["writable"] = saved


def read_only() -> bool:
    """Whether the cache is on but may only be read."""
    return _state["dir"] is not None and not _state["writable"]


def entries() -> int:
    """Number of executables stored on disk (0 when the cache is off)."""
    d = _state["dir"]
    if not d or not os.path.isdir(d):
        return 0
    return sum(1 for name in os.listdir(d) if name.endswith(_SUFFIX))


def clear() -> int:
    """Delete the on-disk entries (executables, op facts, prefetch lists); returns how many executables were
    removed (none from a read-only cache)."""
    d = _state["dir"]
    removed = 0
    if d and os.path.isdir(d) and _state["writable"]:
        for name in os.listdir(d):
            path = os.path.join(d, name)
            if name.endswith((_SUFFIX, _FACTS_SUFFIX)) or PREFETCHER.is_list(name):
                if os.path.isfile(path):
                    os.remove(path)
                    removed += name.endswith(_SUFFIX)
    return removed


# ---- keys ------------------------------------------------------------------------------------------------


def _source_digest() -> str:
    """SHA-256 of this package's Python source (relative paths and contents; never the install location)."""
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    h = hashlib.sha256()
    for dirpath, dirnames, filenames in os.walk(root):
        dirnames[:] = sorted(d for d in dirnames if not d.startswith((".", "__pycache__")))
        for name in sorted(filenames):
            if name.endswith(".py"):
                path = os.path.join(dirpath, name)
                h.update(os.path.relpath(path, root).replace(os.sep, "/").encode())
                with open(path, "rb") as f:
                    h.update(f.read())
    return h.hexdigest()


def _context() -> tuple:
    ctx = _state["context"]
    if ctx is None:
        import jaxlib
        import torch

        ctx = _state["context"] = (
            "torchtpu_lab-exec-1", jax.__version__, jaxlib.__version__, torch.__version__, _source_digest(),
            bool(jax.config.jax_enable_x64), os.environ.get("XLA_FLAGS", ""), os.environ.get("LIBTPU_INIT_ARGS", ""),
            str(jax.config.jax_default_matmul_precision),
        )
    return ctx


def disk_key(kind: str, signature, device, donate: tuple = (), convention: str = "") -> str | None:
    """The file name stem of an executable, or ``None`` when the cache is off or the signature has no stable
    encoding. ``device``: the ``jax.Device`` the executable runs on; ``convention``: how its arguments are laid
    out when more than one layout serves the same signature (a fused graph's numbers packed or not)."""
    if _state["dir"] is None or device is None:
        return None
    if jax.process_count() > 1:
        # A rank of a multi-process (torch.distributed) job: a deserialized executable is loaded for the whole
        # job's device assignment, not this rank's device, so its outputs come back as multi-shard arrays.
        # Ranks compile (JAX's own in-memory caches still serve repeats); measured, not guessed: see
        # tests/test_distributed.py with a warm cache directory.
        return None
    return digest(_context(), kind, signature, tuple(donate), convention, device.platform, device.device_kind,
                  device.id)


# ---- entries ---------------------------------------------------------------------------------------------


class _Damaged(Exception):
    pass


def tree_skeleton(treedef):
    """A JSON-able description of a pytree structure (tuples, lists, dicts with str keys, None, leaves)."""
    def enc(x):
        if x is _LEAF:
            return "L"
        if x is None:
            return ["n"]
        if isinstance(x, tuple) and not hasattr(type(x), "_fields"):
            return ["t", [enc(y) for y in x]]
        if isinstance(x, list):
            return ["l", [enc(y) for y in x]]
        if isinstance(x, dict) and all(isinstance(k, str) for k in x):
            return ["d", [[k, enc(x[k])] for k in x]]
        raise TypeError(f"unsupported pytree node {type(x).__name__}")

    return enc(jax.tree_util.tree_unflatten(treedef, [_LEAF] * treedef.num_leaves))


def tree_from_skeleton(s):
    def dec(x):
        if x == "L":
            return 0
        tag, body = x[0], x[1] if len(x) > 1 else None
        if tag == "n":
            return None
        if tag == "t":
            return tuple(dec(y) for y in body)
        if tag == "l":
            return [dec(y) for y in body]
        if tag == "d":
            return {k: dec(y) for k, y in body}
        raise _Damaged(f"unknown pytree tag {tag!r}")

    return jax.tree_util.tree_structure(dec(s))


class _Leaf:
    pass


_LEAF = _Leaf()


def _read_bounded(path: str, cap: int) -> bytes:
    flags = os.O_RDONLY | getattr(os, "O_NONBLOCK", 0) | getattr(os, "O_BINARY", 0)
    fd = os.open(path, flags)  # non-blocking: opening a FIFO never waits for a writer
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise _Damaged("not a regular file")
        if st.st_size > cap:
            raise _Damaged(f"{st.st_size} bytes, over the {cap}-byte entry cap")
        chunks, left = [], cap + 1
        while left > 0:
            chunk = os.read(fd, min(left, 1 << 24))
            if not chunk:
                break
            chunks.append(chunk)
            left -= len(chunk)
        data = b"".join(chunks)
    finally:
        os.close(fd)
    if len(data) > cap:
        raise _Damaged(f"over the {cap}-byte entry cap")
    return data


def _parse(data: bytes, key: str) -> tuple[dict, bytes]:
    n = len(_MAGIC) + _HEADER.size
    if len(data) < n + 32 or data[:len(_MAGIC)] != _MAGIC:
        raise _Damaged("bad header")
    meta_len, payload_len = _HEADER.unpack_from(data, len(_MAGIC))
    if n + meta_len + payload_len + 32 != len(data):
        raise _Damaged("truncated or padded")
    body = data[n:n + meta_len + payload_len]
    if hashlib.sha256(body).digest() != data[-32:]:
        raise _Damaged("checksum mismatch")
    meta = json.loads(body[:meta_len].decode())
    if meta.get("key") != key:
        raise _Damaged("entry belongs to another key")
    return meta, body[meta_len:]


def _read_entry(key: str | None, suffix: str, report: bool) -> tuple[str, bytes] | None:
    """``(path, bytes)`` of the entry ``key``, or ``None``: cache off, absent, or unreadable (warned if
    ``report``)."""
    d = _state["dir"]
    if key is None or d is None:
        return None
    path = os.path.join(d, key + suffix)
    try:
        return path, _read_bounded(path, max_entry_bytes())
    except FileNotFoundError:
        return None
    except (OSError, _Damaged) as e:
        return _damaged(path, e) if report else None


def _write_entry(key: str, suffix: str, meta: bytes, payload: bytes) -> bool:
    """Write an entry atomically (a temporary file, then a rename); ``False`` when over the cap or the disk
    refuses."""
    body = meta + payload
    blob = _MAGIC + _HEADER.pack(len(meta), len(payload)) + body + hashlib.sha256(body).digest()
    if len(blob) > max_entry_bytes():
        return False
    tmp = None
    try:
        fd, tmp = tempfile.mkstemp(dir=_state["dir"], prefix=".tmp-", suffix=suffix + ".part")
        with os.fdopen(fd, "wb") as f:
            f.write(blob)
        os.replace(tmp, os.path.join(_state["dir"], key + suffix))
        return True
    except OSError:
        if tmp is not None and os.path.exists(tmp):
            try:
                os.remove(tmp)
            except OSError:
                pass
        return False


def load(key: str | None, device, report: bool = True):
    """The executable stored under ``key`` (a ``jax.stages.Compiled``) and the checks its flag outputs belong
    to, or ``None`` when absent; a damaged entry warns (``report``) and returns ``None`` (the caller compiles)."""
    read = _read_entry(key, _SUFFIX, report)
    if read is None:
        return None
    path, data = read
    try:
        from jax.experimental import serialize_executable

        meta, payload = _parse(data, key)
        in_tree, out_tree = tree_from_skeleton(meta["in"]), tree_from_skeleton(meta["out"])
        found = [Check.decode(c) for c in meta.get("checks", [])]
        loaded = serialize_executable.deserialize_and_load(payload, in_tree, out_tree, backend=device.client)
        cost = meta.get("cost")
        program_cost.remember(loaded, program_cost.ProgramCost.from_dict(cost) if cost else None)
        return loaded, found
    except Exception as e:  # noqa: BLE001 — anything wrong with an entry means "compile instead"
        return _damaged(path, e) if report else None


def _damaged(path: str, error: BaseException) -> None:
    telemetry.count("persistent_cache_errors")
    warnings.warn(f"torchtpu_lab: ignoring damaged compilation cache entry {os.path.basename(path)} "
                  f"({type(error).__name__}: {error}); compiling instead", RuntimeWarning, stacklevel=4)
    return None


def store(key: str | None, compiled, found: list = ()) -> bool:
    """Write ``compiled`` (and ``found``, the checks its flag outputs belong to) under ``key`` (atomically);
    ``False`` when not stored (cache off or read-only, an executable or a check that cannot be serialized, an
    entry over the cap, a full disk)."""
    d = _state["dir"]
    if key is None or d is None or not _state["writable"]:
        return False
    encoded = [c.encode() for c in found]
    if None in encoded:
        return False
    try:
        from jax.experimental import serialize_executable

        payload, in_tree, out_tree = serialize_executable.serialize(compiled)
        cost = program_cost.of(compiled)
        meta = json.dumps({"key": key, "in": tree_skeleton(in_tree), "out": tree_skeleton(out_tree),
                           "checks": encoded, "python": sys.version.split()[0],
                           "cost": cost.to_dict() if cost is not None else None}).encode()
    except (TypeError, ValueError, NotImplementedError, AttributeError):
        return False
    return _write_entry(key, _SUFFIX, meta, payload)


def load_facts(kind: str, signature, device) -> dict | None:
    """The JSON facts stored for (``kind``, ``signature``, ``device``) by :func:`store_facts`, or ``None``
    (absent, cache off, or damaged: warned, and the caller works them out again)."""
    key = disk_key(kind, signature, device)
    read = _read_entry(key, _FACTS_SUFFIX, True)
    if read is None:
        return None
    path, data = read
    try:
        meta, _ = _parse(data, key)
        return meta["facts"]
    except Exception as e:  # noqa: BLE001 — a damaged entry means "work them out again"
        return _damaged(path, e)


def store_facts(kind: str, signature, device, facts: dict) -> bool:
    """Keep ``facts`` (JSON-able) for (``kind``, ``signature``, ``device``): what a warm process would otherwise
    trace again. ``False`` when not stored (cache off or read-only, no stable key, a full disk)."""
    key = disk_key(kind, signature, device)
    if key is None or not _state["writable"]:
        return False
    return _write_entry(key, _FACTS_SUFFIX, json.dumps({"key": key, "facts": facts}).encode(), b"")


#: XLA options of the programs that run eager ops (a strict op, a fused graph). XLA may keep a bfloat16 or float16
#: value in float32 between ops it fuses (XLA:CPU computes them so and drops the rounding between), which PyTorch's
#: eager kernels never do: each op's result is rounded to its dtype. With that allowed, a fused graph gave
#: ``x * 1 != x`` for a bfloat16 ``x`` drawn in the same graph, and ``trunc(a / b)`` differed from CPU's.
#: ``torch.compile`` programs keep XLA's default, as Inductor keeps float32 between the ops of a fused kernel.
EAGER_OPTIONS = {"xla_allow_excess_precision": False}
_EAGER_KINDS = frozenset({"op", "graph"})
#: On XLA:CPU, also no YNNPACK fusions: where XLA hands a dot to YNNPACK (with AVX-512), its float32 accumulation
#: sums in another order than XLA's own dot and CPU's gemm, and a half-precision product (accumulated in float32,
#: rounded once, as CPU's gemm does) lands an ulp off CPU's result (``baddbmm`` in float16). XLA's own dot kept
#: it exact and measured as fast on these sizes (32x64x256 to 1024^3, scratch timing). An option a jaxlib does
#: not know would fail every compile, so it is asked once whether this one does.
_CPU_EAGER_EXTRA = {"xla_cpu_experimental_ynn_fusion_type": ""}
_eager: dict = {}


def _eager_options() -> dict:
    if "options" not in _eager:
        options = dict(EAGER_OPTIONS)
        if platform.info().platform == "cpu":
            try:
                jax.jit(lambda x: x + 1).lower(1.0).compile(dict(options, **_CPU_EAGER_EXTRA))
                options.update(_CPU_EAGER_EXTRA)
            except Exception:  # noqa: BLE001 — "No such compile option": no YNNPACK fusions here to turn off
                pass
        _eager["options"] = options
    return _eager["options"]


def compiler_options(kind: str) -> dict | None:
    """The XLA options a program of ``kind`` is compiled with (``None``: XLA's defaults)."""
    return _eager_options() if kind in _EAGER_KINDS else None


def executable(fn, args: list, kind: str, signature, device, donate: tuple = (), checks: list | None = None,
               convention: str = ""):
    """``jax.jit(fn, donate_argnums=donate)`` compiled for ``args`` — or, with the cache on and an entry for
    (``kind``, ``signature``, ``device``), loaded from disk without tracing ``fn`` at all.

    Returns ``(executable, from_disk)``; the executable is called with ``args``' structure (``executable(*args)``).
    ``device``: where the executable runs (its inputs' device, or the default device for factory ops).
    ``checks``: for a function instrumented by :func:`.pending_errors.instrument`, the list its trace fills with the
    checks its flag outputs belong to; stored with the executable and filled from disk on a hit, since then
    nothing traces it (without them the flags would go uninspected and bad input would pass silently)."""
    telemetry.count("xla_compile_requests")
    key = disk_key(kind, signature, device, donate, convention)
    if key is not None:
        loaded = PREFETCHER.take(key) or load(key, device)
        if loaded is not None:
            telemetry.count("persistent_cache_hits")
            PREFETCHER.used(_state["dir"], _state["writable"], key)
            loaded, found = loaded
            if checks is not None:
                checks[:] = found
            code_budget.note_new_program()
            return loaded, True
        telemetry.count("persistent_cache_misses")
    with telemetry.compiling(kind):
        compiled = jax.jit(fn, donate_argnums=donate).lower(*args).compile(compiler_options(kind))
    if store(key, compiled, checks or ()):
        PREFETCHER.used(_state["dir"], _state["writable"], key)
    code_budget.note_new_program()
    return compiled, False
