"""Choose the CI conformance subset from a full run: the fewest passing op_db entries that execute every
lowering in the op table at least once (greedy set cover), plus one entry per OpInfo family prefix.

    python bench/conformance.py --json full.json && python bench/make_subset.py full.json > tests/conformance_subset.txt
"""

from __future__ import annotations

import json
import os
import sys

import torch

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))


def main(path: str) -> None:
    from torchtpu_lab.ops import LOWERINGS

    rows = json.load(open(path))
    passing = [r for r in rows if all(v[0] for k, v in r.items() if isinstance(v, list) and len(v) == 2
                                      and isinstance(v[0], bool)) and not r.get("fallback_ops")]
    wanted = {str(op) for op in LOWERINGS}
    covers = {r["entry"]: set(r.get("lowered_ops", [])) & wanted for r in passing}
    chosen: list[str] = []
    left = set().union(*covers.values()) if covers else set()
    while left:
        best = max(covers, key=lambda e: (len(covers[e] & left), -len(e)))
        gain = covers[best] & left
        if not gain:
            break
        chosen.append(best)
        left -= gain
    families = {}
    for r in passing:
        families.setdefault(r["entry"].split(".")[0] if "." in r["entry"] else "(top)", r["entry"])
    uncovered = sorted(wanted - set().union(*covers.values()))
    print("# CI conformance subset: every lowering executed at least once (bench/make_subset.py).")
    print(f"# made with torch {torch.__version__.split('+')[0]}")
    print(f"# {len(uncovered)} lowered ops no passing op_db entry reaches (tested elsewhere or by the full run):")
    for name in uncovered:
        print(f"#   {name}")
    for entry in sorted(set(chosen) | set(families.values())):
        print(entry)


if __name__ == "__main__":
    main(sys.argv[1])
