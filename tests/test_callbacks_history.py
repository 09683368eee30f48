"""MetricsHistory: history.json rows per validation, with wall time that a resume continues and does not repeat."""
from __future__ import annotations

import json
from types import SimpleNamespace

import pytest

from paddletrain.callbacks.history import HISTORY_FILE, MetricsHistory, time_to_reach
from tests.conftest import TINY, run_module


def fake_trainer(tmp_path, epoch: int, step: int, is_main: bool = True):
    return SimpleNamespace(epoch=epoch, global_step=step, is_main=is_main, run_dir=str(tmp_path), metrics={})


def validate(callback: MetricsHistory, trainer, top1: float) -> None:
    callback.on_train_epoch_start(trainer)
    trainer.metrics.update({"train/loss": 1.0 - top1, "train/lr": 0.1, "other": 3.0})  # as the Trainer does
    callback.on_validation_start(trainer)
    callback.on_validation_end(trainer, {"val/top1": top1, "val/loss": float("nan")})


def test_rows_hold_each_validation_with_growing_wall_time(tmp_path):
    callback = MetricsHistory()
    callback.on_fit_start(fake_trainer(tmp_path, 0, 0))
    validate(callback, fake_trainer(tmp_path, 0, 10), 0.5)
    validate(callback, fake_trainer(tmp_path, 1, 20), 0.8)
    written = json.loads((tmp_path / HISTORY_FILE).read_text())
    assert written["resumes"] == 0 and [r["epoch"] for r in written["rows"]] == [1, 2]
    first, second = written["rows"]
    timings = {"seconds/train": first["seconds/train"], "seconds/validation": first["seconds/validation"]}
    assert first == {"epoch": 1, "global_step": 10, "wall_seconds": first["wall_seconds"], "train/loss": 0.5,
                     "train/lr": 0.1, "val/top1": 0.5, **timings}  # no NaN, nothing but train/ and val/ metrics
    assert all(0 <= seconds < first["wall_seconds"] + 1 for seconds in timings.values())
    assert 0 <= first["wall_seconds"] <= second["wall_seconds"]


def test_a_resume_continues_from_the_checkpoint_and_replaces_the_rows_after_it(tmp_path):
    callback = MetricsHistory()
    callback.on_fit_start(fake_trainer(tmp_path, 0, 0))
    validate(callback, fake_trainer(tmp_path, 0, 10), 0.5)
    saved = json.loads(json.dumps(callback.state_dict()))  # as a checkpoint stores it
    saved["wall_seconds"] = 100.0  # the run had spent 100 s when the checkpoint was written
    validate(callback, fake_trainer(tmp_path, 1, 20), 0.8)  # lost: the process dies before its checkpoint

    resumed = MetricsHistory()
    resumed.load_state_dict(saved)
    resumed.on_fit_start(fake_trainer(tmp_path, 1, 10))
    validate(resumed, fake_trainer(tmp_path, 1, 20), 0.7)
    written = json.loads((tmp_path / HISTORY_FILE).read_text())
    assert written["resumes"] == 1
    assert [(r["global_step"], r["val/top1"]) for r in written["rows"]] == [(10, 0.5), (20, 0.7)]
    assert 100.0 <= written["rows"][1]["wall_seconds"] < 160.0


def test_only_the_main_rank_writes_and_names_must_stay_in_the_run_dir(tmp_path):
    callback = MetricsHistory()
    validate(callback, fake_trainer(tmp_path, 0, 1, is_main=False), 0.5)
    assert not (tmp_path / HISTORY_FILE).exists() and len(callback.rows) == 1
    with pytest.raises(ValueError, match="plain file name"):
        MetricsHistory(filename="../history.json")


def test_time_to_reach_is_the_first_row_at_or_above_the_target():
    rows = [{"wall_seconds": 10, "val/top1": 0.8}, {"wall_seconds": 20, "val/top1": 0.95},
            {"wall_seconds": 30, "val/top1": 0.94}]
    assert time_to_reach(rows, "val/top1", 0.94) == 20
    assert time_to_reach(rows, "val/top1", 0.96) is None


def test_fit_writes_the_history_and_a_resume_extends_it(tmp_path):
    run_dir = tmp_path / "run"
    args = [*TINY, "callbacks.visualdl=null", f"hydra.run.dir={run_dir}"]
    assert run_module("paddletrain.fit", [*args, "trainer.max_epochs=2"], cwd=tmp_path).returncode == 0
    history = json.loads((run_dir / HISTORY_FILE).read_text())
    summary = json.loads((run_dir / "summary.json").read_text())
    assert [r["epoch"] for r in history["rows"]] == [1, 2] and history["resumes"] == 0
    assert history["rows"][-1]["val/top1"] == summary["val/top1"]
    assert history["rows"][-1]["train/loss"] == summary["train/loss"]  # the same epoch's, not the one before
    assert history["rows"][0]["train/loss"] != history["rows"][1]["train/loss"]
    assert history["rows"][-1]["wall_seconds"] <= summary["wall_seconds"] + 1
    result = run_module("paddletrain.fit", [*args, "trainer.max_epochs=3", "trainer.resume=auto"], cwd=tmp_path)
    assert result.returncode == 0, result.stderr[-3000:]
    resumed = json.loads((run_dir / HISTORY_FILE).read_text())
    assert resumed["resumes"] == 1 and [r["epoch"] for r in resumed["rows"]] == [1, 2, 3]
    assert resumed["rows"][:2] == history["rows"]
    assert resumed["rows"][2]["wall_seconds"] > history["rows"][1]["wall_seconds"]
