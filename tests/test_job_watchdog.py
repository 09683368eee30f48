"""No silent hangs (paddletrain.job.watchdog): heartbeats from the ranks, a verdict from the launcher naming the ranks
that did not arrive, and a real two-rank job on loopback where one rank sleeps before an all-reduce."""
from __future__ import annotations

import json
import os
import re
import time
from pathlib import Path
from types import SimpleNamespace

import pytest

from paddletrain.callbacks.heartbeat import Heartbeat
from paddletrain.errors import ExitCode
from paddletrain.job.watchdog import TRAINING, VALIDATION, RankState, Watchdog, heartbeat_path, stall_line
from tests.conftest import TINY, run_module

ROOT = Path(__file__).resolve().parents[1]


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def at(epoch: int, stage: int, batch: int = 0, after: int = 0) -> tuple:
    return (epoch, stage, batch, after)


def test_the_ranks_behind_did_not_arrive_where_the_others_wait():
    # Rank 1 is still after batch 3's step (and before batch 4's) while ranks 0 and 2 are in batch 4's step.
    states = {0: RankState(at(0, TRAINING, 4), "step 12 of epoch 0 (gradient all_reduce)", since=10.0),
              1: RankState(at(0, TRAINING, 3, after=1), "after step 11 of epoch 0", since=10.2),
              2: RankState(at(0, TRAINING, 4), "step 12 of epoch 0 (gradient all_reduce)", since=11.0)}
    assert stall_line(states, now=14.9, timeout=5) is None  # nobody has been stuck 5 s yet
    line = stall_line(states, now=16.0, timeout=5)
    assert line == ("rank 1 did not arrive: ranks 0, 2 waited 6 s in step 12 of epoch 0 (gradient all_reduce) "
                    "(trainer.collective_timeout=5 s); rank 1 last seen in after step 11 of epoch 0, 6 s ago")


def test_ranks_stuck_at_the_same_place_made_no_progress():
    states = {0: RankState(at(1, VALIDATION), "the validation of epoch 1", since=0.0),
              1: RankState(at(1, VALIDATION), "the validation of epoch 1", since=2.0)}
    assert stall_line(states, now=9.0, timeout=8) == (
        "rank 0 made no progress for 9 s in the validation of epoch 1 (trainer.collective_timeout=8 s)")
    # Judged after a lost peer ended the job: nobody is known to be late, so no hang is claimed.
    assert stall_line(states, now=3.0, timeout=8, ended_first={0}) is None


def test_a_rank_that_never_reached_training_is_named_as_starting():
    states = {0: RankState(at(0, TRAINING), "step 1 of epoch 0", since=0.0)}
    line = stall_line(states, now=30.0, timeout=30, expected=[0, 1])
    assert line.startswith("rank 1 did not arrive: rank 0 waited 30 s in step 1 of epoch 0")
    assert line.endswith("rank 1 not training yet (still starting)")


def fake_trainer(epoch: int = 0, global_step: int = 0) -> SimpleNamespace:
    return SimpleNamespace(epoch=epoch, global_step=global_step)


def test_heartbeats_written_by_ranks_are_judged_on_the_launchers_clock(tmp_path):
    clock = Clock()
    watchdog = Watchdog([tmp_path], timeout=5, expected=[0, 1], clock=clock)
    watchdog.reset()
    beats = [Heartbeat(tmp_path, r) for r in (0, 1)]
    for beat in beats:
        beat.on_train_batch_start(fake_trainer(0, 11), None, 11)
        beat.on_train_batch_end(fake_trainer(0, 12), None, None, 11)
    assert watchdog.poll() is None
    beats[0].on_train_batch_start(fake_trainer(0, 12), None, 12)  # rank 0 enters step 13; rank 1 never does
    clock.now += 3
    assert watchdog.poll() is None
    clock.now += 3  # rank 1 has not moved for 6 s (since the first poll), rank 0 for 3 s (since the second)
    line = watchdog.poll()
    assert line.startswith("rank 1 did not arrive: rank 0 waited 3 s in step 13 of epoch 0 (batch 12: forward, "
                           "backward and the gradient all_reduce)"), line
    assert line.endswith("rank 1 last seen in after step 12 of epoch 0 (batch 11: the stop-check all_reduce, then "
                         "loading the next batch), 6 s ago")
    # A rank that finished is neither late nor watched.
    beats[1].on_fit_end(fake_trainer())
    beats[0].on_fit_end(fake_trainer())
    assert watchdog.poll() is None
    assert json.loads(heartbeat_path(tmp_path, 1).read_text())["done"] is True


def test_validation_batches_refresh_the_heartbeat_at_most_once_a_second(tmp_path):
    beat = Heartbeat(tmp_path, 0)
    beat.on_validation_start(fake_trainer(2))
    first = heartbeat_path(tmp_path, 0).read_text()
    beat.on_validation_batch_end(fake_trainer(2), None, 0)
    assert heartbeat_path(tmp_path, 0).read_text() == first  # within the second: not rewritten
    beat._written_at -= 1.1
    beat.on_validation_batch_end(fake_trainer(2), None, 1)
    refreshed = json.loads(heartbeat_path(tmp_path, 0).read_text())
    assert refreshed["beat"] == json.loads(first)["beat"] + 1 and refreshed["where"] == "the validation of epoch 2"


def test_an_earlier_attempts_heartbeats_are_removed_and_a_stale_one_elsewhere_ignored(tmp_path):
    ours, other = tmp_path / "node0", tmp_path / "node1"
    ours.mkdir(), other.mkdir()
    Heartbeat(ours, 0).on_train_epoch_start(fake_trainer())
    Heartbeat(other, 1).on_train_epoch_start(fake_trainer())
    old = time.time() - 60
    os.utime(heartbeat_path(other, 1), (old, old))
    clock = Clock()
    watchdog = Watchdog([ours, other], timeout=1, clock=clock)
    watchdog.reset()
    assert not heartbeat_path(ours, 0).exists()
    clock.now += 10
    assert watchdog.poll() is None  # node 1's file is from before this attempt


@pytest.mark.timeout(300)
def test_a_rank_sleeping_before_an_all_reduce_ends_the_job_within_the_timeout_naming_it(tmp_path):
    timeout = 5
    env = {"PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")])}  # ranks import faults
    # Rank 1 sleeps for a minute before step 2 (of 2), while rank 0 enters its gradient all_reduce.
    fault = "+callbacks.fault={_target_:tests.scripts.faults.SleepBeforeStep,rank:1,step:2,seconds:60}"
    started = time.monotonic()
    result = run_module("paddletrain.fit", [*TINY, "trainer.devices=2",
                                            "callbacks.visualdl=null", f"trainer.collective_timeout={timeout}",
                                            fault, f"hydra.run.dir={tmp_path / 'run'}"],
                        cwd=tmp_path, env=env, timeout=240)
    elapsed = time.monotonic() - started
    output = result.stdout + result.stderr
    assert result.returncode == ExitCode.TIMED_OUT == 5, output[-4000:]
    last = output.strip().splitlines()[-1]
    expected = (r"rank 1 did not arrive: rank 0 waited \d+ s in step 2 of epoch 0 \(batch 1: forward, backward and "
                r"the gradient all_reduce\) \(trainer.collective_timeout=5 s\); rank 1 last seen in after step 1 ")
    assert re.search(expected, last), last
    # Detected within the timeout plus the launcher's polling; the rest is start-up (the sleeping rank would have
    # held the job for 60 s, gloo alone for 30 s).
    waited = int(re.search(r"rank 0 waited (\d+) s", last).group(1))
    assert timeout - 1 <= waited <= timeout + 2, last  # rank 1's clock started a moment before rank 0's
    assert elapsed < 200, elapsed


@pytest.mark.slow  # gloo's own 30 s, plus a launch: about 90 s on the 2 busy cores it was written on
@pytest.mark.timeout(400)
def test_gloos_fixed_30_s_timeout_is_reported_as_a_hang_naming_the_late_rank(tmp_path):
    """The default timeout (30 min) is longer than gloo's fixed 30 s: gloo ends the wait, rank 0 reports a lost
    peer, and the launcher, seeing that peer was alive, reports the hang with the heartbeats' line."""
    env = {"PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")])}
    fault = "+callbacks.fault={_target_:tests.scripts.faults.SleepBeforeStep,rank:1,step:2,seconds:45}"
    result = run_module("paddletrain.fit", [*TINY, "trainer.devices=2", "callbacks.visualdl=null", fault,
                                            f"hydra.run.dir={tmp_path / 'run'}"], cwd=tmp_path, env=env, timeout=300)
    output = result.stdout + result.stderr
    assert result.returncode == ExitCode.TIMED_OUT, output[-4000:]
    last = output.strip().splitlines()[-1]
    assert "rank 1 did not arrive: rank 0 waited" in last and "the collective's own timeout ended the wait" in last
    waited = int(re.search(r"rank 0 waited (\d+) s", last).group(1))
    assert 29 <= waited <= 40, last  # gloo's 30 s, read by the launcher a moment later
    assert "TIMEOUT" in (tmp_path / "run" / "launch" / "workerlog.0").read_text()
