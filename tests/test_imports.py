"""paddletrain's imports: the graph has no cycle (issue 12), and every third-party one is declared (issue 17).

Every import that can run counts: at module top and inside functions (a function-level import only hides a
cycle until the function runs), relative or absolute; imports under ``if TYPE_CHECKING:`` never run and do not
count. Importing a submodule runs its parent packages' ``__init__`` first, so those are edges too, except a
module's own parent packages (already being initialised when it runs). Optional third-party dependencies
imported inside functions are outside the graph. In particular a registry module (``paddletrain.registry``,
``paddletrain.models._registry``, ``paddletrain.data.datasets``) cannot import a
module that registers into it: that module imports the registry, which would close a cycle.
"""
from __future__ import annotations

import ast
import configparser
import graphlib
import importlib.metadata
import re
import subprocess
import sys
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


def runtime_imports(tree: ast.AST, type_checking: bool = False) -> list[ast.Import | ast.ImportFrom]:
    """Every import statement of ``tree`` that can run (anywhere but the body of ``if TYPE_CHECKING:``, unless
    ``type_checking``: then those too)."""
    found: list[ast.Import | ast.ImportFrom] = []
    stack: list[ast.AST] = [tree]
    while stack:
        node = stack.pop()
        if isinstance(node, (ast.Import, ast.ImportFrom)):
            found.append(node)
        elif isinstance(node, ast.If) and _is_type_checking(node.test) and not type_checking:
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


def import_graph(root: Path, package: str, type_checking: bool = False) -> dict[str, set[str]]:
    """Module -> the package's modules that importing it runs directly (with ``type_checking``, also those it
    imports only for type checkers)."""
    files = module_files(root, package)
    known = set(files)
    graph: dict[str, set[str]] = {}
    for module, path in files.items():
        own_parents = {module.rsplit(".", depth)[0] for depth in range(1, module.count(".") + 1)}
        edges: set[str] = set()
        for node in runtime_imports(ast.parse(path.read_text(encoding="utf-8"), str(path)), type_checking):
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
    assert {"paddletrain.registry", "paddletrain.models.resnet", "paddletrain.data.formats.shapes"} <= set(graph)
    cycle = find_cycle(graph)
    assert cycle is None, f"import cycle: {' -> '.join(reversed(cycle))}"


def test_not_even_type_checkers_see_an_import_cycle():
    """A cycle of imports made only for type annotations is still two modules that need each other."""
    cycle = find_cycle(import_graph(ROOT, "paddletrain", type_checking=True))
    assert cycle is None, f"import cycle (type-only imports included): {' -> '.join(reversed(cycle))}"


# What job/ (processes, launch, ranks, restarts) may import: itself and the ground floor below every wing.
JOB_MAY_IMPORT = ("paddletrain.job", "paddletrain.errors", "paddletrain.config", "paddletrain.devices",
                  "paddletrain.console", "paddletrain.checkpoint")


def test_job_imports_nothing_from_the_wings_above_it():
    graph = import_graph(ROOT, "paddletrain", type_checking=True)
    above = {(module, target) for module, targets in graph.items() if module.startswith("paddletrain.job")
             for target in targets if not target.startswith(JOB_MAY_IMPORT) and target != "paddletrain"}
    assert not above, f"job/ imports from above it: {sorted(above)}"


def test_the_registries_are_below_what_registers_into_them():
    graph = import_graph(ROOT, "paddletrain")
    assert "paddletrain.models._registry" in graph["paddletrain.models.resnet"]
    assert "paddletrain.data.datasets" in graph["paddletrain.data.formats.shapes"]
    for registry in ("paddletrain.registry", "paddletrain.models._registry",
                     "paddletrain.data.datasets"):
        assert not graph[registry] & {"paddletrain.models.resnet", "paddletrain.models.vision",
                                      "paddletrain.models.pretrained", "paddletrain.data.formats.shapes",
                                      "paddletrain.data.formats.imagefolder", "paddletrain.optim", "paddletrain.losses",
                                      "paddletrain.data.transforms.augment", "paddletrain.validation"}, registry


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


# ---------------------------------------------------------------------------------------------------------------
# Every third-party import is declared (issue 17): a fresh venv with only the README's install runs the suite.

# Optional packages: module -> what brings it. Each must be imported behind a guard (inside a function, under
# try/except ImportError, or through pytest.importorskip), so that the code and the suite work without it.
OPTIONAL = {
    "paddle2onnx": "the onnx extra (pip install -e '.[onnx]')",
    "onnxruntime": "the onnx extra (pip install -e '.[onnx]')",
    "onnx": "the onnx extra (pip install -e '.[onnx]'; int8 ONNX export reads the graph with it)",
    "paddleclas": "pip install --no-deps paddleclas (.ci/run does, for the weight-conversion parity tests)",
    "paddlehub": "pip install paddlehub (PaddleHub weight sources)",
    "playwright": "pip install playwright (examples/visualdl_screenshots.py)",
    "optuna": "the search extra (pip install -e '.[search]')",
    "sqlalchemy": "the search extra (pip install -e '.[search]'; Optuna's database storage)",
    "psycopg": "the search extra (pip install -e '.[search]'; PostgreSQL storage)",
}
# Present in every environment `python -m venv` makes (ensurepip), so never declared.
WITH_EVERY_VENV = {"pip"}
SCANNED = ("paddletrain", "tests", "examples", "comparisons")
SKIPPED_DIRS = {"downstream_app", "build", "__pycache__"}  # the example app declares its own dependencies


def _normalise(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def readme_extras() -> set[str]:
    """The extras of the README's install command (``pip install -e ".[cpu,dev]"``)."""
    match = re.search(r'pip install -e "\.\[([\w,]+)\]"', (ROOT / "README.md").read_text(encoding="utf-8"))
    assert match, "README.md has no `pip install -e \".[extras]\"` command"
    return set(match.group(1).split(","))


def declared_distributions(extras: set[str]) -> set[str]:
    """setup.cfg's install_requires plus the requirements of ``extras``, as normalised distribution names."""
    parser = configparser.ConfigParser()
    parser.read(ROOT / "setup.cfg", encoding="utf-8")
    lines = parser.get("options", "install_requires").splitlines()
    for extra in extras:
        lines += parser.get("options.extras_require", extra).splitlines()
    names = (re.match(r"\s*([A-Za-z0-9][A-Za-z0-9_.-]*)", line) for line in lines if line.strip())
    return {_normalise(match.group(1)) for match in names if match}


def modules_of(distributions: set[str]) -> set[str]:
    """The top-level modules the installed ``distributions`` provide."""
    return {module for module, dists in importlib.metadata.packages_distributions().items()
            if any(_normalise(dist) in distributions for dist in dists)}


def _catches_import_error(handler: ast.ExceptHandler) -> bool:
    names = handler.type.elts if isinstance(handler.type, ast.Tuple) else [handler.type]
    return handler.type is None or any(isinstance(n, ast.Name) and n.id in {"ImportError", "ModuleNotFoundError",
                                                                            "Exception"} for n in names)


def third_party_imports(tree: ast.AST) -> list[tuple[str, int, bool]]:
    """(top-level module, line, guarded) for every absolute import of ``tree`` outside the standard library;
    guarded: inside a function or a ``try`` that catches ImportError."""
    found: list[tuple[str, int, bool]] = []
    stack: list[tuple[ast.AST, bool]] = [(tree, False)]
    while stack:
        node, guarded = stack.pop()
        if isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
            names = [node.module]
        else:
            names = []
        found += [(name.split(".")[0], node.lineno, guarded) for name in names
                  if name.split(".")[0] not in sys.stdlib_module_names | {"__future__"}]
        inner = guarded or isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) or (
            isinstance(node, ast.Try) and any(map(_catches_import_error, node.handlers)))
        stack += [(child, inner) for child in ast.iter_child_nodes(node)]
    return sorted(found, key=lambda item: item[1])


def undeclared_imports(files: list[Path], declared: set[str], project: set[str]) -> list[str]:
    """One line per import that is neither the standard library, ``project``, ``declared``, nor an
    :data:`OPTIONAL` module imported behind a guard."""
    problems = []
    for path in files:
        for module, line, guarded in third_party_imports(ast.parse(path.read_text(encoding="utf-8"), str(path))):
            where = f"{path.relative_to(ROOT) if path.is_relative_to(ROOT) else path}:{line}"
            if module in project | declared | WITH_EVERY_VENV:
                continue
            if module not in OPTIONAL:
                problems.append(f"{where}: `{module}` is not installed by the README's command; declare it in "
                                "setup.cfg or name it in OPTIONAL with the extra that brings it")
            elif not guarded:
                problems.append(f"{where}: optional `{module}` ({OPTIONAL[module]}) is imported unguarded; import "
                                "it inside a function, under try/except ImportError, or with pytest.importorskip")
    return problems


def scanned_files() -> list[Path]:
    return sorted(path for top in SCANNED for path in (ROOT / top).rglob("*.py")
                  if not SKIPPED_DIRS & set(path.relative_to(ROOT).parts))


def _project_modules() -> set[str]:
    """paddletrain, the tests, the maintainers' benchmarks, and the example scripts' own modules (they import each
    other from their folder)."""
    return {"paddletrain", "tests", "conftest", "comparisons"} | {p.stem for p in (ROOT / "examples").glob("*.py")}


def test_every_import_is_declared_by_the_readmes_install():
    declared = modules_of(declared_distributions(readme_extras()))
    assert {"paddle", "numpy", "hydra", "omegaconf", "PIL", "pytest"} <= declared, "setup.cfg lost its core"
    problems = undeclared_imports(scanned_files(), declared, _project_modules())
    assert not problems, "\n".join(problems)


def test_the_dependency_check_flags_an_undeclared_or_unguarded_import(tmp_path):
    source = tmp_path / "test_new.py"
    source.write_text("import numpy\nimport scipy.stats\nimport onnxruntime\n"
                      "try:\n    import paddle2onnx\nexcept ImportError:\n    paddle2onnx = None\n"
                      "def later():\n    import paddlehub\n")
    problems = undeclared_imports([source], {"numpy"}, set())
    assert len(problems) == 2, problems
    assert "test_new.py:2: `scipy` is not installed" in problems[0]
    assert "test_new.py:3: optional `onnxruntime`" in problems[1]


def test_ci_runs_the_readmes_commands_in_a_new_venv():
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    install, test = re.search(r"```bash\n(.+?)\n(.+?)\n```", readme).groups()
    ci = (ROOT / ".ci" / "run").read_text(encoding="utf-8")
    assert re.search(r"^python3? -m venv ", ci, re.MULTILINE), ".ci/run must make a new venv"
    assert install.split(" && ")[0] in ci.splitlines(), f".ci/run must install as the README says: {install}"
    assert test in ci.splitlines(), f".ci/run must run the README's test command: {test}"


# Module paths of earlier releases, which users may have written; each must keep importing for one release.
OLD_PATHS = {"paddletrain.trainer": "Trainer", "paddletrain.inference": "Predictor", "paddletrain.limits": "Limits",
             "paddletrain.precision": "Precision", "paddletrain.callbacks.base": "Callback",
             "paddletrain.metrics_multilabel": "MultiLabelMeter", "paddletrain.quantize": "quantize_paddle",
             "paddletrain.tta": "TestTimeAugmentation", "paddletrain.class_names": "read_names_file",
             # Release 0.2's: the data wing's sub-wings, and modules renamed so that each name has one meaning.
             "paddletrain.data.imagefolder": "ImageFolderDataset", "paddletrain.data.labellist": "LabelListDataset",
             "paddletrain.data.label_lists": "read_label_list", "paddletrain.data.index": "SampleIndex",
             "paddletrain.data.augment": "RandomErasing", "paddletrain.data.mixup": "Mixup",
             "paddletrain.data.sampler": "ResumableBatchSampler", "paddletrain.data.holdout": "hold_out_by_config",
             "paddletrain.data.loaders": "build_loader", "paddletrain.data.bundle": "build_data",
             "paddletrain.data.check": "check_dataset", "paddletrain.data.split": "split_folder",
             "paddletrain.deploy.export": "export_model", "paddletrain.deploy.predict": "predict_files",
             "paddletrain.deploy.ship": "ShipConfig", "paddletrain.bench.index": "run_index",
             "paddletrain.models.registry": "register_model",
             # After 0.2.0: the registering imports are part of the config's checks.
             "paddletrain.builtin_components": "validate_config"}


def test_the_old_import_paths_still_import_with_a_deprecation_warning():
    """One fresh interpreter tries them all: each warns once, naming the new path, and hands on the same object."""
    code = textwrap.dedent(f"""
        import importlib, warnings
        import paddletrain
        from paddletrain._moved import MOVED_MODULES
        for old, name in {OLD_PATHS!r}.items():
            with warnings.catch_warnings(record=True) as caught:
                warnings.simplefilter("always")
                moved = getattr(importlib.import_module(old), name)
            said = [str(w.message) for w in caught if w.category is DeprecationWarning and old in str(w.message)]
            same = moved is getattr(importlib.import_module(MOVED_MODULES[old]), name)
            print(old, "warned" if said and MOVED_MODULES[old] in said[0] else "silent", "same" if same else "other")
    """)
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=180, cwd=ROOT)
    assert result.returncode == 0, result.stderr[-2000:]
    assert result.stdout.split("\n")[:-1] == [f"{old} warned same" for old in OLD_PATHS]


@pytest.mark.parametrize(("old", "new", "name"), [
    ("paddletrain.export", "paddletrain.deploy.exporter", "export_model"),  # a command's library half
    ("paddletrain.build", "paddletrain.rebuild", "rebuild_checkpoint"),  # reading a run back, out of build
])
def test_a_name_that_moved_out_of_a_module_is_handed_on_from_its_old_place(old, new, name):
    code = textwrap.dedent(f"""
        import warnings
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            from {old} import {name}
        from {new} import {name} as moved
        assert {name} is moved
        print([str(w.message) for w in caught if w.category is DeprecationWarning])
    """)
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, cwd=ROOT)
    assert result.returncode == 0, result.stderr[-2000:]
    assert f"{old}.{name} moved to {new}.{name}" in result.stdout
