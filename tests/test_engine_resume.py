"""Exact resume through the real CLI, in fresh processes: an interrupted run ends bit-identical to a straight one.

Every source of randomness is on: shuffling, random crop/flip augmentation, dropout and 2 loader workers.
"""
from __future__ import annotations

import json
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import paddle
import pytest

from paddletrain.checkpoint import find_latest, load_checkpoint
from paddletrain.engine.resume import config_differences
from paddletrain.models import create_model
from tests.conftest import TINY, run_module

# 64 training images / batch 16 = 4 optimizer steps per epoch.
STEPS_PER_EPOCH = 4
RANDOM = [*TINY, "trainer.max_epochs=4", "model.drop_rate=0.3", "data.num_workers=2",
          "callbacks.visualdl.log_images=true", "callbacks.checkpoint.keep_last=2", "+callbacks.ema.decay=0.9"]


def fit(run_dir: Path, *extra: str) -> subprocess.CompletedProcess:
    result = run_module("paddletrain.fit", [*RANDOM, f"hydra.run.dir={run_dir}", *extra], cwd=run_dir.parent)
    assert result.returncode == 0, (result.stdout + result.stderr)[-3000:]
    return result


def final_state(run_dir: Path) -> dict:
    return load_checkpoint(find_latest(run_dir / "checkpoints")).state


def arrays(tree, prefix=""):
    """Flatten a state tree into {path: numpy array or python value}."""
    if isinstance(tree, dict):
        out = {}
        for key, value in tree.items():
            out.update(arrays(value, f"{prefix}{key}/"))
        return out
    if isinstance(tree, (list, tuple)):
        out = {}
        for i, value in enumerate(tree):
            out.update(arrays(value, f"{prefix}{i}/"))
        return out
    return {prefix[:-1]: np.asarray(tree.numpy() if hasattr(tree, "numpy") else tree)}


def assert_same_training_state(a: dict, b: dict) -> None:
    for part in ("model", "optimizer", "scheduler", "precision", "progress"):
        left, right = arrays(a[part]), arrays(b[part])
        assert left.keys() == right.keys(), part
        for key in left:
            np.testing.assert_array_equal(left[key], right[key], err_msg=f"{part}/{key}")
    left, right = arrays(a["callbacks"]["ModelEMA"]), arrays(b["callbacks"]["ModelEMA"])
    for key in left:
        np.testing.assert_array_equal(left[key], right[key], err_msg=f"ModelEMA/{key}")
    # Metrics are equal too, except wall-clock ones.
    timing = ("train/throughput", "train/data_time_share")
    assert {k: v for k, v in a["metrics"].items() if k not in timing} == \
        {k: v for k, v in b["metrics"].items() if k not in timing}


@pytest.fixture(scope="module")
def straight(tmp_path_factory) -> dict:
    run_dir = tmp_path_factory.mktemp("straight") / "run"
    fit(run_dir)
    return final_state(run_dir)


def test_resume_at_epoch_boundary_is_exact(straight, tmp_path):
    run_dir = tmp_path / "run"
    fit(run_dir, f"trainer.max_steps={2 * STEPS_PER_EPOCH}")
    first = final_state(run_dir)
    assert first["progress"]["epoch"] == 1 and first["progress"]["epoch_finished"]
    result = fit(run_dir, "trainer.resume=auto")
    assert "Resumed from" in result.stdout + result.stderr
    resumed = final_state(run_dir)
    assert resumed["progress"]["global_step"] == 4 * STEPS_PER_EPOCH
    assert_same_training_state(straight, resumed)
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["epochs"] == 4


def test_resume_mid_epoch_is_exact(straight, tmp_path):
    run_dir = tmp_path / "run"
    fit(run_dir, f"trainer.max_steps={2 * STEPS_PER_EPOCH + 2}")
    first = final_state(run_dir)
    assert first["progress"]["batch_in_epoch"] == 2 and not first["progress"]["epoch_finished"]
    fit(run_dir, "trainer.resume=auto")
    assert_same_training_state(straight, final_state(run_dir))


def test_resume_from_periodic_step_checkpoint(straight, tmp_path):
    run_dir = tmp_path / "run"
    fit(run_dir, "callbacks.checkpoint.every_n_steps=3", "callbacks.checkpoint.keep_last=10")
    mid = [p for p in (run_dir / "checkpoints").iterdir() if p.name.endswith("step0000009")]
    assert len(mid) == 1, sorted(p.name for p in (run_dir / "checkpoints").iterdir())
    other = tmp_path / "other"
    fit(other, f"trainer.resume={mid[0]}")
    assert_same_training_state(straight, final_state(other))


@pytest.mark.parametrize("signum, exit_code", [(signal.SIGTERM, 143), (signal.SIGINT, 130)])
def test_signal_saves_then_resume_completes(tmp_path, signum, exit_code):
    run_dir = tmp_path / "run"
    # Slow each step down so the signal lands mid-run rather than after training finished.
    args = [*RANDOM, f"hydra.run.dir={run_dir}", "trainer.max_epochs=400"]
    proc = subprocess.Popen([sys.executable, "-m", "paddletrain.fit", *args], cwd=tmp_path,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    deadline = time.time() + 120
    checkpoints = run_dir / "checkpoints"
    while time.time() < deadline and not (checkpoints.is_dir() and find_latest(checkpoints)):
        time.sleep(0.2)
    proc.send_signal(signum)
    output, _ = proc.communicate(timeout=120)
    assert proc.returncode == exit_code, output[-3000:]
    assert signal.Signals(signum).name in output
    interrupted = final_state(run_dir)
    assert interrupted["progress"]["global_step"] > 0
    # The interrupted checkpoint resumes into a run that finishes cleanly.
    result = run_module("paddletrain.fit", [*args[:-1], "trainer.max_epochs=400",
                                            f"trainer.max_steps={interrupted['progress']['global_step'] + 3}",
                                            "trainer.resume=auto"], cwd=tmp_path)
    assert result.returncode == 0, (result.stdout + result.stderr)[-3000:]
    assert final_state(run_dir)["progress"]["global_step"] == interrupted["progress"]["global_step"] + 3


def test_resume_with_another_model_is_an_error(tmp_path):
    run_dir = tmp_path / "run"
    fit(run_dir, "trainer.max_epochs=1")
    result = run_module("paddletrain.fit", [*RANDOM, f"hydra.run.dir={run_dir}", "model=resnet32",
                                            "trainer.resume=auto"], cwd=tmp_path)
    output = result.stdout + result.stderr
    assert result.returncode == 2 and "model=resnet20" in output and "model=resnet32" in output
    assert "Traceback" not in output


def test_resume_with_another_batch_size_warns(tmp_path):
    run_dir = tmp_path / "run"
    fit(run_dir, "trainer.max_epochs=1")
    result = fit(run_dir, "data.batch_size=8", "trainer.max_epochs=2", "trainer.resume=auto")
    output = result.stdout + result.stderr
    assert "batch_size=8" in output and "batch_size=16" in output


def test_legacy_pickled_checkpoint_needs_trust_and_then_warm_starts(tmp_path):

    model = create_model("resnet20", num_classes=6)
    legacy = tmp_path / "legacy"
    legacy.mkdir()
    paddle.save(model.state_dict(), str(legacy / "model.pdparams"))
    args = [*TINY, f"trainer.resume={legacy}", f"hydra.run.dir={tmp_path / 'run'}"]
    refused = run_module("paddletrain.fit", args, cwd=tmp_path)
    output = refused.stdout + refused.stderr
    assert refused.returncode == 2 and "trainer.trust_pickle=true" in output and "Traceback" not in output
    trusted = run_module("paddletrain.fit", [*args, "trainer.trust_pickle=true"], cwd=tmp_path)
    output = trusted.stdout + trusted.stderr
    assert trusted.returncode == 0, output[-3000:]
    assert "Started from the legacy checkpoint" in output


def test_config_differences_name_the_keys_that_matter():
    saved = {"trainer": {"max_epochs": 5, "resume": None, "cpu_threads": None}, "optim": {"lr": 0.1},
             "data": {"root": "/old", "num_workers": 4}, "callbacks": {"ema": {"decay": 0.9}, "visualdl": {"a": 1}}}
    current = {"trainer": {"max_epochs": 10, "resume": "auto", "cpu_threads": 2}, "optim": {"lr": 0.1},
               "data": {"root": "/new", "num_workers": 0}, "callbacks": {"visualdl": {"a": 2}}}
    assert config_differences(saved, current) == [("callbacks.ema.decay", 0.9, None),
                                                  ("trainer.max_epochs", 5, 10)]
    assert config_differences("not a config", current) == []


def test_resume_with_every_recipe_part_on_is_exact(tmp_path):
    """Augment list, Mixup/CutMix per sample, repeated augmentation, drop path, EMA and a distilled teacher,
    all at once: a run stopped mid-epoch and resumed ends bit-identical to a straight one."""

    paddle.seed(3)
    teacher = tmp_path / "teacher.pdparams"
    paddle.save(create_model("resnet20", num_classes=6).state_dict(), str(teacher))
    parts = ["data.augment=[{name: rand_augment, num_ops: 2, magnitude: 9, magnitude_std: 0.5},"
             "{name: random_erasing, probability: 0.5, mode: pixel}]",
             "data.mixup.mixup_alpha=0.2", "data.mixup.cutmix_alpha=1.0", "data.mixup.mode=elem",
             "loss.label_smoothing=0.1", "data.num_repeats=2", "model.drop_path_rate=0.1",
             "trainer.distill.teacher=resnet20", f"trainer.distill.pretrained={teacher}",
             "trainer.distill.temperature=2", "trainer.max_epochs=2"]
    straight_dir, resumed_dir = tmp_path / "straight", tmp_path / "resumed"
    fit(straight_dir, *parts)
    fit(resumed_dir, *parts, f"trainer.max_steps={STEPS_PER_EPOCH + 2}")
    assert final_state(resumed_dir)["progress"]["batch_in_epoch"] == 2
    fit(resumed_dir, *parts, "trainer.resume=auto")
    straight, resumed = final_state(straight_dir), final_state(resumed_dir)
    assert_same_training_state(straight, resumed)
    assert straight["batch_transform"] == resumed["batch_transform"]  # Mixup's generator: same position
    assert not any(key.startswith("teacher") for key in straight["model"])  # the student only
    assert set(straight["model"]) == set(create_model("resnet20", num_classes=6).state_dict())


def test_fit_into_a_directory_holding_a_run_refuses_to_replace_it_and_a_finished_run_says_so(tmp_path):
    from paddletrain.job.rundir import LOCK_FILE as LOCK

    run_dir = tmp_path / "run"
    args = [*TINY, f"hydra.run.dir={run_dir}"]
    assert run_module("paddletrain.fit", args, cwd=tmp_path).returncode == 0
    def files() -> dict:  # everything but the lock record, which each start that takes the lock rewrites
        return {path: path.read_bytes() for path in run_dir.rglob("*") if path.is_file() and path.name != LOCK}

    before = files()
    again = run_module("paddletrain.fit", args, cwd=tmp_path)
    said = again.stdout + again.stderr
    assert again.returncode == 2 and "already holds a run" in said and "trainer.resume=auto" in said, said[-2000:]
    assert files() == before  # nothing replaced: checkpoints, best.json, history.json, summary.json, .hydra/
    finished = run_module("paddletrain.fit", [*args, "trainer.resume=auto"], cwd=tmp_path)
    said = finished.stdout + finished.stderr
    assert finished.returncode == 0 and "The run is already finished" in said
