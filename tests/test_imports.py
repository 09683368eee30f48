"""paddletrain's import graph has no cycle (issue 12).

Every import that can run counts: at module top and inside functions (a function-level import only hides a
cycle until the function runs), relative or absolute; imports under ``if TYPE_CHECKING:`` never run and do not
count. Importing a submodule runs its parent packages' ``__init__`` first, so those are edges too, except a
module's own parent packages (already being initialised when it runs). Optional third-party dependencies
imported inside functions are outside the graph. In particular a registry module (``paddletrain.registry``,
``paddletrain.registries``, ``paddletrain.models.registry``, ``paddletrain.data.datasets``) cannot import a
module that registers into it: that module imports the registry, which would close a cycle.
"""
from __future__ import annotations

import ast
import graphlib
import textwrap
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def module_files(root: Path, package: str) -> dict[str, Path]:
    """Dotted module name -> file, for every module of ``root/package``."""
    modules = {}
    for path in sorted((root / package).rglob("*.py")):
        parts = path.relative_to(root).with_suffix("").parts
        modules[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = path
    return modules


def _is_type_checking(test: ast.expr) -> bool:
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING")


def runtime_imports(tree: ast.AST) -> list[ast.Import | ast.ImportFrom]:
    """Every import statement of ``tree`` that can run (anywhere but the body of ``if TYPE_CHECKING:``)."""
    found: list[ast.Import | ast.ImportFrom] = []
    stack: list[ast.AST] = [tree]
    while stack:
        node = stack.pop()
        if isinstance(node, (ast.Import, ast.ImportFrom)):
            found.append(node)
        elif isinstance(node, ast.If) and _is_type_checking(node.test):
            stack.extend(node.orelse)
        else:
            stack.extend(ast.iter_child_nodes(node))
    return found


def _targets(module: str, is_package: bool, node: ast.Import | ast.ImportFrom, known: set[str]) -> set[str]:
    """The modules an import statement names: ``from pkg import sub`` names ``pkg.sub`` when that is a module."""
    if isinstance(node, ast.Import):
        return {alias.name for alias in node.names}
    base = node.module or ""
    if node.level:
        package = module if is_package else module.rpartition(".")[0]
        for _ in range(node.level - 1):
            package = package.rpartition(".")[0]
        base = f"{package}.{node.module}" if node.module else package
    submodules = {f"{base}.{alias.name}" for alias in node.names} & known
    named = {alias.name for alias in node.names if f"{base}.{alias.name}" not in known}
    return submodules | ({base} if named or not submodules else set())


def import_graph(root: Path, package: str) -> dict[str, set[str]]:
    """Module -> the package's modules that importing it runs directly."""
    files = module_files(root, package)
    known = set(files)
    graph: dict[str, set[str]] = {}
    for module, path in files.items():
        own_parents = {module.rsplit(".", depth)[0] for depth in range(1, module.count(".") + 1)}
        edges: set[str] = set()
        for node in runtime_imports(ast.parse(path.read_text(encoding="utf-8"), str(path))):
            for target in _targets(module, path.name == "__init__.py", node, known):
                if target in known and target != module:
                    edges.add(target)
                parts = target.split(".")
                parents = {".".join(parts[:i]) for i in range(1, len(parts))}
                edges |= (parents & known) - own_parents - {module}
        graph[module] = edges
    return graph


def find_cycle(graph: dict[str, set[str]]) -> list[str] | None:
    try:
        graphlib.TopologicalSorter(graph).prepare()
    except graphlib.CycleError as exc:
        return list(exc.args[1])
    return None


def test_paddletrain_has_no_import_cycle():
    graph = import_graph(ROOT, "paddletrain")
    assert {"paddletrain.registry", "paddletrain.models.resnet", "paddletrain.data.shapes"} <= set(graph)
    cycle = find_cycle(graph)
    assert cycle is None, f"import cycle: {' -> '.join(reversed(cycle))}"


def test_the_registries_are_below_what_registers_into_them():
    graph = import_graph(ROOT, "paddletrain")
    assert "paddletrain.models.registry" in graph["paddletrain.models.resnet"]
    assert "paddletrain.data.datasets" in graph["paddletrain.data.shapes"]
    for registry in ("paddletrain.registry", "paddletrain.registries", "paddletrain.models.registry",
                     "paddletrain.data.datasets"):
        assert not graph[registry] & {"paddletrain.models.resnet", "paddletrain.models.vision",
                                      "paddletrain.models.pretrained", "paddletrain.data.shapes",
                                      "paddletrain.data.imagefolder", "paddletrain.optim", "paddletrain.losses",
                                      "paddletrain.data.augment", "paddletrain.builtins"}, registry


def _write(root: Path, files: dict[str, str]) -> None:
    for name, text in files.items():
        path = root / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(textwrap.dedent(text))


@pytest.mark.parametrize("hidden", [
    "def late():\n    from pkg import a\n",          # function-level, absolute
    "def late():\n    from . import a\n",            # function-level, relative
    "import pkg.sub.c\n",                            # through a parent package's __init__
])
def test_the_check_sees_cycles_hidden_in_functions_relative_imports_and_packages(tmp_path, hidden):
    _write(tmp_path, {"pkg/__init__.py": "", "pkg/a.py": "from .b import thing\n", "pkg/b.py": "thing = 1\n" + hidden,
                      "pkg/sub/__init__.py": "from pkg import a\n", "pkg/sub/c.py": ""})
    cycle = find_cycle(import_graph(tmp_path, "pkg"))
    assert cycle is not None and "pkg.a" in cycle and "pkg.b" in cycle


def test_type_checking_imports_and_a_childs_own_parents_are_not_cycles(tmp_path):
    _write(tmp_path, {"pkg/__init__.py": "from pkg import a\n",
                      "pkg/a.py": "from typing import TYPE_CHECKING\nfrom pkg.b import x\nif TYPE_CHECKING:\n"
                                  "    from pkg.c import C\n",
                      "pkg/b.py": "x = 1\n", "pkg/c.py": "from pkg.a import x\n"})
    graph = import_graph(tmp_path, "pkg")
    assert graph["pkg.a"] == {"pkg.b"} and find_cycle(graph) is None
