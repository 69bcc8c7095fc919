"""The package's stairs go one way: a lower layer never imports a higher one (not even inside a function).

Layers, bottom to top (a module may import its own layer and any lower one):
platform/telemetry/caches → device (the data model) → ops (lowerings) → runtime → backend (wiring with
PyTorch) → compile/kernels/distributed (new layers on the runtime's seams) → render → profile/metrics → jupyter
→ the package's entry points.
"""

from __future__ import annotations

import ast
import pathlib

import pytest

PKG = pathlib.Path(__file__).resolve().parent.parent / "torchtpu_lab"

LAYERS = [
    {"platform", "telemetry", "caches", "dtypes", "units", "interrupts", "native"},
    {"device"},
    {"ops"},
    {"runtime"},
    {"backend", "debug"},
    {"compile", "kernels", "distributed"},
    {"render"},
    {"profile", "metrics"},
    {"jupyter"},
    {"__init__", "run_notebook", "labextension", "_rank_main"},
]
RANK = {name: i for i, names in enumerate(LAYERS) for name in names}


def _component(module: str) -> str:
    """``torchtpu_lab.runtime.lazy`` -> ``runtime``; ``torchtpu_lab`` -> ``__init__``."""
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else "__init__"


def _module_name(path: pathlib.Path) -> str:
    rel = path.relative_to(PKG.parent).with_suffix("")
    parts = list(rel.parts)
    if parts[-1] == "__init__":
        parts = parts[:-1]
    return ".".join(parts)


def _imports(path: pathlib.Path, source: str | None = None) -> list[tuple[int, str]]:
    """Every ``torchtpu_lab`` module imported anywhere in ``path`` (relative imports resolved)."""
    tree = ast.parse(path.read_text() if source is None else source, str(path))
    here = _module_name(path)
    package = here if path.name == "__init__.py" else here.rpartition(".")[0]
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found += [(node.lineno, a.name) for a in node.names if a.name.split(".")[0] == "torchtpu_lab"]
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")
                base = base[: len(base) - (node.level - 1)]
                target = ".".join(base + ([node.module] if node.module else []))
            else:
                target = node.module or ""
            if target.split(".")[0] != "torchtpu_lab":
                continue
            if node.module is None or target.count(".") == 0:  # "from . import x" / "from .. import x"
                found += [(node.lineno, f"{target}.{a.name}") for a in node.names]
            else:
                found.append((node.lineno, target))
    return found


def _modules():
    return sorted(p for p in PKG.rglob("*.py") if "labextension" not in p.parts)


def test_every_component_has_a_layer():
    unknown = {_component(_module_name(p)) for p in _modules()} - set(RANK)
    assert not unknown, f"add these to LAYERS in {__file__}: {sorted(unknown)}"


@pytest.mark.parametrize("path", _modules(), ids=lambda p: str(p.relative_to(PKG)))
def test_no_upward_imports(path):
    mine = _component(_module_name(path))
    bad = []
    for lineno, target in _imports(path):
        theirs = _component(target)
        if theirs in RANK and RANK[theirs] > RANK[mine]:
            bad.append(f"line {lineno}: {mine} (layer {RANK[mine]}) imports {target} (layer {RANK[theirs]})")
    assert not bad, "\n".join(bad)


def test_the_check_catches_an_upward_import():
    """The walker sees function-level relative imports (the kind that made the old device<->runtime cycle)."""
    probe = PKG / "device" / "_layer_probe.py"
    found = _imports(probe, "def f():\n    from ..runtime import lazy\n    from . import views\n")
    assert [t for _, t in found] == ["torchtpu_lab.runtime", "torchtpu_lab.device.views"]
    assert RANK[_component(found[0][1])] > RANK[_component(_module_name(probe))]
