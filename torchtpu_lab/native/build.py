"""Compile ``torchtpu_lab/csrc`` into ``torchtpu_lab._C`` against the torch that is installed, once.

Decision: build on first import (and in ``make install``, which runs ``python -m torchtpu_lab.native`` so a
fresh clone's ``make test`` pays the build before the tests start), cached per torch version, Python version and
digest of the C++ sources under ``$TORCHTPU_LAB_NATIVE_DIR`` (default ``~/.cache/torchtpu_lab/native``).
Building against the user's own torch at run time sidesteps pip's build isolation (which would compile against
a different torch) and wheels per torch version. We drive the compiler ourselves with the paths
``torch.utils.cpp_extension`` reports (no ``ninja`` dependency): one process per translation unit, two at a
time; no unit includes ``torch/extension.h`` (130 s for one unit on a loaded 2-core machine), only the ATen/c10
headers it needs. A file lock makes concurrent first imports (pytest-xdist workers) build once.
"""

from __future__ import annotations

import concurrent.futures
import contextlib
import fcntl
import hashlib
import os
import pathlib
import shutil
import subprocess
import sys
import sysconfig
import tempfile
import time

SOURCES = pathlib.Path(__file__).resolve().parent.parent / "csrc"
_CXX_FLAGS = ("-O2", "-fPIC", "-std=c++20", "-fvisibility=hidden", "-w")
_LIBS = ("c10", "torch", "torch_cpu", "torch_python")


def cache_root() -> pathlib.Path:
    """``$TORCHTPU_LAB_NATIVE_DIR``, else ``~/.cache/torchtpu_lab/native``: one place per user, not per compile
    cache (tests give every fresh process its own ``TORCHTPU_LAB_CACHE_DIR``; the core must not rebuild there)."""
    base = os.environ.get("TORCHTPU_LAB_NATIVE_DIR")
    return pathlib.Path(base) if base else pathlib.Path.home() / ".cache" / "torchtpu_lab" / "native"


def compiler() -> str | None:
    """The C++ compiler to use (``$CXX``, else ``c++``/``g++``/``clang++`` on the PATH), or ``None``."""
    for name in (os.environ.get("CXX"), "c++", "g++", "clang++"):
        if name and shutil.which(name):
            return shutil.which(name)
    return None


def build_key() -> str:
    """What the built module depends on: the torch build, the Python ABI and the sources."""
    import torch

    h = hashlib.sha256()
    h.update(f"{torch.__version__}|{torch.__file__}|{sys.implementation.cache_tag}".encode())
    for path in sorted(SOURCES.glob("*")):
        if path.suffix in (".cpp", ".h"):
            h.update(path.name.encode())
            h.update(path.read_bytes())
    return f"torch{torch.__version__.replace('+', '_')}-{sys.implementation.cache_tag}-{h.hexdigest()[:16]}"


def module_path() -> pathlib.Path:
    return cache_root() / build_key() / f"_C{sysconfig.get_config_var('EXT_SUFFIX')}"


def _flags() -> tuple[list[str], list[str]]:
    import torch
    from torch.utils import cpp_extension

    includes = [*cpp_extension.include_paths(), sysconfig.get_paths()["include"]]
    cflags = [*_CXX_FLAGS, *(f"-I{p}" for p in includes), "-DTORCH_EXTENSION_NAME=_C",
              f"-D_GLIBCXX_USE_CXX11_ABI={int(torch._C._GLIBCXX_USE_CXX11_ABI)}"]
    libdirs = cpp_extension.library_paths()
    ldflags = ["-shared", *(f"-L{p}" for p in libdirs), *(f"-Wl,-rpath,{p}" for p in libdirs),
               *(f"-l{lib}" for lib in _LIBS)]
    return cflags, ldflags


def _run(cmd: list[str]) -> None:
    out = subprocess.run(cmd, capture_output=True, text=True)
    if out.returncode != 0:
        raise RuntimeError(f"building torchtpu_lab's native core failed:\n$ {' '.join(cmd)}\n{out.stderr[-4000:]}")


@contextlib.contextmanager
def _locked(path: pathlib.Path):
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "w") as f:
        fcntl.flock(f, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(f, fcntl.LOCK_UN)


def build(verbose: bool = False) -> pathlib.Path:
    """The path of the built module, compiling it first unless this torch and these sources already have one.
    Raises ``RuntimeError`` (with the compiler's message) if there is no compiler or the build fails."""
    target = module_path()
    if target.exists():
        return target
    cxx = compiler()
    if cxx is None:
        raise RuntimeError("no C++ compiler found (set $CXX, or install g++ / clang++)")
    with _locked(target.parent.with_suffix(".lock")):
        if target.exists():  # another process built it while we waited
            return target
        t0 = time.perf_counter()
        if verbose:
            print(f"torchtpu_lab: building the native core into {target.parent} ...", file=sys.stderr, flush=True)
        cflags, ldflags = _flags()
        units = sorted(SOURCES.glob("*.cpp"))
        with tempfile.TemporaryDirectory(dir=target.parent.parent) as tmp:
            objects = [pathlib.Path(tmp) / f"{u.stem}.o" for u in units]
            with concurrent.futures.ThreadPoolExecutor(max_workers=min(2, os.cpu_count() or 1)) as pool:
                list(pool.map(_run, [[cxx, *cflags, "-c", str(u), "-o", str(o)] for u, o in zip(units, objects)]))
            linked = pathlib.Path(tmp) / target.name
            _run([cxx, *map(str, objects), *ldflags, "-o", str(linked)])
            target.parent.mkdir(parents=True, exist_ok=True)
            os.replace(linked, target)  # atomic: a reader sees no module or a whole one
        if verbose:
            print(f"torchtpu_lab: native core built in {time.perf_counter() - t0:.0f} s", file=sys.stderr,
                  flush=True)
    return target
