"""The package's stairs go one way: a lower layer never imports a higher one (not even inside a function), and
no two modules import each other, however indirectly (again counting imports inside functions).

Layers, bottom to top (a module may import its own layer and any lower one):
platform/telemetry/caches/config → device (the data model) → ops (lowerings) → runtime → backend (wiring with
PyTorch) → compile/kernels/distributed (new layers on the runtime's seams) → render → profile/metrics → jupyter
→ the package's entry points.

Every import of a ``torchtpu_lab`` name is resolved to the module that defines it (``from .. import
global_changes`` is an import of the package root, whose layer is the top), and an import the walker cannot rank
fails instead of being skipped. Imports by string (``__import__("torchtpu_lab...")``,
``importlib.import_module("...")`` with a literal) fail outright: they are how a dependency hides from this test.
A function-level import breaks no cycle at import time, but it is the same dependency: both count.
"""

from __future__ import annotations

import ast
import pathlib

import pytest

PKG = pathlib.Path(__file__).resolve().parent.parent / "torchtpu_lab"

LAYERS = [
    {"platform", "telemetry", "causes", "records", "caches", "dtypes", "units", "interrupts", "config", "native"},
    {"device"},
    {"ops"},
    {"runtime"},
    {"backend", "debug"},
    {"compile", "kernels", "distributed"},
    {"render"},
    {"profiling", "metrics"},
    {"jupyter"},
    {"__init__", "run_notebook", "labextension", "_rank_main"},
]
RANK = {name: i for i, names in enumerate(LAYERS) for name in names}
#: calls that import the module named by their first argument
_STRING_IMPORTS = {"__import__", "import_module"}


def _component(module: str) -> str:
    """``torchtpu_lab.runtime.fused`` -> ``runtime``; ``torchtpu_lab`` -> ``__init__``."""
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else "__init__"


def _module_name(path: pathlib.Path) -> str:
    rel = path.relative_to(PKG.parent).with_suffix("")
    parts = list(rel.parts)
    if parts[-1] == "__init__":
        parts = parts[:-1]
    return ".".join(parts)


def _modules() -> list[pathlib.Path]:
    return sorted(p for p in PKG.rglob("*.py") if "labextension" not in p.parts)


MODULES = {_module_name(p) for p in _modules()}


def _resolve(target: str, name: str | None = None) -> str:
    """The module ``from target import name`` (or ``import target``) runs: ``target.name`` when that is a
    module, else ``target`` itself (``name`` is an attribute of it)."""
    if name is not None and f"{target}.{name}" in MODULES:
        return f"{target}.{name}"
    return target


def _string_import(node: ast.AST) -> str | None:
    """The literal module name of ``__import__("m")`` / ``importlib.import_module("m")``, else None."""
    if not isinstance(node, ast.Call) or not node.args:
        return None
    func = node.func
    name = func.id if isinstance(func, ast.Name) else func.attr if isinstance(func, ast.Attribute) else None
    arg = node.args[0]
    if name in _STRING_IMPORTS and isinstance(arg, ast.Constant) and isinstance(arg.value, str):
        return arg.value
    return None


def _imports(path: pathlib.Path, source: str | None = None) -> tuple[list[tuple[int, str]], list[tuple[int, str]]]:
    """``(imports, string_imports)``: every ``torchtpu_lab`` module imported anywhere in ``path`` (module level
    or in a function; relative imports resolved to the module they run), and every ``torchtpu_lab`` module
    imported by a string literal (relative names included)."""
    tree = ast.parse(path.read_text() if source is None else source, str(path))
    here = _module_name(path)
    package = here if path.name == "__init__.py" else here.rpartition(".")[0]
    found, strings = [], []
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
            found += sorted({(node.lineno, _resolve(target, a.name)) for a in node.names})
        elif (literal := _string_import(node)) is not None:
            if literal.split(".")[0] == "torchtpu_lab" or literal.startswith("."):
                strings.append((node.lineno, literal))
    return found, strings


def _violations(path: pathlib.Path, source: str | None = None) -> list[str]:
    """What breaks the layer rule in ``path``: an upward import, an import of something the walker cannot
    rank (not a module of the package, or a component missing from :data:`LAYERS`), or a string import."""
    mine = _component(_module_name(path))
    found, strings = _imports(path, source)
    bad = [f"line {n}: imports {s!r} by a string; use an import statement (the layer and cycle tests read those)"
           for n, s in strings]
    for lineno, target in found:
        theirs = _component(target)
        if target not in MODULES or theirs not in RANK:
            bad.append(f"line {lineno}: imports {target}, which this test cannot rank (no such module, or "
                       f"{theirs!r} is missing from LAYERS in {__file__})")
        elif RANK[theirs] > RANK[mine]:
            bad.append(f"line {lineno}: {mine} (layer {RANK[mine]}) imports {target} (layer {RANK[theirs]})")
    return bad


def _import_graph(sources: dict[pathlib.Path, str | None]) -> dict[str, set[str]]:
    """module -> the package's modules it imports (module level, in functions and by string alike)."""
    graph = {}
    for path, source in sources.items():
        found, strings = _imports(path, source)
        here = _module_name(path)
        package = here if path.name == "__init__.py" else here.rpartition(".")[0]
        named = [s if not s.startswith(".") else f"{package}{s}" for _, s in strings]
        graph[here] = {t for _, t in found} | {s for s in named if s in MODULES}
        graph[here].discard(here)
    return graph


def _cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan's algorithm, iteratively)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found = []
    for root in sorted(graph):
        if root in index:
            continue
        work = [(root, iter(sorted(graph.get(root, ()))))]
        index[root] = low[root] = len(index)
        stack.append(root)
        on_stack.add(root)
        while work:
            v, edges = work[-1]
            w = next(edges, None)
            if w is not None:
                if w not in index:
                    index[w] = low[w] = len(index)
                    stack.append(w)
                    on_stack.add(w)
                    work.append((w, iter(sorted(graph.get(w, ())))))
                elif w in on_stack:
                    low[v] = min(low[v], index[w])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[v])
            if low[v] == index[v]:
                component = []
                while True:
                    w = stack.pop()
                    on_stack.discard(w)
                    component.append(w)
                    if w == v:
                        break
                if len(component) > 1:
                    found.append(sorted(component))
    return found


def test_every_component_has_a_layer():
    unknown = {_component(_module_name(p)) for p in _modules()} - set(RANK)
    assert not unknown, f"add these to LAYERS in {__file__}: {sorted(unknown)}"


@pytest.mark.parametrize("path", _modules(), ids=lambda p: str(p.relative_to(PKG)))
def test_no_upward_imports(path):
    bad = _violations(path)
    assert not bad, "\n".join(bad)


def test_no_import_cycles():
    cycles = _cycles(_import_graph({p: None for p in _modules()}))
    assert not cycles, "modules that import each other (at module level or in a function): " + "; ".join(
        " <-> ".join(c) for c in cycles)


def test_the_check_catches_an_upward_import():
    """The walker sees function-level relative imports (the kind that made the old device<->runtime cycle)."""
    probe = PKG / "device" / "_layer_probe.py"
    found, _ = _imports(probe, "def f():\n    from ..runtime import fused\n    from . import views\n")
    assert [t for _, t in found] == ["torchtpu_lab.runtime.fused", "torchtpu_lab.device.views"]
    assert RANK[_component(found[0][1])] > RANK[_component(_module_name(probe))]
    assert len(_violations(probe, "def f():\n    from ..runtime import fused\n")) == 1


def test_the_check_fails_the_old_jupyter_session():
    """What ``jupyter/session.py`` once did, both now refused: ``from .. import global_changes`` (an attribute
    of the package root, the top layer, which the walker used to file under an unranked "global_changes" and
    skip) and ``__import__("torchtpu_lab.jupyter.comm")`` (a dependency no import statement shows)."""
    old = ("def load_ipython_extension(ip):\n"
           "    __import__('torchtpu_lab.jupyter.comm', fromlist=['setup']).setup(ip)\n"
           "    from .. import global_changes\n")
    bad = _violations(PKG / "jupyter" / "session.py", old)
    assert len(bad) == 2, bad
    assert "by a string" in bad[0] and "jupyter (layer 8) imports torchtpu_lab (layer 9)" in bad[1]


def test_the_check_fails_an_unranked_target_and_importlib():
    probe = PKG / "runtime" / "_layer_probe.py"
    source = ("import importlib\n"
              "from ..nowhere import thing\n"
              "def f():\n    return importlib.import_module('.fused', 'torchtpu_lab.runtime')\n")
    bad = _violations(probe, source)
    assert len(bad) == 2, bad
    assert "'.fused' by a string" in bad[0] and "torchtpu_lab.nowhere, which this test cannot rank" in bad[1]


def test_the_cycle_check_sees_a_cycle_through_a_function_import():
    """The old ``backend/streams.py`` imported ``tpu_module`` inside ``Stream.synchronize`` while
    ``tpu_module`` imports ``streams`` at module level: a cycle that no import-time error shows."""
    sources = {p: None for p in _modules()}
    streams = PKG / "backend" / "streams.py"
    sources[streams] = "class Stream:\n    def synchronize(self):\n        from . import tpu_module\n"
    assert ["torchtpu_lab.backend.streams", "torchtpu_lab.backend.tpu_module"] in _cycles(_import_graph(sources))
    assert _cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]
    assert _cycles({"a": {"b"}, "b": set()}) == []
