"""The paddletrain_optuna sweeper end to end on the embedded data: a study, its reports, pruning, and a sweep that
is killed and run again with the same command."""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

optuna = pytest.importorskip("optuna", reason="the search extra (pip install paddletrain[search]) is not installed")

from tests.conftest import TINY, run_module  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
SWEEP = ["hydra/sweeper=paddletrain_optuna", "hydra.sweeper.seed=0", "trainer.limit_train_batches=4",
         "trainer.max_epochs=3", "trainer.limit_val_batches=2"]


def _sweep(tmp_path: Path, *extra: str, timeout: float = 600) -> subprocess.CompletedProcess:
    return run_module("paddletrain.fit", ["-m", *TINY, *SWEEP, *extra, f"hydra.sweep.dir={tmp_path / 'sweep'}"],
                      cwd=tmp_path, timeout=timeout)


def test_a_study_runs_its_trials_and_writes_its_reports(tmp_path):
    result = _sweep(tmp_path, "optim.lr=tag(log,interval(1e-3,0.3))", "loss.label_smoothing=interval(0,0.2)",
                    "hydra.sweeper.n_trials=3", "hydra.sweeper.pruner=none")
    assert result.returncode == 0, (result.stdout + result.stderr)[-3000:]
    sweep = tmp_path / "sweep"
    study = json.loads((sweep / "study.json").read_text())
    assert [t["state"] for t in study["trials"]] == ["COMPLETE"] * 3
    assert all(0.001 <= t["params"]["optim.lr"] <= 0.3 for t in study["trials"])
    for trial in study["trials"]:
        assert (Path(trial["run_dir"]) / "summary.json").is_file()
    best = (sweep / "best.yaml").read_text()
    assert best.startswith("# @package _global_") and "lr:" in best and "label_smoothing:" in best
    assert (sweep / "optimization_history.png").stat().st_size > 1000
    assert "| trial | state |" in (sweep / "study.md").read_text()


def test_pruned_trials_end_cleanly_keep_their_checkpoint_and_count_as_pruned(tmp_path):
    # A pruner that prunes after the first report of every trial but the first: each pruned trial stops at epoch 0.
    result = _sweep(tmp_path, "optim.lr=interval(0.01,0.1)", "hydra.sweeper.n_trials=3",
                    "hydra.sweeper.pruner={name:percentile,percentile:99.9,n_startup_trials:1,n_warmup_steps:0}")
    assert result.returncode == 0, (result.stdout + result.stderr)[-3000:]
    study = json.loads((tmp_path / "sweep" / "study.json").read_text())
    states = [t["state"] for t in study["trials"]]
    assert states[0] == "COMPLETE" and "PRUNED" in states[1:]
    for trial in study["trials"]:
        if trial["state"] == "PRUNED":
            run_dir = Path(trial["run_dir"])
            pruned = json.loads((run_dir / "pruned.json").read_text())
            assert pruned["pruned"] is True and pruned["epoch"] == trial["pruned_step"]
            assert any((run_dir / "checkpoints").iterdir())


def test_an_unknown_sampler_or_a_range_outside_the_schema_is_refused_before_any_trial(tmp_path):
    for extra, message in ((["optim.lr=interval(-1,0.3)"], "optim.lr must be > 0"),
                           (["optim.lr=interval(0.01,0.1)", "hydra.sweeper.sampler=annealing"], "annealing")):
        result = _sweep(tmp_path, *extra)
        output = result.stdout + result.stderr
        assert result.returncode == 2 and message in output and "Traceback" not in output, output[-2000:]
        assert not list((tmp_path / "sweep").glob("trial_*"))


@pytest.mark.slow
def test_a_killed_sweep_continues_its_running_trial_exactly(tmp_path):
    """SIGKILL the sweep in its second trial; the same command continues that trial from its checkpoint, and its
    final weights equal those of an undisturbed trial with the same parameters."""
    args = ["-m", *TINY, *SWEEP, "optim.lr=interval(0.01,0.1)", "hydra.sweeper.n_trials=2",
            "hydra.sweeper.pruner=none", "trainer.max_epochs=4", f"hydra.sweep.dir={tmp_path / 'sweep'}"]
    command = [sys.executable, "-m", "paddletrain.fit", *args]
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    process = subprocess.Popen(command, cwd=tmp_path, env=env, start_new_session=True)
    second = tmp_path / "sweep" / "trial_0001" / "checkpoints"
    deadline = time.monotonic() + 300
    while time.monotonic() < deadline and not (second.is_dir() and any(second.iterdir())):
        time.sleep(0.2)
    os.killpg(process.pid, signal.SIGKILL)
    process.wait()
    assert subprocess.run(command, cwd=tmp_path, env=env, timeout=600).returncode == 0
    study = json.loads((tmp_path / "sweep" / "study.json").read_text())
    assert [t["state"] for t in study["trials"]] == ["COMPLETE", "COMPLETE"]
    continued = study["trials"][1]
    # the undisturbed twin: the same overrides, one fit
    twin = tmp_path / "twin"
    lr = continued["params"]["optim.lr"]
    result = run_module("paddletrain.fit", [*TINY, *SWEEP[2:], "trainer.max_epochs=4", f"optim.lr={lr!r}",
                                            f"hydra.run.dir={twin}"], cwd=tmp_path)
    assert result.returncode == 0
    from paddletrain.checkpoint import load_checkpoint

    def weights(run_dir: Path) -> dict:
        last = sorted((run_dir / "checkpoints").iterdir())[-1]
        return load_checkpoint(last).state["model"]

    mine, theirs = weights(Path(continued["run_dir"])), weights(twin)
    assert mine.keys() == theirs.keys()
    assert all(np.array_equal(np.asarray(mine[k]), np.asarray(theirs[k])) for k in mine)
