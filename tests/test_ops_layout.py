"""The op table stays split: small files, and lowerings kept apart from torch-level kernels in ``ops/nn``.

Lowerings (``@lower``) are pure JAX functions; torch-level kernels (``@kernel``) receive tpu tensors and call torch
ops. In ``ops/nn`` the latter live only in modules named ``*kernels*``, which hold no lowerings.
"""

import ast
import pathlib

import pytest

import torchtpu_lab.ops

OPS = pathlib.Path(torchtpu_lab.ops.__file__).parent
NN = OPS / "nn"
MAX_LINES = 650


def _registrations(path: pathlib.Path) -> set[str]:
    """Which of ``lower``/``kernel`` the module calls (as a decorator, ``lower(op)(fn)`` or ``registry.lower``)."""
    found = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Call):
            f = node.func
            name = f.id if isinstance(f, ast.Name) else f.attr if isinstance(f, ast.Attribute) else None
            if name in ("lower", "kernel"):
                found.add(name)
    return found


def test_layout_is_seen():
    assert NN.is_dir() and (NN / "__init__.py").exists()
    assert any("kernels" in p.stem for p in NN.glob("*.py"))


@pytest.mark.parametrize("path", sorted(OPS.rglob("*.py")), ids=lambda p: str(p.relative_to(OPS)))
def test_no_ops_file_is_too_long(path):
    n = len(path.read_text().splitlines())
    assert n <= MAX_LINES, f"{path.relative_to(OPS)} has {n} lines (at most {MAX_LINES}): split it by op family"


@pytest.mark.parametrize("path", sorted(NN.glob("*.py")), ids=lambda p: p.name)
def test_nn_lowerings_and_torch_kernels_are_apart(path):
    calls = _registrations(path)
    if "kernels" in path.stem:
        assert "lower" not in calls, f"{path.name} is a torch-level kernel module but registers a lowering"
    else:
        assert "kernel" not in calls, f"{path.name} holds lowerings but registers a torch-level kernel: move it to a " \
                                      "*kernels* module"


def test_registration_check_sees_both_kinds(tmp_path):
    bad = tmp_path / "m.py"
    bad.write_text("@lower(aten.relu)\ndef f(x): ...\n\nlower(aten.gelu)(f)\n\n@registry.kernel(aten.x.default)\ndef g(x): ...\n")
    assert _registrations(bad) == {"lower", "kernel"}
