"""Data parallelism for real: 2 processes on CPU with gloo, launched by paddle.distributed.launch."""
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

from paddletrain.checkpoint import find_latest, load_checkpoint
from tests.conftest import TINY, run_module, write_image_folder

WORKER = Path(__file__).with_name("scripts") / "ddp_worker.py"
pytestmark = pytest.mark.timeout(300)


def launch_worker(tmp_path: Path, nproc: int, *args: str) -> None:
    cmd = [sys.executable, "-m", "paddle.distributed.launch", "--nproc_per_node", str(nproc),
           "--log_dir", str(tmp_path / "log"), str(WORKER), *args]
    result = subprocess.run(cmd, capture_output=True, text=True, timeout=240, cwd=tmp_path)
    logs = "".join(p.read_text() for p in (tmp_path / "log").glob("workerlog.*")) if result.returncode else ""
    assert result.returncode == 0, (result.stdout + result.stderr + logs)[-4000:]


def load_params(path: Path) -> dict:
    with np.load(path) as data:
        return {k: data[k] for k in data.files}


@pytest.mark.parametrize("accumulate", [1, pytest.param(2, marks=pytest.mark.slow)])  # 2: slow pass
def test_two_ranks_stay_identical_and_match_one_process_on_the_global_batch(tmp_path, accumulate):
    # 2 ranks x batch 4 (x accumulation) sees the same samples per step as 1 process with batch 8 (x same).
    launch_worker(tmp_path, 2, str(tmp_path / "ddp"), "4", str(accumulate))
    rank0, rank1 = load_params(tmp_path / "ddp.rank0.npz"), load_params(tmp_path / "ddp.rank1.npz")
    single = tmp_path / "single"
    result = subprocess.run([sys.executable, str(WORKER), str(single), "8", str(accumulate)], capture_output=True,
                            text=True, timeout=120, env={k: v for k, v in os.environ.items()
                                                         if not k.startswith("PADDLE_")})
    assert result.returncode == 0, result.stderr[-3000:]
    reference = load_params(tmp_path / "single.rank0.npz")
    assert int(rank0["steps"]) == int(reference["steps"]) == 16 // accumulate
    for key in reference:
        np.testing.assert_array_equal(rank0[key], rank1[key], err_msg=key)
        np.testing.assert_allclose(rank0[key], reference[key], atol=1e-5, err_msg=key)


def fit_two(tmp_path: Path, *extra: str, check=True) -> subprocess.CompletedProcess:
    result = run_module("paddletrain.fit", [*TINY, "trainer.devices=2", *extra], cwd=tmp_path, timeout=240)
    if check:
        assert result.returncode == 0, (result.stdout + result.stderr)[-4000:]
    return result


def test_fit_on_two_processes_one_run_dir_rank0_output_and_exact_eval(tmp_path):
    # 31 validation images: the sampler pads rank 1's shard; that padding must not be counted.
    fit_two(tmp_path, "trainer.max_epochs=2", "data.shapes.num_val=31")
    run_dirs = list((tmp_path / "outputs").glob("*/*"))
    assert len(run_dirs) == 1, run_dirs  # one run directory for the launcher and both ranks
    run_dir = run_dirs[0]
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["epochs"] == 2 and summary["global_step"] == 4  # 64 images / (2 x 16) per step

    worker1 = (run_dir / "launch" / "workerlog.1").read_text()
    assert "Saved checkpoint" not in worker1 and "Summary" not in worker1
    assert "[rank 1]" not in (run_dir / "fit.log").read_text()
    assert len(list((run_dir / "visualdl").iterdir())) == 1
    ckpt = find_latest(run_dir / "checkpoints")
    assert load_checkpoint(ckpt).state["run"]["world_size"] == 2

    # The same weights evaluated by one process give exactly the 2-process top-1.
    result = run_module("paddletrain.evaluate", [f"checkpoint={ckpt}", f"hydra.run.dir={tmp_path / 'ev'}"],
                        cwd=tmp_path)
    assert result.returncode == 0, result.stderr[-3000:]
    single = json.loads(result.stdout.strip().splitlines()[-1])
    assert single["val/top1"] == summary["val/top1"]
    # The per-class counts are all-reduced with the other sums: the confusion matrix of both ranks is the whole one.
    assert single["val/confusion_matrix"] == summary["val/confusion_matrix"]
    assert sum(map(sum, summary["val/confusion_matrix"])) == 31
    assert single["val/loss"] == pytest.approx(summary["val/loss"], rel=1e-5)

    # Resuming that 2-process run on 1 process warns with both world sizes and continues.
    result = run_module("paddletrain.fit", [*TINY, "trainer.max_epochs=3", "data.shapes.num_val=31",
                                            "trainer.resume=auto", f"hydra.run.dir={run_dir}"], cwd=tmp_path)
    output = result.stdout + result.stderr
    assert result.returncode == 0, output[-3000:]
    assert "world_size=1" in output and "world_size=2" in output
    assert json.loads((run_dir / "summary.json").read_text())["epochs"] == 3


@pytest.mark.slow  # another two-rank launch (11 s); the default suite keeps the two-rank runs of fit
def test_the_ranks_read_the_config_directory_of_the_command_line(tmp_path):
    experiments = tmp_path / "recipes" / "experiment"
    experiments.mkdir(parents=True)
    (experiments / "two.yaml").write_text("# @package _global_\nname: from_the_recipe\ndata:\n  holdout: 0.25\n")
    run_dir = tmp_path / "run"
    result = run_module("paddletrain.fit", ["--config-dir", str(tmp_path / "recipes"), *TINY, "trainer.devices=2",
                                            "+experiment=two", "callbacks.visualdl=null", f"hydra.run.dir={run_dir}"],
                        cwd=tmp_path, timeout=240)
    assert result.returncode == 0, (result.stdout + result.stderr)[-4000:]
    summary = json.loads((run_dir / "summary.json").read_text())
    assert sum(map(sum, summary["val/confusion_matrix"])) == 18  # both ranks validated on the held-out quarter


@pytest.mark.slow  # tests/reliability/test_processes.py ends a job on a failing rank
def test_a_crashing_rank_stops_the_job_quickly_and_is_named(tmp_path):
    write_image_folder(tmp_path / "data", bad_val_index=1)
    start = time.time()
    result = fit_two(tmp_path, "data=imagefolder", f"data.root={tmp_path / 'data'}", "data.image_size=12",
                     "data.train_transform=none", "data.eval_transform=none", "data.batch_size=4",
                     f"hydra.run.dir={tmp_path / 'run'}", check=False)
    elapsed = time.time() - start
    output = result.stdout + result.stderr
    assert result.returncode != 0
    assert elapsed < 90, elapsed
    assert "[rank 1]" in output and "1.png" in output, output[-3000:]


@pytest.mark.slow  # tests/reliability/test_processes.py stops a devices=2 run by SIGTERM
def test_sigterm_to_the_launcher_checkpoints_once_then_resume_completes(tmp_path):
    run_dir = tmp_path / "run"
    args = [*TINY, "trainer.devices=2", "trainer.max_epochs=500", f"hydra.run.dir={run_dir}"]
    proc = subprocess.Popen([sys.executable, "-m", "paddletrain.fit", *args], cwd=tmp_path,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    deadline = time.time() + 180
    while time.time() < deadline and not ((run_dir / "checkpoints").is_dir() and find_latest(run_dir / "checkpoints")):
        time.sleep(0.3)
    proc.send_signal(signal.SIGTERM)
    output, _ = proc.communicate(timeout=120)
    assert proc.returncode == 143, output[-3000:]
    latest = find_latest(run_dir / "checkpoints")
    step = load_checkpoint(latest).state["progress"]["global_step"]
    assert not list((run_dir / "checkpoints").glob(".tmp-*"))  # nothing half-written
    result = run_module("paddletrain.fit", [*args, f"trainer.max_steps={step + 2}", "trainer.resume=auto"],
                        cwd=tmp_path, timeout=240)
    assert result.returncode == 0, (result.stdout + result.stderr)[-3000:]
    assert load_checkpoint(find_latest(run_dir / "checkpoints")).state["progress"]["global_step"] == step + 2
