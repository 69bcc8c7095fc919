"""Execute a notebook headlessly and print what it showed: ``python -m torchtpu_lab.run_notebook NB.ipynb``.

This is what ``HEADLESS=1 make lab`` runs on the quickstart: every cell's text output is printed in order, and
the last ``%%tpu_profile`` summary is printed at the end. The notebook file itself is not modified.
"""

from __future__ import annotations

import argparse
import sys
import time


def execute(path: str, timeout: int = 600):
    import nbformat
    from nbclient import NotebookClient

    nb = nbformat.read(path, as_version=4)
    client = NotebookClient(nb, timeout=timeout, kernel_name="python3", resources={"metadata": {"path": "."}})
    client.execute()
    return nb


def text_outputs(cell, mime: str = "text/plain") -> list[str]:
    """A cell's outputs as text: streams, the ``mime`` part of rich outputs, and errors."""
    out = []
    for o in cell.get("outputs", []):
        if o.get("output_type") == "stream":
            out.append(o.get("text", ""))
        elif mime in o.get("data", {}):
            out.append(o["data"][mime])
        elif o.get("output_type") == "error":
            out.append(f"{o.get('ename')}: {o.get('evalue')}")
    return out


def cell_text(cell, mime: str = "text/plain") -> str:
    return "\n".join(text_outputs(cell, mime))


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("notebook")
    p.add_argument("--timeout", type=int, default=600, help="per-cell timeout in seconds")
    args = p.parse_args(argv)
    t0 = time.perf_counter()
    nb = execute(args.notebook, args.timeout)
    profile = None
    for i, cell in enumerate(nb.cells):
        if cell.cell_type != "code":
            continue
        texts = text_outputs(cell)
        if texts:
            print(f"--- cell {i} ---")
            print("\n".join(t.rstrip() for t in texts))
        if cell.source.startswith("%%tpu_profile"):
            profile = "\n".join(texts)
    print(f"\n=== executed {args.notebook} in {time.perf_counter() - t0:.1f}s ===")
    if profile:
        print("last %%tpu_profile report:\n" + profile)
    return 0


if __name__ == "__main__":
    sys.exit(main())
