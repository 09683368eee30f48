"""Many machines, simulated on one (issue 11, section 7): two `python -m paddletrain.fit` launchers, each a node
(`trainer.num_nodes=2`, one process each, gloo on CPU over loopback), meeting at `trainer.master=127.0.0.1:<port>`."""
from __future__ import annotations

import json
import os
import signal
import time
from pathlib import Path

import numpy as np
import pytest

from paddletrain.checkpoint import find_latest, load_checkpoint
from paddletrain.errors import ExitCode
from tests.conftest import run_module
from tests.reliability.procs import Run, free_port, rank_pid

pytestmark = pytest.mark.timeout(400)
SEED = ["trainer.seed=7", "trainer.max_epochs=2"]


def two_nodes(tmp_path: Path, *args: str) -> tuple[Run, Run]:
    master = f"trainer.master=127.0.0.1:{free_port()}"
    return tuple(Run(tmp_path, "trainer.num_nodes=2", f"trainer.node_rank={node}", master, *args,
                     name=f"node{node}", run_dir=tmp_path / "nodes") for node in (0, 1))


def tensors(checkpoint: Path) -> dict:
    state = load_checkpoint(checkpoint).state
    flat = {f"model.{k}": np.asarray(v) for k, v in state["model"].items()}
    flat.update({f"optimizer.{k}": np.asarray(v) for k, v in state["optimizer"].items() if hasattr(v, "shape")})
    return flat


@pytest.mark.slow  # 50 s; CI's slow pass runs it (the one two-node training run)
def test_two_nodes_train_exactly_like_two_devices_on_one_and_resume_on_one(tmp_path):
    nodes = two_nodes(tmp_path, *SEED)
    try:
        codes = [node.wait(240) for node in nodes]
    finally:
        for node in nodes:
            node.kill()
    assert codes == [0, 0], "\n".join(node.output[-2000:] for node in nodes)
    run_dir = tmp_path / "nodes"  # both nodes were given it (a shared filesystem on real machines)

    reference = run_module("paddletrain.fit", ["trainer.devices=2", *SEED, "callbacks.progress_bar.enabled=false",
                                               "trainer.cpu_threads=1", "data.shapes.num_train=64",
                                               "data.shapes.num_val=32", "data.image_size=16", "data.batch_size=16",
                                               f"hydra.run.dir={tmp_path / 'one'}"], cwd=tmp_path, timeout=240)
    assert reference.returncode == 0, (reference.stdout + reference.stderr)[-3000:]

    # Same losses and metrics, same checkpoints, bitwise the same final weights and optimizer state.
    summary = json.loads((run_dir / "summary.json").read_text())
    expected = json.loads((tmp_path / "one" / "summary.json").read_text())
    for key in ("train/loss", "val/loss", "val/top1", "global_step", "epochs"):
        assert summary[key] == expected[key], key
    names = sorted(p.name for p in (run_dir / "checkpoints").iterdir())
    assert names == sorted(p.name for p in (tmp_path / "one" / "checkpoints").iterdir())
    ours = tensors(find_latest(run_dir / "checkpoints"))
    theirs = tensors(find_latest(tmp_path / "one" / "checkpoints"))
    assert ours.keys() == theirs.keys() and len(ours) > 10
    for key in ours:
        np.testing.assert_array_equal(ours[key], theirs[key], err_msg=key)

    # One run directory, written by global rank 0 only: node 1 saved and summarised nothing.
    node1_log = (run_dir / "launch" / "node1" / "workerlog.0").read_text()
    assert "[rank 1]" not in (run_dir / "fit.log").read_text()
    assert "Saved checkpoint" not in node1_log and "Summary" not in node1_log
    assert load_checkpoint(find_latest(run_dir / "checkpoints")).state["run"]["world_size"] == 2

    # The two-node checkpoint resumes on one node with two devices.
    resumed = run_module("paddletrain.fit", ["trainer.devices=2", "trainer.seed=7", "trainer.max_epochs=3",
                                             "trainer.resume=auto", "callbacks.progress_bar.enabled=false",
                                             "trainer.cpu_threads=1", "data.shapes.num_train=64",
                                             "data.shapes.num_val=32", "data.image_size=16", "data.batch_size=16",
                                             f"hydra.run.dir={run_dir}"], cwd=tmp_path, timeout=240)
    assert resumed.returncode == 0, (resumed.stdout + resumed.stderr)[-3000:]
    assert "Resumed from" in resumed.stdout + resumed.stderr
    after = json.loads((run_dir / "summary.json").read_text())
    assert after["epochs"] == 3 and after["global_step"] == summary["global_step"] * 3 // 2


@pytest.mark.parametrize("lost", [pytest.param(1, marks=pytest.mark.slow), 0])  # one side by default
def test_killing_one_node_ends_the_other_within_60_s_naming_the_lost_rank(tmp_path, lost):
    nodes = two_nodes(tmp_path, "trainer.max_epochs=500")
    survivor, victim = nodes[1 - lost], nodes[lost]
    try:
        nodes[0].wait_for(r"\[rank 0\] Epoch 2/")
        victim.watch()
        killed = time.monotonic()
        os.kill(rank_pid(victim, lost), signal.SIGKILL)
        code = survivor.wait(60)
        took = time.monotonic() - killed
        victim_code = victim.wait(60)
        assert survivor.survivors(timeout=10) == [] and victim.survivors(timeout=10) == []
    finally:
        for node in nodes:
            node.kill()
    output = survivor.output
    assert code == victim_code == ExitCode.RANK_LOST, (code, victim_code, output[-3000:])
    assert took < 60, took
    verdict = output.strip().splitlines()[-1]
    assert f"rank {1 - lost} lost contact with rank {lost}" in verdict, output[-3000:]
    assert f"rank {lost} ended without a report" in victim.output.strip().splitlines()[-1]
    # Above the verdict the survivor's log may show Paddle's own abort report: gloo's error inside the backward
    # pass is a C++ exception Paddle does not turn into a Python one (the process aborts, SIGABRT).
