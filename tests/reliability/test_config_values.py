"""Every value is checked at start-up: each numeric (or fixed-choice) key of every schema declares what it
allows, validation walks the schemas, and a bad value stops the command with one line naming key, value and
what is allowed, before any work."""
from __future__ import annotations

import copy
import dataclasses
import typing
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import paddle
import pytest
from hydra.core.config_store import ConfigStore
from omegaconf import OmegaConf

import comparisons.__main__ as maintainers
import paddletrain.bench.__main__ as user_bench
import paddletrain.evaluate  # noqa: F401  (registers evaluate_schema)
import paddletrain.export  # noqa: F401  (registers export_schema)
import paddletrain.predict  # noqa: F401  (registers predict_schema)
from paddletrain.config import ALLOWED, Allowed, FitConfig, check_values, undeclared_keys
from paddletrain.errors import ConfigError
from paddletrain.validation import validate_config
from tests.conftest import TINY, compose_fit, run_module

HAS_GPU = paddle.device.is_compiled_with_cuda() and paddle.device.cuda.device_count() > 0

# The cases issue 11 found accepted silently or failing mid-run: (override, the start of the expected line).
ISSUE_CASES = [
    ("trainer.cpu_threads=-2", "trainer.cpu_threads=-2 must be >= 1"),
    ("loss.label_smoothing=2", "loss.label_smoothing=2.0 must be >= 0 and < 1"),
    ("+callbacks.ema.decay=2", "callbacks.ema: decay=2 must be > 0 and < 1"),
    ("callbacks.visualdl.log_every_n_steps=0", "callbacks.visualdl: log_every_n_steps=0 must be >= 1"),
    ("+callbacks.early_stopping.patience=-1", "callbacks.early_stopping: patience=-1 must be >= 1"),
    ("trainer.max_steps=0", "trainer.max_steps=0 must be >= 1"),
    ("trainer.limit_train_batches=0", "trainer.limit_train_batches=0 must be >= 1"),
    ("trainer.limit_val_batches=-1", "trainer.limit_val_batches=-1 must be >= 1"),
    ("trainer.devices=0", "trainer.devices=0 must be >= 1"),
    ("model.sync_bn=true", "model.sync_bn=true needs trainer.devices >= 2"),
]


def all_schemas() -> list[type]:
    """Every dataclass schema a paddletrain command line reads: the ConfigStore's and the benchmarks'."""
    found = []

    def walk(node: Any) -> None:
        for value in node.values():
            if isinstance(value, dict):
                walk(value)
            else:
                kind = OmegaConf.get_type(value.node)
                if dataclasses.is_dataclass(kind) and kind.__module__.startswith("paddletrain"):
                    found.append(kind)

    walk(ConfigStore.instance().repo)
    found += [schema for suite in (user_bench, maintainers) for schema, _ in suite.benchmarks().values()]
    return sorted(set(found), key=lambda kind: kind.__qualname__)


def declared(schema: type, prefix: str = "") -> Iterator[tuple[str, Allowed, Any]]:
    """(key, rule, type hint) of every key of ``schema`` (recursively) that declares allowed values."""
    hints = typing.get_type_hints(schema)
    for f in dataclasses.fields(schema):
        if dataclasses.is_dataclass(hints[f.name]):
            yield from declared(hints[f.name], f"{prefix}{f.name}.")
        elif ALLOWED in f.metadata:
            yield f"{prefix}{f.name}", f.metadata[ALLOWED], hints[f.name]


def _is_int(hint: Any) -> bool:
    return hint is int or int in typing.get_args(hint) or any(_is_int(a) for a in typing.get_args(hint))


def _is_list(hint: Any) -> bool:
    return typing.get_origin(hint) in (list, list) or any(_is_list(a) for a in typing.get_args(hint))


def outside_values(rule: Allowed, hint: Any) -> list[Any]:
    """One value just outside each bound of ``rule`` (or a non-choice), shaped like the key (list or scalar)."""
    step = 1 if _is_int(hint) else 0.5
    if rule.choices:  # a word where words are chosen; a number none of the choices is where numbers are
        values: list[Any] = [max(c for c in rule.choices if c is not None) + 1] if _is_int(hint) else ["not-a-choice"]
    else:
        values = [bound - step for bound in (rule.ge,) if bound is not None]
        values += [bound for bound in (rule.gt, rule.lt) if bound is not None]
        values += [bound + step for bound in (rule.le,) if bound is not None]
    return [[v] if _is_list(hint) else v for v in values]


# Lists of a fixed length other than one value per image channel.
LIST_LENGTHS = {"data.mixup.cutmix_minmax": 2}


def inside_value(rule: Allowed, hint: Any, key: str = "") -> Any:
    """A value the rule allows, at an inclusive bound where there is one."""
    low = rule.ge if rule.ge is not None else rule.gt
    high = rule.le if rule.le is not None else rule.lt
    step = 1 if _is_int(hint) else 0.5
    if rule.ge is not None:
        value = rule.ge
    elif rule.le is not None:
        value = rule.le
    elif low is not None and high is not None:
        value = (low + high) / 2
    elif low is not None:
        value = low + step
    elif high is not None:
        value = high - step
    else:  # any number: a large negative one
        value = -1e6
    value = int(value) if _is_int(hint) else float(value)
    # Three: one per image channel for mean/std.
    return [value] * LIST_LENGTHS.get(key, 3) if _is_list(hint) else value


FIT_RANGES = [(key, rule, hint) for key, rule, hint in declared(FitConfig) if not rule.choices]
FIT_CASES = [pytest.param(key, value, rule, id=f"{key}={value}")
             for key, rule, hint in declared(FitConfig) for value in outside_values(rule, hint)]
OTHER_CASES = [pytest.param(schema, key, value, rule, id=f"{schema.__name__}.{key}={value}")
               for schema in all_schemas() if schema.__module__ != "paddletrain.config"  # fit's: FIT_CASES
               for key, rule, hint in declared(schema) for value in outside_values(rule, hint)]


def test_every_numeric_key_of_every_schema_declares_what_it_allows():
    schemas = all_schemas()
    names = {schema.__name__ for schema in schemas}
    assert {"FitConfig", "EvaluateConfig", "ExportConfig", "PredictConfig", "TrainBenchConfig", "ThreadsBenchConfig",
            "OverheadBenchConfig", "DataBenchConfig", "InferenceBenchConfig"} <= names
    undeclared = {schema.__name__: undeclared_keys(schema) for schema in schemas}
    assert undeclared == {name: [] for name in names}


def test_an_undeclared_numeric_key_is_found():
    @dataclasses.dataclass
    class Sloppy:
        rate: float = 0.1
        counts: list[int] = dataclasses.field(default_factory=list)
        flag: bool = False
        label: str = "x"

    assert undeclared_keys(Sloppy) == ["rate", "counts"]


@pytest.mark.parametrize("override, line", ISSUE_CASES, ids=[case[0] for case in ISSUE_CASES])
def test_issue_values_are_refused_by_validate_config(override, line):
    with pytest.raises(ConfigError) as info:
        validate_config(compose_fit([*TINY, override]))
    assert str(info.value).startswith(line)


@pytest.fixture(scope="module")
def tiny_cfg():
    return compose_fit(TINY)


@pytest.mark.parametrize("key, value, rule", FIT_CASES)
def test_every_fit_key_refuses_a_value_outside_its_declaration(key, value, rule, tiny_cfg):
    cfg = copy.deepcopy(tiny_cfg)
    OmegaConf.update(cfg, key, value)
    with pytest.raises(ConfigError) as info:
        validate_config(cfg)
    message = str(info.value)
    assert message.startswith(f"{key}=") and rule.describe() in message and "\n" not in message


@pytest.mark.parametrize("key, rule, hint", FIT_RANGES, ids=[case[0] for case in FIT_RANGES])
def test_every_fit_range_accepts_its_bound(key, rule, hint, tiny_cfg):
    cfg = copy.deepcopy(tiny_cfg)
    OmegaConf.update(cfg, key, inside_value(rule, hint, key))
    validate_config(cfg)


@pytest.mark.parametrize("schema, key, value, rule", OTHER_CASES)
def test_every_command_schema_refuses_a_value_outside_its_declaration(schema, key, value, rule):
    with pytest.raises(ConfigError) as info:
        check_values(OmegaConf.merge(OmegaConf.structured(schema), {key: value}), schema, context="cmd: ")
    assert str(info.value).startswith(f"cmd: {key}=") and rule.describe() in str(info.value)


def test_defaults_of_every_schema_are_allowed():
    for schema in all_schemas():
        check_values(OmegaConf.structured(schema), schema)


def test_sync_bn_with_two_processes_needs_gpus():
    if HAS_GPU:
        pytest.skip("this machine has a GPU, so model.sync_bn=true with trainer.devices=2 is allowed")
    with pytest.raises(ConfigError, match=r"model\.sync_bn=true needs GPUs .*trainer\.device=auto"):
        validate_config(compose_fit([*TINY, "model.sync_bn=true", "trainer.devices=2"]))


def test_saved_training_config_is_judged_by_its_use():
    """A checkpoint trained with SyncBatchNorm on GPUs can still be evaluated and exported here."""
    cfg = compose_fit([*TINY, "model.sync_bn=true", "trainer.devices=2", "trainer.device=gpu"])
    validate_config(cfg, use="export")
    if not HAS_GPU:
        with pytest.raises(ConfigError, match="trainer.device=gpu"):
            validate_config(cfg, use="evaluate")
    cfg.trainer.device = "cpu"
    validate_config(cfg, use="evaluate")
    with pytest.raises(ConfigError, match="model.sync_bn"):
        validate_config(cfg, use="fit")


def test_list_values_are_checked_one_by_one():
    with pytest.raises(ConfigError, match=r"^data\.std=\[0\.5, 0\.0, 0\.5\] is not allowed: every value must be > 0 "
                                          r"\(got 0\.0\)$"):
        validate_config(compose_fit([*TINY, "data.std=[0.5,0,0.5]"]))


CLI_CASES = [
    ("paddletrain.fit", ["loss.label_smoothing=2"], "loss.label_smoothing=2.0 must be >= 0 and < 1"),
    ("paddletrain.fit", ["trainer.limit_val_batches=-1"], "trainer.limit_val_batches=-1 must be >= 1"),
    ("paddletrain.fit", ["trainer.devices=0"], "trainer.devices=0 must be >= 1"),
    ("paddletrain.fit", ["model.sync_bn=true", "trainer.devices=2"], "model.sync_bn=true needs "),
    ("paddletrain.predict", ["model_dir=export", "input=photos", "batch_size=0"], "batch_size=0 must be >= 1"),
    ("paddletrain.export", ["checkpoint=ckpt", "num_check_images=0"], "num_check_images=0 must be >= 1"),
    ("paddletrain.bench", ["train", "warmup=-1"], "bench train: warmup=-1 must be >= 0"),
]


@pytest.mark.parametrize("module, args, expected", CLI_CASES, ids=[" ".join(c[1]) for c in CLI_CASES])
def test_cli_stops_before_any_work_with_one_line(module, args, expected, tmp_path):
    run_dir = tmp_path / "run"
    hydra = [] if module == "paddletrain.bench" else [f"hydra.run.dir={run_dir}"]
    result = run_module(module, [*args, *hydra], cwd=tmp_path, timeout=120)
    lines = [line for line in result.stderr.splitlines() if line.strip()]
    assert result.returncode == 2, result.stdout + result.stderr
    assert len(lines) == 1 and expected in lines[0], result.stderr
    assert "Traceback" not in result.stdout + result.stderr
    if module == "paddletrain.fit":
        assert not run_dir.exists()  # not even Hydra's .hydra/: the check ran before the run directory was made
    elif module != "paddletrain.bench":  # Hydra made the log directory; nothing else was written there
        assert {p.name for p in run_dir.iterdir()} <= {".hydra", f"{module.split('.')[1]}.log"}


def test_configuration_docs_list_every_fit_key_with_what_it_allows():
    """docs/configuration.md's table is the schema's declarations, row for row."""
    expected = []
    for key, rule, hint in declared(FitConfig):
        args = typing.get_args(hint)
        each = "each: " if _is_list(hint) else ""
        null = ", or `null`" if type(None) in args or hint is Any else ""  # Any (a word or a list) takes null
        expected.append(f"| `{key}` | {each}{rule.describe()}{null} |")
    doc = (Path(__file__).resolve().parents[2] / "docs" / "configuration.md").read_text()
    table = doc.split("### Allowed values", 1)[1].split("\n\n## ", 1)[0]
    assert [line for line in table.splitlines() if line.startswith("| `")] == expected


@pytest.mark.parametrize("override, line", [("optim.lr=inf", "optim.lr=inf must be a finite number > 0"),
                                            ("loss.label_smoothing=nan", "loss.label_smoothing=nan must be a "
                                                                            "finite number >= 0 and < 1")])
def test_nan_and_inf_are_never_allowed(override, line, tiny_cfg):
    cfg = copy.deepcopy(tiny_cfg)
    key, value = override.split("=")
    OmegaConf.update(cfg, key, float(value))
    with pytest.raises(ConfigError, match=f"^{line}$"):
        validate_config(cfg)


@pytest.mark.parametrize("override, line", [
    ("loss.class_weights=[1,0]", "loss.class_weights=[1, 0] is not allowed: every value must be > 0 (got 0)"),
    ("loss.class_weights=[balanced]", "loss.class_weights=['balanced'] is not allowed: every value must be > 0"),
    ("loss.class_weights=3", "loss.class_weights=3 is not allowed; choose balanced, or a list with each value > 0"),
    ("data.sampler=weighted", "data.sampler='weighted' is not allowed; choose one of: random, class_balanced"),
])
def test_a_key_taking_a_word_or_a_list_refuses_anything_else(override, line, tiny_cfg):
    with pytest.raises(ConfigError) as info:
        validate_config(compose_fit([*TINY, override]))
    assert str(info.value).startswith(line)
    for fine in ("loss.class_weights=balanced", "loss.class_weights=[1,2.5]", "data.sampler=class_balanced"):
        validate_config(compose_fit([*TINY, fine]))
