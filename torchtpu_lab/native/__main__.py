"""``python -m torchtpu_lab.native``: build the native core now (``make install`` runs it), print where and how long."""

import time

from .build import build

t0 = time.perf_counter()
path = build(verbose=True)
print(f"{path} ({time.perf_counter() - t0:.1f} s)")
