"""Callbacks from the `callbacks` config node: registered names, `_target_` classes, null, and one-line errors."""
from __future__ import annotations

import inspect
from pathlib import Path

import pytest

import paddletrain.validation  # noqa: F401  (registers the built-in callbacks)
from paddletrain.callbacks import Callback, EarlyStopping, ProgressBar, VisualDLLogger
from paddletrain.callbacks.instantiate import check_callback_entries, instantiate_callbacks
from paddletrain.errors import ConfigError
from paddletrain.registry import CALLBACKS
from tests.conftest import TINY, compose_fit, run_module


class Counter(Callback):
    """A user's callback, reached only through `_target_`."""

    def __init__(self, every: int = 1) -> None:
        self.every = every


def test_registered_names_target_classes_and_null_entries():
    built = instantiate_callbacks({"progress_bar": {"enabled": False}, "visualdl": None,
                                   "early_stopping": {"patience": 3},
                                   "mine": {"_target_": f"{__name__}.Counter", "every": 5}})
    assert [type(c) for c in built] == [ProgressBar, EarlyStopping, Counter]
    assert built[1].patience == 3 and built[2].every == 5


def test_the_default_preset_builds_progress_lr_history_visualdl_and_checkpoint_in_order():
    cfg = compose_fit(TINY)
    built = instantiate_callbacks(cfg.callbacks)
    assert [type(c).__name__ for c in built] == ["ProgressBar", "LearningRateMonitor", "MetricsHistory",
                                                 "VisualDLLogger", "ModelCheckpoint"]
    visualdl = next(c for c in built if isinstance(c, VisualDLLogger))
    assert visualdl.mean == list(cfg.data.mean)  # the preset's ${data.mean}
    checkpoint = built[-1]
    assert checkpoint.monitor == cfg.monitor and checkpoint.dirpath is None  # <run dir>/checkpoints at fit


@pytest.mark.parametrize("entries, message", [
    ({"early_stoping": {}}, r"^callbacks.early_stoping: no callback is registered under this name; did you mean "
                            r"early_stopping\?"),
    ({"early_stopping": {"patiense": 3}}, r"^callbacks.early_stopping: EarlyStopping has no option 'patiense' "
                                          r"\(did you mean patience\?\)"),
    ({"early_stopping": {"patience": -1}}, r"^callbacks.early_stopping: patience=-1 must be >= 1$"),
    ({"ema": {"decay": 2}}, r"^callbacks.ema: decay=2 must be > 0 and < 1$"),
    ({"visualdl": {"log_every_n_steps": 0}}, r"^callbacks.visualdl: log_every_n_steps=0 must be >= 1$"),
    ({"checkpoint": {"mode": "best"}}, r"^callbacks.checkpoint: mode='best' is not allowed; choose one of: max, min"),
    ({"x": {"_target_": "no_such_module.Thing"}}, r"^callbacks.x: _target_=no_such_module.Thing cannot be imported"),
    ({"x": {"_target_": "pathlib.Path"}}, r"^callbacks.x: .* is not a paddletrain.callbacks.Callback subclass"),
    ({"x": {"_target_": f"{__name__}.Counter", "evry": 1}}, r"^callbacks.x: Counter has no option 'evry'"),
    ({"x": 3}, r"^callbacks.x: must be a mapping of options"),
])
def test_every_bad_entry_is_one_line_naming_it(entries, message):
    with pytest.raises(ConfigError, match=message):
        check_callback_entries(entries)


def test_a_bad_callback_value_stops_fit_before_any_work(tmp_path):
    result = run_module("paddletrain.fit", [*TINY, "+callbacks.ema.decay=2", f"hydra.run.dir={tmp_path / 'run'}"],
                        cwd=tmp_path)
    output = result.stdout + result.stderr
    assert result.returncode == 2, output[-2000:]
    assert "callbacks.ema: decay=2 must be > 0 and < 1" in output and "Traceback" not in output
    assert not (tmp_path / "run").exists()


def test_the_configuration_docs_list_every_registered_callback_and_its_options():
    doc = (Path(__file__).resolve().parents[1] / "docs" / "configuration.md").read_text()
    section = doc.split("## Callbacks", 1)[1].split("\n## ", 1)[0]
    rows = {line.split("|")[1].strip(" `"): line for line in section.splitlines() if line.startswith("| `")}
    assert sorted(rows) == CALLBACKS.names()
    for name in CALLBACKS.names():
        cls = CALLBACKS.get(name)
        assert f"`{cls.__name__}`" in rows[name]
        for option in inspect.signature(cls).parameters:
            assert f"`{option}`" in rows[name], (name, option)


def test_building_a_registered_callback_writes_nothing(tmp_path, monkeypatch):
    """Building a registered callback only stores its options (the config may name it and never run it)."""
    monkeypatch.chdir(tmp_path)
    for name in CALLBACKS.names():
        cls = CALLBACKS.get(name)
        required = {n: 1 for n, p in inspect.signature(cls).parameters.items() if p.default is inspect.Parameter.empty}
        cls(**required)
    assert list(tmp_path.iterdir()) == []
