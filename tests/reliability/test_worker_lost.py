"""A loader worker killed as the out-of-memory killer kills (SIGKILL): said in a person's terms, nothing trained lost,
the printed command continues exactly (paddletrain.data.loading.loaders.lost_worker)."""
from __future__ import annotations

import re
import shlex
import signal
import time
from collections.abc import Callable

import numpy as np
import psutil
import pytest

from paddletrain.checkpoint import find_latest, load_checkpoint
from paddletrain.errors import ExitCode
from tests.conftest import run_module
from tests.reliability.procs import Run

# Long enough for a kill between its first checkpoint and its end; persistent workers live across epochs.
JOB = ("trainer.max_epochs=6", "data.num_workers=2", "data.persistent_workers=true", "data.shapes.num_train=256",
       "callbacks.checkpoint.every_n_steps=2")


def _kill_workers_of(command: list[str], cwd, pick: Callable[[list], list]) -> tuple[int, str]:
    """Run ``python -m <command>``, SIGKILL the workers ``pick`` chooses among its children once they are up;
    its exit status and output."""
    import subprocess
    import sys

    proc = subprocess.Popen([sys.executable, "-m", *command], cwd=cwd, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, start_new_session=True)
    try:
        deadline = time.monotonic() + 120
        workers: list = []
        while time.monotonic() < deadline and len(workers) < 2 and proc.poll() is None:
            workers = [p for p in psutil.Process(proc.pid).children()
                       if "python" in p.name() and "resource_tracker" not in " ".join(p.cmdline())]
            time.sleep(0.05)
        assert len(workers) >= 2, "expected two workers"
        for worker in pick(workers):
            worker.send_signal(signal.SIGKILL)
        out, err = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
    return proc.returncode, out + err


def _weights(run_dir) -> dict[str, np.ndarray]:
    state = load_checkpoint(find_latest(run_dir / "checkpoints")).state
    return {k: np.asarray(v.numpy() if hasattr(v, "numpy") else v) for k, v in state["model"].items()}


@pytest.mark.slow  # a run killed and continued, then its undisturbed twin (about 30 s); evaluate's and predict's stay
def test_a_killed_loader_worker_stops_the_run_in_one_line_having_saved_and_its_command_continues_exactly(tmp_path):
    straight = tmp_path / "straight"
    run = Run(tmp_path, *JOB, name="killed")
    try:
        run.wait_for(r"Epoch 1/6")
        run.watch()
        # The training and the validation loaders' workers (persistent): all killed, as a machine out of memory may.
        workers = [p for p in psutil.Process(run.proc.pid).children() if p.is_running()]
        assert len(workers) >= 2, workers
        for worker in workers:
            worker.send_signal(signal.SIGKILL)
        killed = time.monotonic()
        code = run.wait(60)
        output = run.output
        assert code == ExitCode.WORKER_LOST, output[-3000:]
        assert time.monotonic() - killed < 30
        assert "Traceback" not in output and "Exception ignored" not in output, output[-3000:]
        last = output.strip().splitlines()[-1]
        named = re.search(r"a data loader worker \(pid (\d+)\) was killed by SIGKILL, most likely by the "
                          r"out-of-memory killer: lower data.num_workers or data.batch_size", last)
        assert named and int(named.group(1)) in {w.pid for w in workers}, last
        saved = re.search(r"the steps trained are saved in (\S+);", last).group(1)
        assert load_checkpoint(saved).state["progress"]["global_step"] > 0
        command = shlex.split(last.split("continue with: ", 1)[1])
        assert command[:3] == ["python", "-m", "paddletrain.fit"]
    finally:
        run.kill()
    continued = run_module("paddletrain.fit", command[3:], cwd=tmp_path)
    assert continued.returncode == 0, (continued.stdout + continued.stderr)[-3000:]
    undisturbed = run_module("paddletrain.fit", [*run.args[:-1], f"hydra.run.dir={straight}"], cwd=tmp_path)
    assert undisturbed.returncode == 0, (undisturbed.stdout + undisturbed.stderr)[-3000:]
    a, b = _weights(run.run_dir), _weights(straight)
    assert a.keys() == b.keys() and all(np.array_equal(a[k], b[k]) for k in a)


def test_evaluate_says_a_killed_loader_worker_in_one_line_instead_of_scoring_part_of_the_split(tmp_path):
    """Paddle's reader ends an iteration quietly once it finds a dead worker: evaluate would score part of the
    split as if it were all of it."""
    from tests.conftest import fit_tiny

    run_dir, _ = fit_tiny(tmp_path)
    args = [f"checkpoint={run_dir}:last", "data.shapes.num_val=6000", "data.num_workers=2",
            "data.eval_batch_size=8"]
    code, said = _kill_workers_of(["paddletrain.evaluate", *args], tmp_path, lambda workers: workers)
    assert code == ExitCode.WORKER_LOST, said[-3000:]
    assert "Traceback" not in said and "Exception ignored" not in said, said[-3000:]
    assert len(re.findall(r"a data loader worker \(pid \d+\) was killed by SIGKILL", said)) == 1, said[-3000:]


def test_predict_says_a_killed_decode_worker_in_one_line_and_keeps_what_it_wrote(export_dir, tmp_path):
    """One of predict's two decode workers killed: the other ignores SIGTERM (what the pool sends it), so the pool's
    thread waited for it forever; before that, the pool's error ended the command in a traceback."""
    from PIL import Image

    photos = tmp_path / "photos"
    photos.mkdir()
    rng = np.random.default_rng(0)
    for i in range(320):  # 40 batches of 8 large noisy JPEGs: the workers are still decoding when one is killed
        Image.fromarray(rng.integers(0, 256, (600, 800, 3), dtype=np.uint8)).save(photos / f"{i:03d}.jpg")
    out = tmp_path / "preds.jsonl"
    args = [f"model_dir={export_dir}", f"input={photos}", f"output={out}", "batch_size=8", "num_workers=2"]
    started = time.monotonic()
    code, said = _kill_workers_of(["paddletrain.predict", *args], tmp_path, lambda workers: workers[:1])
    assert time.monotonic() - started < 90, said[-3000:]
    assert code == ExitCode.WORKER_LOST, said[-3000:]
    assert "Traceback" not in said and "Exception ignored" not in said, said[-3000:]
    kept = re.search(r"a decode worker \(pid \d+\) was killed by SIGKILL, most likely by the out-of-memory killer: "
                     r"lower num_workers or batch_size .*; the (\d+) predictions written before it are kept in "
                     + re.escape(str(out)), said)
    assert kept, said[-3000:]
    assert len(out.read_text().splitlines()) == int(kept.group(1)) < 320


@pytest.mark.slow  # a two-rank job to its first epoch (about half a minute); the one-rank cases stay by default
def test_a_rank_that_loses_its_loader_worker_stops_the_job_as_one_named(tmp_path):
    """Under trainer.devices=2: rank 1's worker killed; the job ends with that rank's line (its peer's lost contact
    is the consequence, not the cause) and its exit code."""
    from tests.reliability.procs import rank_pid

    run = Run(tmp_path, "trainer.devices=2", "data.num_workers=1", "trainer.max_epochs=500",
              "data.persistent_workers=true")
    try:
        run.wait_for(r"Epoch 1/", timeout=180)
        run.watch()
        workers = [p for p in psutil.Process(rank_pid(run, 1)).children() if "python" in p.name()]
        assert workers, "expected rank 1's loader workers"
        for worker in workers:
            worker.send_signal(signal.SIGKILL)
        code = run.wait(120)
        last = run.output.strip().splitlines()[-1]
        assert code == ExitCode.WORKER_LOST, run.output[-3000:]
        assert re.search(r"\[rank 1\] failed \(WORKER_LOST\): a data loader worker \(pid \d+\) was killed by SIGKILL",
                         last), last
        assert "continue with: python -m paddletrain.fit" in last
    finally:
        run.kill()
