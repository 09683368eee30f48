"""Plugins end to end: a downstream package's model and dataset reach every command line.

(a) ``examples/downstream_app`` installed with pip into a fresh venv registers "tiny_resnet" and "bars" through
its ``paddletrain.plugins`` entry point: fit, then evaluate and export of that run's checkpoint, all find them.
(b) ``imports=[module]`` does the same without any install, and evaluate/export take it from the checkpoint.
(c) unknown names and unimportable modules stay one-line errors.
"""
from __future__ import annotations

import importlib.util
import json
import os
import shutil
import site
import subprocess
import sys
import textwrap
import venv
from importlib.metadata import entry_points
from pathlib import Path

import pytest
from omegaconf import OmegaConf

from paddletrain import registry as registry_module
from paddletrain.checkpoint import Checkpoint
from paddletrain.errors import ConfigError, ExitCode
from paddletrain.plugins import PLUGIN_GROUP, PluginError, prepare
from paddletrain.validation import validate_config
from tests.conftest import TINY, command_code, compose_fit

ROOT = Path(__file__).resolve().parents[1]
EXAMPLE = ROOT / "examples" / "downstream_app"


def run_cli(python: str, module: str, args: list[str], cwd: Path, pythonpath: list[Path] = (),
            timeout: float = 300) -> subprocess.CompletedProcess:
    """``python -m module args`` in a fresh process whose paddletrain is this checkout's."""
    path = [str(ROOT), *map(str, pythonpath), os.environ.get("PYTHONPATH", "")]
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(p for p in path if p), PYTHONWARNINGS="ignore",
               HYDRA_FULL_ERROR="0")
    return subprocess.run([python, "-m", module, *args], cwd=cwd, env=env, capture_output=True, text=True,
                          timeout=timeout)


def ok(result: subprocess.CompletedProcess) -> subprocess.CompletedProcess:
    assert result.returncode == 0, (result.stdout + result.stderr)[-3000:]
    return result


def last_json(result: subprocess.CompletedProcess) -> dict:
    return json.loads(result.stdout.strip().splitlines()[-1])


def the_checkpoint(run_dir: Path) -> Path:
    (checkpoint,) = [p for p in (run_dir / "checkpoints").iterdir() if p.is_dir()]
    return checkpoint


def fit_evaluate_export(python: str, tmp_path: Path, fit_args: list[str], pythonpath: list[Path] = (),
                        later_args: list[str] = ()) -> None:
    """Train one short epoch, then evaluate and export its checkpoint (``later_args`` added to both)."""
    run_dir, out_dir = tmp_path / "run", tmp_path / "export"
    ok(run_cli(python, "paddletrain.fit", [*TINY, "trainer.limit_train_batches=2", *fit_args,
                                           f"hydra.run.dir={run_dir}"], tmp_path, pythonpath))
    trained = json.loads((run_dir / "summary.json").read_text())
    checkpoint = the_checkpoint(run_dir)
    evaluated = last_json(ok(run_cli(python, "paddletrain.evaluate", [f"checkpoint={checkpoint}", *later_args,
                                                                      f"hydra.run.dir={tmp_path / 'eval'}"],
                                     tmp_path, pythonpath)))
    # the same weights on the same validation images: at most one image may round the other way
    assert abs(evaluated["val/top1"] - trained["val/top1"]) <= 1 / 32 + 1e-9
    exported = last_json(ok(run_cli(python, "paddletrain.export", [f"checkpoint={checkpoint}", f"out_dir={out_dir}",
                                                                   "cpu_threads=1", *later_args],
                                    tmp_path, pythonpath)))
    assert exported["parity"]["passed"] and (out_dir / "model.pdiparams").is_file()


def _can_build_wheels_offline() -> bool:
    """setuptools builds wheels by itself from 70.1 on; before that it needs the ``wheel`` package."""
    try:
        import setuptools
    except ImportError:
        return False
    version = tuple(int(part) for part in setuptools.__version__.split(".")[:2] if part.isdigit())
    return version >= (70, 1) or importlib.util.find_spec("wheel") is not None


@pytest.fixture(scope="module")
def plugin_venv(tmp_path_factory) -> str:
    """The python of a venv that sees this interpreter's packages (paddle, hydra, ...) plus the example app,
    installed by pip from its pyproject.toml as a user would."""
    import pip

    if tuple(int(p) for p in pip.__version__.split(".")[:2]) < (22, 3):
        pytest.skip(f"pip {pip.__version__} cannot install into another environment (pip --python needs 22.3)")
    home = tmp_path_factory.mktemp("plugin-venv")
    venv.create(home, with_pip=False)  # pip below installs into it with --python
    python = str(home / "bin" / "python")
    # system_site_packages=True would show the *base* interpreter's packages, not those of the venv the suite runs
    # in; a .pth line that adds this interpreter's site directories (their own .pth files included) shows these.
    site_dirs = [*site.getsitepackages(), *([site.getusersitepackages()] if site.ENABLE_USER_SITE else [])]
    new_site = subprocess.run([python, "-c", "import sysconfig; print(sysconfig.get_path('purelib'))"],
                              capture_output=True, text=True, check=True).stdout.strip()
    Path(new_site, "suite_site_packages.pth").write_text(
        "".join(f"import site; site.addsitedir({d!r})\n" for d in site_dirs))
    # Without build isolation when this interpreter can build the wheel offline; otherwise pip fetches
    # setuptools for the build from the configured index.
    isolation = ["--no-build-isolation"] if _can_build_wheels_offline() else []
    source = home / "downstream_app"  # a copy: setuptools builds in the source tree (build/, *.egg-info)
    shutil.copytree(EXAMPLE, source, ignore=shutil.ignore_patterns("build", "*.egg-info", "__pycache__"))
    ok(subprocess.run([sys.executable, "-m", "pip", "--python", python, "install", "--no-deps", "--quiet",
                       *isolation, str(source)], capture_output=True, text=True, timeout=300))
    return python


def test_the_docs_show_the_examples_real_pyproject():
    docs = (ROOT / "docs" / "extending.md").read_text()
    snippet = docs.split("```toml\n", 1)[1].split("```", 1)[0]
    assert snippet == (EXAMPLE / "pyproject.toml").read_text()


@pytest.mark.slow  # 21 s in a fresh venv; the imports= path is tested here by default
def test_the_installed_example_app_serves_fit_evaluate_and_export(plugin_venv, tmp_path):
    # cwd and PYTHONPATH hold no copy of the app: only the installed package's entry point can find it; the
    # dataset's own option (bar_width, a keyword of its builder) comes from the command line like any key
    fit_evaluate_export(plugin_venv, tmp_path, ["model.name=tiny_resnet", "data.name=bars", "data.bar_width=5"])
    saved = OmegaConf.load(tmp_path / "run" / ".hydra" / "config.yaml")
    assert saved.data.bar_width == 5
    misspelt = run_cli(plugin_venv, "paddletrain.fit", [*TINY, "model.name=tiny_resnet", "data.name=bars",
                                                         "data.bar_widht=5", f"hydra.run.dir={tmp_path / 'typo'}"],
                       tmp_path)
    output = misspelt.stdout + misspelt.stderr
    assert misspelt.returncode == ExitCode.USER_ERROR and "Traceback" not in output
    assert "unknown config key data.bar_widht" in output and "data.name=bars" in output and "bar_width" in output
    if any(entry.value == "downstream_app" for entry in entry_points(group=PLUGIN_GROUP)):
        return  # installed here too (someone tried the example): no interpreter at hand lacks it
    # the same evaluation without the plugin installed: one line naming the key, no traceback
    result = run_cli(sys.executable, "paddletrain.evaluate", [f"checkpoint={the_checkpoint(tmp_path / 'run')}",
                                                              f"hydra.run.dir={tmp_path / 'eval2'}"], tmp_path)
    output = result.stdout + result.stderr
    assert result.returncode == ExitCode.USER_ERROR and "Traceback" not in output
    assert "unknown dataset data.name='bars'" in output and "paddletrain plugin" in output


PLUGIN_MODULE = """
    import paddle
    from paddletrain.models import register_model


    @register_model
    def imported_net(num_classes: int = 10, in_chans: int = 3) -> paddle.nn.Layer:
        nn = paddle.nn
        return nn.Sequential(nn.Conv2D(in_chans, 8, 3, padding=1), nn.ReLU(), nn.AdaptiveAvgPool2D(1), nn.Flatten(),
                             nn.Linear(8, num_classes))
"""


def test_the_imports_key_serves_fit_and_the_checkpoint_serves_evaluate_and_export(tmp_path):
    source, log = tmp_path / "src", tmp_path / "imported-by.txt"
    source.mkdir()
    (source / "my_plugin_models.py").write_text(textwrap.dedent(PLUGIN_MODULE))
    # a module given to evaluate and export on the command line, besides the checkpoint's own imports
    (source / "cli_extra.py").write_text(f"import pathlib, sys\nwith open({str(log)!r}, 'a') as f:\n"
                                         f"    f.write(pathlib.Path(sys.argv[0]).name + '\\n')\n")
    fit_evaluate_export(sys.executable, tmp_path, ["imports=[my_plugin_models]", "model.name=imported_net"],
                        pythonpath=[source], later_args=["imports=[cli_extra]"])
    assert log.read_text().split() == ["evaluate.py", "export.py"]


PLUGIN_LOSS = """
    import paddle.nn.functional as F
    from paddletrain.registry import LOSSES


    @LOSSES.register("scaled_ce")
    def scaled_ce(cfg, *, scale: float = 1.0):
        if scale <= 0:
            raise ValueError(f"loss.scale={{scale}} must be > 0")
        with open({log!r}, "a") as f:
            f.write(f"{{scale}}\\n")
        return lambda logits, targets: scale * F.cross_entropy(logits, targets)
"""


def test_a_plugin_loss_takes_its_own_option_from_the_command_line(tmp_path):
    """``loss=scaled_ce loss.scale=2``: the option reaches the factory as a keyword; a misspelt one is refused
    before any work with one line naming the key, the loss and its options."""
    source, log = tmp_path / "src", tmp_path / "scales.txt"
    source.mkdir()
    (source / "my_losses.py").write_text(textwrap.dedent(PLUGIN_LOSS.format(log=str(log))))
    args = [*TINY, "trainer.limit_train_batches=2", "imports=[my_losses]", "loss.name=scaled_ce"]
    ok(run_cli(sys.executable, "paddletrain.fit", [*args, "loss.scale=2.5", f"hydra.run.dir={tmp_path / 'run'}"],
               tmp_path, [source]))
    assert log.read_text().split() == ["2.5"]
    # the checkpoint's config keeps the option: evaluate builds the same loss from it
    ok(run_cli(sys.executable, "paddletrain.evaluate", [f"checkpoint={tmp_path / 'run'}:last",
                                                         f"hydra.run.dir={tmp_path / 'eval'}"], tmp_path, [source]))
    assert log.read_text().split() == ["2.5", "2.5"]
    result = run_cli(sys.executable, "paddletrain.fit", [*args, "loss.scal=2", f"hydra.run.dir={tmp_path / 'typo'}"],
                     tmp_path, [source])
    output = result.stdout + result.stderr
    assert result.returncode == ExitCode.USER_ERROR and "Traceback" not in output
    assert ("unknown config key loss.scal (neither a loss key nor an option of loss.name=scaled_ce, whose options "
            "are: scale; did you mean loss.scale?)") in output and not (tmp_path / "typo").exists()


def test_a_builtin_components_options_are_checked_against_its_signature():
    """Built-in components take their own options too (resnet20's global_pool); a key that is neither the
    group's nor the component's is refused with the close names."""
    validate_config(compose_fit(["model.global_pool=avgmax"]), use="export")
    with pytest.raises(ConfigError, match=r"unknown config key model.zero_init_residul \(neither a model key nor an "
                                          r"option of model.name=resnet20, .*did you mean model.zero_init_residual"):
        validate_config(compose_fit(["model.zero_init_residul=true"]), use="export")


def test_unknown_names_and_unimportable_modules_are_one_line_errors(tmp_path):
    for args, line in ((["model.name=no_such_net"], "unknown model model.name='no_such_net' ("),
                       (["model.name=resnet_20"], "unknown model model.name='resnet_20'; did you mean resnet20"),
                       (["imports=[no_such_module_xyz]"], "imports: cannot import 'no_such_module_xyz'")):
        result = run_cli(sys.executable, "paddletrain.fit", [*TINY, *args, f"hydra.run.dir={tmp_path / 'run'}"],
                         tmp_path)
        output = result.stdout + result.stderr
        assert result.returncode == ExitCode.USER_ERROR, output[-2000:]
        assert line in output and "Traceback" not in output
        assert [row for row in output.splitlines() if "ERROR" in row] == [row for row in output.splitlines()
                                                                          if line in row]


def test_an_unknown_dataset_names_data_name_and_is_a_dataset_error():
    from paddletrain.config import DataConfig
    from paddletrain.data import DatasetError, UnknownDatasetError, build_datasets

    with pytest.raises(UnknownDatasetError, match=r"^unknown dataset data.name='shapez'; did you mean shapes\?") \
            as info:
        build_datasets(DataConfig(name="shapez"))
    assert isinstance(info.value, DatasetError) and isinstance(info.value, ConfigError)


@pytest.fixture
def importable(tmp_path, monkeypatch):
    """Write modules under tmp_path/<dir> (on sys.path) that record their import in ``imported``."""
    imported: list[str] = []
    monkeypatch.setattr(registry_module, "_test_imported", imported, raising=False)
    roots: set[str] = set()

    def write(relative: str) -> Path:
        path = tmp_path / relative
        path.parent.mkdir(parents=True, exist_ok=True)
        name = relative.removesuffix(".py").replace("/", ".").removesuffix(".__init__")
        path.write_text(f"from paddletrain import registry\nregistry._test_imported.append({name!r})\n")
        roots.add(name.split(".")[0])
        return path

    monkeypatch.syspath_prepend(str(tmp_path))
    yield write, imported
    for name in [n for n in sys.modules if n.split(".")[0] in roots]:  # namespace folders too
        sys.modules.pop(name, None)


def _checkpoint(path: Path, imports: object) -> Checkpoint:
    path.mkdir(parents=True, exist_ok=True)
    return Checkpoint(path=path, state={"config": {"imports": imports}}, manifest={})


def test_prepare_imports_the_configs_and_the_checkpoints_modules(importable, tmp_path):
    write, imported = importable
    write("given_mod.py")
    write("saved_pkg/__init__.py")
    write("saved_pkg/models.py")
    cfg = OmegaConf.create({"imports": ["given_mod"]})
    assert prepare(cfg, _checkpoint(tmp_path / "ckpt", ["saved_pkg.models", "given_mod"])) == \
        ["given_mod", "saved_pkg.models"]
    assert imported == ["given_mod", "saved_pkg", "saved_pkg.models"]
    assert prepare({"imports": []}) == [] and prepare(object()) == []


def test_a_checkpoint_cannot_make_its_own_files_run(importable, tmp_path, monkeypatch):
    write, imported = importable
    checkpoint = tmp_path / "outputs" / "run" / "checkpoints" / "ckpt"
    write("outputs/run/checkpoints/ckpt/__init__.py")
    write("outputs/run/checkpoints/ckpt/evil.py")
    write("evil_pkg/__init__.py")
    (tmp_path / "evil_pkg" / "ckpt").symlink_to(checkpoint)  # a package whose subpackage is the checkpoint
    monkeypatch.syspath_prepend(str(checkpoint))  # e.g. evaluated from inside it: `checkpoint=.`
    for saved, message in (
            ("outputs.run.checkpoints.ckpt.evil", r"'outputs' is a bare folder \(a namespace package\)"),
            ("evil_pkg.ckpt.evil", r"'evil_pkg.ckpt.evil', whose code lies inside the checkpoint \(.*__init__.py\)"),
            ("evil", r"'evil', whose code lies inside the checkpoint \(.*evil.py\)")):
        with pytest.raises(PluginError, match=message):
            prepare({}, _checkpoint(checkpoint, [saved]))
    assert imported == ["evil_pkg"]  # a parent checked to lie outside the checkpoint; nothing from inside it
    # the same module named on the command line is the user's own choice
    prepare({"imports": ["outputs.run.checkpoints.ckpt.evil"]}, _checkpoint(checkpoint, []))
    assert imported[-1] == "outputs.run.checkpoints.ckpt.evil"


@pytest.mark.parametrize("imports, message", [
    ("my_pkg.models", "must be a list of module names"),
    (["os; rm -rf /"], r"'os; rm -rf /' is not a module name"),
    ([".relative"], "is not a module name"),
    (["m"] * 65, "names 65 modules; at most 64"),
])
def test_malformed_imports_are_refused_naming_the_checkpoint(tmp_path, imports, message):
    with pytest.raises(ConfigError, match=message) as info:
        prepare({}, _checkpoint(tmp_path / "ckpt", imports))
    assert f"checkpoint={tmp_path / 'ckpt'}" in str(info.value)
    with pytest.raises(ConfigError, match=r"^imports"):
        prepare({"imports": imports})


def test_predict_honours_the_imports_key(importable, tmp_path):
    from paddletrain.predict import PredictConfig, run

    write, imported = importable
    write("predict_ops.py")  # e.g. a module that loads custom operators the exported graph uses
    missing = str(tmp_path / "missing")
    cfg = OmegaConf.structured(PredictConfig(model_dir=missing, input=missing, imports=["predict_ops"]))
    # imported, then: no such input
    assert command_code(run, cfg) == ExitCode.USER_ERROR and imported == ["predict_ops"]
