"""comparisons/time_split.py: a finished run's wall time split into its parts, which add up to the wall time."""
from __future__ import annotations

import json
from pathlib import Path

import pytest

from comparisons.step_profile import StepProfileConfig, run_step_profile
from comparisons.time_split import TimeSplitConfig, run_time_split
from paddletrain.errors import ConfigError

KEPT_RUN = Path(__file__).resolve().parents[1] / "docs" / "results" / "fashion_mnist_949" / "seed0"


def fake_run(root: Path) -> Path:
    run = root / "run"
    run.mkdir()
    rows = [{"epoch": 1, "wall_seconds": 110.0, "seconds/train": 100.0, "seconds/validation": 5.0},
            {"epoch": 2, "wall_seconds": 220.0, "seconds/train": 100.0, "seconds/validation": 5.0}]
    (run / "history.json").write_text(json.dumps({"resumes": 0, "rows": rows}))
    (run / "summary.json").write_text(json.dumps({"world_size": 2, "train/throughput": 120.0,
                                                  "train/step_seconds": 196.0, "train/data_time_share": 0.01}))
    return run


def fake_profile(root: Path) -> Path:
    path = root / "profile.json"
    path.write_text(json.dumps({"config": {"batch_size": 64}, "step_seconds": 0.5, "rows": [
        {"part of a step": "forward", "ms": 150.0}, {"part of a step": "backward", "ms": 345.0},
        {"part of a step": "optimizer", "ms": 5.0}]}))
    return path


def test_each_part_comes_from_the_records_and_the_profiles_shares(tmp_path):
    result = run_time_split(TimeSplitConfig(run=str(fake_run(tmp_path)), profile=str(fake_profile(tmp_path))))
    seconds = {row["part"]: row["seconds"] for row in result["rows"]}
    compute = 196.0 * 0.99  # the steps less their data wait
    assert seconds == {"forward (model and loss)": round(compute * 0.30, 1), "backward": round(compute * 0.69, 1),
                       "optimizer step and clearing gradients": round(compute * 0.01, 1), "data wait": 2.0,
                       "per-step hooks and logging in the loop": 4.0, "validation": 10.0,
                       "checkpoints and epoch-end logs": 10.0}
    assert sum(seconds.values()) == pytest.approx(220.0, abs=0.2)
    assert result["images_per_second_alone"] == pytest.approx(128.0)


def test_a_kept_run_split_by_a_real_profile_adds_up_to_its_wall_time(tmp_path):
    profile = run_step_profile(StepProfileConfig(model="resnet20", image_size=8, batch_size=4, steps=2, warmup=1,
                                                 repeats=1))
    (tmp_path / "profile.json").write_text(json.dumps(profile))
    result = run_time_split(TimeSplitConfig(run=str(KEPT_RUN), profile=str(tmp_path / "profile.json")))
    summary = json.loads((KEPT_RUN / "summary.json").read_text())
    seconds = {row["part"]: row["seconds"] for row in result["rows"]}
    assert sum(seconds.values()) == pytest.approx(summary["wall_seconds"], abs=1.0)
    assert seconds["data wait"] == pytest.approx(summary["train/step_seconds"] * summary["train/data_time_share"],
                                                 abs=0.1)
    assert all(value >= 0 for value in seconds.values())


def test_missing_records_and_a_file_that_is_no_profile_are_named(tmp_path):
    run, profile = fake_run(tmp_path), fake_profile(tmp_path)
    with pytest.raises(ConfigError, match="name both run=.* and profile="):
        run_time_split(TimeSplitConfig(run=str(run)))
    (tmp_path / "not_a_profile.json").write_text(json.dumps({"rows": [{"arm": "paddle"}]}))
    with pytest.raises(ConfigError, match="not a step_profile result"):
        run_time_split(TimeSplitConfig(run=str(run), profile=str(tmp_path / "not_a_profile.json")))
    (tmp_path / "a_list.json").write_text("[1, 2]")
    with pytest.raises(ConfigError, match="a_list.json holds a JSON list"):
        run_time_split(TimeSplitConfig(run=str(run), profile=str(tmp_path / "a_list.json")))
    # A profile without its config still splits the run; only the images/s alone are then unknown.
    (tmp_path / "bare_profile.json").write_text(json.dumps({"rows": json.loads(profile.read_text())["rows"]}))
    bare = run_time_split(TimeSplitConfig(run=str(run), profile=str(tmp_path / "bare_profile.json")))
    assert bare["images_per_second_alone"] is None and len(bare["rows"]) == 7
    (run / "summary.json").unlink()
    with pytest.raises(ConfigError, match="summary.json is missing"):
        run_time_split(TimeSplitConfig(run=str(run), profile=str(profile)))
