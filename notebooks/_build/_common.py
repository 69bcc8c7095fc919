"""Shared pieces of the notebook generators: every tutorial opens with its Colab badge and the same
install-only-if-missing cell as 01_quickstart, and is written without outputs (tests/test_notebooks.py).

Run a generator from the repository root (``python notebooks/_build/make_03_recompilations.py``) or all of
them with ``python notebooks/_build/make_all.py``.
"""

import os

import nbformat as nbf

NOTEBOOKS = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

md, code = nbf.v4.new_markdown_cell, nbf.v4.new_code_cell

# Identical to the second cell of 01_quickstart (make_01_quickstart.py).
INSTALL = """# Install only when the package is missing (Colab); locally `make lab` has installed it already.
import importlib.util, subprocess, sys
if importlib.util.find_spec("torchtpu_lab") is None:
    subprocess.check_call([sys.executable, "-m", "pip", "install", "-q",
                           "torchtpu-lab"])"""


def badge(filename: str) -> str:
    return ("[![Open In Colab](https://colab.research.google.com/assets/colab-badge.svg)]"
            f"(https://colab.research.google.com/github/torchtpu-lab/torchtpu-lab/blob/main/notebooks/{filename})")


def write(filename: str, cells: list) -> str:
    """Write ``notebooks/<filename>`` with stable cell ids, so regenerating an unchanged notebook is a no-op."""
    nb = nbf.v4.new_notebook()
    stem = filename.split("_")[0]
    for i, cell in enumerate(cells):
        cell["id"] = f"nb{stem}-{i:02d}"
    nb.cells = cells
    nb.metadata["kernelspec"] = {"name": "python3", "display_name": "Python 3", "language": "python"}
    nb.metadata["language_info"] = {"name": "python"}
    path = os.path.join(NOTEBOOKS, filename)
    nbf.write(nb, path)
    return path
