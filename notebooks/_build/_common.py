"""Shared pieces of the notebook generators: every tutorial opens with its Colab badge and the same
install-only-if-missing cell as 01_quickstart, and is written without outputs (tests/test_notebooks.py).

Run a generator from the repository root (``python notebooks/_build/make_03_recompilations.py``) or all of
them with ``python notebooks/_build/make_all.py``.
"""

import os

import nbformat as nbf

NOTEBOOKS = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

md, code = nbf.v4.new_markdown_cell, nbf.v4.new_code_cell

#: The repository the Colab badges point to (``badge``); the install cell installs from it (nothing is on PyPI).
REPO = "torchtpu-lab/torchtpu-lab"

# The second cell of every tutorial. On Colab the package is missing: it installs from the repository the badge
# points to, adds jax[tpu] on a TPU runtime, and pins the torch that is already installed (a constraints file),
# so pip never swaps Colab's torch for another build. tests/test_tutorials.py runs it in a simulated Colab.
INSTALL_TEMPLATE = """# Install only when the package is missing (Colab); locally `make lab` has installed it already.
# From the repository the Colab badge points to; jax[tpu] on a TPU runtime; the torch already here is pinned.
import importlib.util, os, subprocess, sys, tempfile
EXTRAS = {extras}
if importlib.util.find_spec("torchtpu_lab") is None:
    if os.environ.get("COLAB_TPU_ADDR") or os.environ.get("TPU_ACCELERATOR_TYPE"):
        EXTRAS = EXTRAS + ["tpu"]
    spec = "torchtpu-lab" + ("[" + ",".join(EXTRAS) + "]" if EXTRAS else "")
    url = "git+https://github.com/{repo}@main"
    cmd = [sys.executable, "-m", "pip", "install", "-q", spec + " @ " + url]
    if importlib.util.find_spec("torch") is not None:
        from importlib.metadata import version
        pin = os.path.join(tempfile.gettempdir(), "torchtpu_lab_torch_pin.txt")
        with open(pin, "w") as f:
            f.write("torch==" + version("torch") + "\\n")
        cmd += ["-c", pin]
    subprocess.check_call(cmd)"""


def install_cell(extras: tuple = ()) -> str:
    """The install cell; ``extras``: optional dependencies the notebook needs (``("hf",)`` for notebook 09)."""
    return INSTALL_TEMPLATE.format(extras=repr(list(extras)), repo=REPO)


INSTALL = install_cell()


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
