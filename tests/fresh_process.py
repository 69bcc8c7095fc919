"""Run a script in a fresh Python process against a persistent cache directory and read back the counters it
ends with: how tests show that a warm process loads from disk, without tracing or compiling, what a cold one
compiled (tests/test_eager_modes.py for eager ops and fused graphs, tests/test_compile.py for torch.compile)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap

#: what tells compiles from disk loads (runtime/compile_cache.py: requests, hits and misses of the persistent
#: cache; JAX's own trace, lowering and XLA compile events in the process)
CACHE_COUNTERS = ("xla_compile_requests", "persistent_cache_hits", "persistent_cache_misses", "jax_traces",
                  "jax_lowerings", "xla_compiles")


def run_with_cache(script: str, cache_dir, counters: tuple = CACHE_COUNTERS, timeout: float = 600,
                   env: dict | None = None) -> dict:
    """``script`` run in a new interpreter with ``cache_dir`` as the persistent cache (on the CPU platform, plus
    ``env``); returns the telemetry ``counters`` at its end, plus the items of a dict ``extra`` if the script
    defines one."""
    tail = ("\nimport json as _json\nfrom torchtpu_lab import telemetry as _telemetry\n"
            f"print(_json.dumps({{**{{k: _telemetry.counters.get(k, 0) for k in {tuple(counters)!r}}}, "
            "**globals().get('extra', {})}))\n")
    env = dict(os.environ, TORCHTPU_LAB_CACHE_DIR=str(cache_dir), TORCHTPU_LAB_PLATFORM="cpu", **(env or {}))
    out = subprocess.run([sys.executable, "-c", textwrap.dedent(script) + tail], capture_output=True, text=True,
                         env=env, timeout=timeout)
    assert out.returncode == 0, out.stderr[-3000:]
    return json.loads(out.stdout.strip().splitlines()[-1])
