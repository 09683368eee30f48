"""Every command's --help lists its keys and an example that runs as written (parses, for bench)."""
from __future__ import annotations

import configparser
import dataclasses
import importlib
import logging
import shlex
import sys
from pathlib import Path

import pytest

import comparisons.__main__ as maintainers
import paddletrain.bench.__main__ as user_bench
from paddletrain.bench.command import usage
from paddletrain.bench.common import parse_options
from tests.conftest import run_module

ROOT = Path(__file__).resolve().parents[1]

HYDRA_COMMANDS = {
    "fit": ["model:", "trainer:", "max_epochs:", "== Groups", "python -m paddletrain.fit model=resnet18"],
    "evaluate": ["checkpoint:", "data:", "checkpoint=outputs/resnet20-shapes/2026-11-23_10-00-00:best"],
    "export": ["checkpoint: ???", "format: paddle", "batch: dynamic", "format=onnx"],
    "predict": ["model_dir: null", "checkpoint: null", "backend: auto", "input: ???", "model_dir=export/model.onnx"],
}


def help_of(module: str, args: list[str], monkeypatch, capsys) -> tuple[int, str]:
    """``python -m <module> <args>`` in this process (Hydra's --help exits): its exit status and stdout.

    Hydra configures logging for the help: the root logger's handlers and level are put back afterwards, or its
    console handler would stay bound to this test's captured stderr, closed when the test ends, and a later test
    of this worker that logs would print "--- Logging error ---" (seen in test_native_output).
    """
    root = logging.getLogger()
    handlers, level = list(root.handlers), root.level
    monkeypatch.setattr(sys, "argv", [module, *args])
    try:
        importlib.import_module(module).main()
        code = 0
    except SystemExit as exc:
        code = exc.code or 0
    finally:
        root.handlers[:] = handlers
        root.setLevel(level)
    return code, capsys.readouterr().out


@pytest.mark.parametrize("command", sorted(HYDRA_COMMANDS))
def test_hydra_commands_help_shows_usage_examples_and_keys(command, tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    code, text = help_of(f"paddletrain.{command}", ["--help"], monkeypatch, capsys)
    assert code == 0
    assert text.startswith(f"python -m paddletrain.{command}") and "Examples:" in text and "== Keys" in text
    for expected in HYDRA_COMMANDS[command]:
        assert expected in text
    assert "powered by Hydra" not in text and not any(tmp_path.iterdir())  # help writes no run directory


SUITES = {"paddletrain.bench": user_bench.SUITE, "comparisons": maintainers.SUITE}


@pytest.mark.parametrize("program", sorted(SUITES))
def test_bench_help_lists_every_benchmark_with_an_example(program, tmp_path, monkeypatch, capsys):
    suite = SUITES[program]
    # As a user runs it: the maintainers' suite from a checkout, the repository on the path.
    result = run_module(program, ["--help"], cwd=tmp_path, timeout=120, env={"PYTHONPATH": str(ROOT)})
    assert result.returncode == 0, result.stderr
    for name in suite.load():
        assert f"  {name} " in result.stdout and suite.about[name][1] in result.stdout
    code, text = help_of(f"{program}.__main__", [], monkeypatch, capsys)
    assert code == 2 and "Benchmarks:" in text


def test_the_two_suites_are_apart_and_the_maintainers_one_is_not_in_the_wheel():
    assert not set(user_bench.SUITE.load()) & set(maintainers.SUITE.load())
    assert set(maintainers.SUITE.load()) == {"overhead", "decode", "recipes", "full_scale", "ablation", "step_profile",
                                             "mkl_dispatch", "conv_input_grad", "time_split", "search", "shards"}
    setup = configparser.ConfigParser()
    setup.read(Path(__file__).resolve().parents[1] / "setup.cfg")
    # the package and the namespace through which Hydra finds its sweeper; never comparisons/
    assert setup["options.packages.find"]["include"].split() == ["paddletrain*", "hydra_plugins*"]


@pytest.mark.parametrize(("program", "name"),
                         [(p, n) for p, suite in sorted(SUITES.items()) for n in sorted(suite.about)])
def test_each_benchmarks_help_lists_its_keys_and_an_example_that_parses(program, name):
    suite = SUITES[program]
    schema = suite.load()[name][0]
    text = usage(suite, name)
    for field in dataclasses.fields(schema):
        assert f"\n  {field.name}=" in text
    example = shlex.split(suite.about[name][1].replace("<folder of photos>", "photos"))
    assert example[:4] == ["python", "-m", program, name]
    args = [arg for arg in example[4:] if not arg.startswith("out=")]
    parse_options(schema, args, name)  # raises ConfigError naming the key if the example went stale


def test_a_benchmark_help_flag_runs_nothing(monkeypatch, capsys):
    monkeypatch.setattr("paddletrain.bench.data.run_data", lambda cfg: pytest.fail("the benchmark ran"))
    code, text = help_of("paddletrain.bench.__main__", ["data", "--help"], monkeypatch, capsys)
    assert code == 0 and "workers=[0, 1, 2]" in text
    assert "root=None    # An image folder" in text and "transform=small    # a data.train_transform" in text
