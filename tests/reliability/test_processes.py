"""Processes: no orphans, no lost signals, one meaning per exit code (issue 11, section 4). Real processes, real
signals, real `kill -9`."""
from __future__ import annotations

import json
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import psutil
import pytest
from omegaconf import OmegaConf
from PIL import Image

from paddletrain.checkpoint import find_latest
from paddletrain.data.loading.loaders import build_loader
from paddletrain.errors import ExitCode
from paddletrain.job.distributed import RankOutcome, lost_peers
from paddletrain.job.launcher import NodeSpec, decide
from tests.conftest import run_module, write_image_folder
from tests.forked import server_pids
from tests.reliability.procs import Run, assert_clean, count_lines

pytestmark = pytest.mark.timeout(300)
ROOT = Path(__file__).resolve().parents[2]


# ---------------------------------------------------------------------------------------------- loader workers
class Zeros:
    classes = ["a", "b"]

    def __len__(self) -> int:
        return 64

    def __getitem__(self, index: int):
        return np.zeros((3, 8, 8), np.float32), index % 2


def _loader_workers(me: psutil.Process) -> list[psutil.Process]:
    """Live children of ``me`` other than the forking server and multiprocessing's resource tracker, which any
    earlier test in this process that made a shared-memory block (``paddletrain.deploy.decoding``) has started."""
    def worker(process: psutil.Process) -> bool:
        try:
            return (process.status() != psutil.STATUS_ZOMBIE and process.pid not in server_pids()
                    and "multiprocessing.resource_tracker" not in " ".join(process.cmdline()))
        except psutil.NoSuchProcess:  # a process that exited meanwhile is no worker left behind
            return False

    return [p for p in me.children() if worker(p)]


@pytest.mark.parametrize("persistent", [False, True])
def test_loader_workers_do_not_pile_up_when_an_epoch_stops_at_len_loader(persistent):
    # The trainer reads len(loader) batches and stops without exhausting the iterator: paddle then kept that
    # epoch's workers alive until the process ended (62 workers after 30 epochs, measured).
    cfg = OmegaConf.create(dict(batch_size=16, eval_batch_size=None, num_workers=2, drop_last=True,
                                use_shared_memory=True, persistent_workers=persistent, bad_sample_policy="fail",
                                max_bad_fraction=0.0))
    loader = build_loader(Zeros(), cfg, train=True, seed=0)
    me = psutil.Process()
    for epoch in range(3):
        loader.batch_sampler.set_epoch(epoch)
        iterator = iter(loader)
        for _ in range(len(loader)):
            next(iterator)
        del iterator
        time.sleep(0.3)
        workers = _loader_workers(me)
        assert len(workers) == (2 if persistent else 0), (epoch, workers)


def test_a_killed_training_process_takes_its_loader_workers_with_it(tmp_path):
    run = Run(tmp_path, "trainer.max_epochs=500", "data.num_workers=2")
    try:
        run.wait_for(r"Epoch 2/")
        run.watch()
        workers = [p for p in run.seen.values() if p.pid != run.proc.pid]
        assert workers, "expected loader workers"
        run.signal(signal.SIGKILL)
        run.wait(30)
        assert run.survivors(timeout=10) == []
    finally:
        run.kill()


def test_a_killed_two_rank_launcher_leaves_no_rank_and_rank_0_saves_on_the_way_out(tmp_path):
    run = Run(tmp_path, "trainer.max_epochs=500", "trainer.devices=2", "data.num_workers=1")
    try:
        run.wait_for(r"\[rank 0\] Epoch 2/")
        ranks = len(run.seen)
        assert ranks >= 4, run.seen  # this launcher, Paddle's launcher, two ranks (and loader workers)
        run.signal(signal.SIGKILL)
        assert run.survivors(timeout=10) == []
    finally:
        run.kill()
    # The ranks were told (their launcher's death sends them SIGTERM): rank 0 saved where they stopped.
    outcome = RankOutcome.read_all(run.run_dir / "launch")[0]
    assert outcome.code == ExitCode.INTERRUPTED_SIGTERM and "saved" in outcome.message, outcome
    assert find_latest(run.run_dir / "checkpoints") is not None


DECODING_SCRIPT = """
import glob, sys, time
import numpy as np
from paddletrain.deploy.decoding import decoded_batches

class Slow:
    def __call__(self, image):
        time.sleep(0.5)
        return np.zeros((3, 8, 8), np.float32)

paths = sorted(glob.glob(sys.argv[1] + "/*.png"))
batches = decoded_batches([paths[i:i + 2] for i in range(0, len(paths), 2)], Slow(), 2, (3, 8, 8))
next(batches)
print("decoding", flush=True)
time.sleep(120)
"""


def test_a_killed_predictor_takes_its_decode_workers_with_it(tmp_path):
    for i in range(16):
        Image.fromarray(np.zeros((8, 8, 3), np.uint8)).save(tmp_path / f"{i}.png")
    proc = subprocess.Popen([sys.executable, "-c", DECODING_SCRIPT, str(tmp_path)], stdout=subprocess.PIPE, text=True)
    children: list = []
    try:
        assert proc.stdout.readline().strip() == "decoding"
        children = psutil.Process(proc.pid).children(recursive=True)  # workers and multiprocessing's tracker
        assert len(children) >= 2
        proc.kill()
        proc.wait(10)
        _, alive = psutil.wait_procs(children, timeout=10)
        assert alive == []
    finally:
        proc.kill()
        for child in children:
            if child.is_running():
                child.kill()


# ---------------------------------------------------------------------------------------------- signals
# When the signal lands: Python still importing (signals held), Paddle's launcher starting the ranks, a rank
# building its data and model, training.
MOMENTS = {"importing": None, "ranks starting": r"Launching 2 process", "rank start-up": r"\[rank 0\] Device ",
           "training": r"\[rank 0\] Epoch 2/"}


# The two moments while the ranks start run in CI's slow pass (8-11 s each); importing and training by default.
@pytest.mark.parametrize("moment", [pytest.param(moment, marks=pytest.mark.slow) if "start" in moment else moment
                                    for moment in MOMENTS])
def test_sigterm_stops_a_two_rank_run_cleanly_at_any_moment(tmp_path, moment):
    run = Run(tmp_path, "trainer.max_epochs=500", "trainer.devices=2")
    try:
        if MOMENTS[moment] is None:
            time.sleep(0.3)
        else:
            run.wait_for(MOMENTS[moment])
        sent = run.signal(signal.SIGTERM)
        code = run.wait(90)
        took = time.monotonic() - sent
        assert run.survivors(timeout=10) == []
    finally:
        run.kill()
    output = run.output
    assert code == ExitCode.INTERRUPTED_SIGTERM, output[-3000:]
    assert_clean(output)
    assert count_lines(output, r"SIGTERM received") == 1, output[-3000:]  # once, not once per process
    assert took < 30, took
    saved = find_latest(run.run_dir / "checkpoints")
    last = output.strip().splitlines()[-1]
    if moment == "training":
        assert saved is not None and f"saved {saved}" in last and "trainer.resume=auto" in last, last
    elif moment != "rank start-up":  # a rank's start-up may already have reached its first step
        assert saved is None and "nothing to save" in last, output[-2000:]
    if saved is None:
        assert "Saved checkpoint" not in output


@pytest.mark.parametrize("how, checkpointing", [("ctrl-c", True), ("sigterm", False)])
def test_one_signal_one_message_and_no_claim_to_save_without_checkpointing(tmp_path, how, checkpointing):
    # Ctrl-C in a terminal reaches the whole process group: the loader workers too.
    run = Run(tmp_path, "trainer.max_epochs=500", "data.num_workers=2",
              *([] if checkpointing else ["callbacks.checkpoint=null"]))
    try:
        run.wait_for(r"Epoch 2/")
        run.signal(signal.SIGINT if how == "ctrl-c" else signal.SIGTERM, group=how == "ctrl-c")
        code = run.wait(60)
        assert run.survivors(timeout=10) == []
    finally:
        run.kill()
    output = run.output
    name = "SIGINT" if how == "ctrl-c" else "SIGTERM"
    assert code == ExitCode.interrupted(getattr(signal, name)), output[-3000:]
    assert_clean(output)
    assert count_lines(output, f"{name} received") == 1, output[-3000:]
    stop_lines = output[output.index(f"{name} received"):]
    if checkpointing:
        assert "saving a checkpoint" in stop_lines and "trainer.resume=auto" in stop_lines
    else:
        assert not re.search(r"(?i)sav(e|ing) a checkpoint|Saved checkpoint|; saved ", stop_lines), stop_lines
        assert "nothing saved (callbacks.checkpoint is off)" in stop_lines
        assert not (run.run_dir / "checkpoints").exists()


# ---------------------------------------------------------------------------------------------- exit codes
@pytest.mark.parametrize("bad_rank", [0, pytest.param(1, marks=pytest.mark.slow)])  # rank 1: slow pass
def test_a_bad_image_on_any_rank_exits_like_one_process_naming_the_rank(tmp_path, bad_rank):
    write_image_folder(tmp_path / "data", bad_val_index=bad_rank)
    result = run_module("paddletrain.fit", [
        "trainer.devices=2", "callbacks.progress_bar.enabled=false", "trainer.cpu_threads=1", "data=imagefolder",
        f"data.root={tmp_path / 'data'}", "data.image_size=12", "data.train_transform=none",
        "data.eval_transform=none", "data.batch_size=4", f"hydra.run.dir={tmp_path / 'run'}"], cwd=tmp_path,
        timeout=180)
    output = result.stdout + result.stderr
    assert result.returncode == ExitCode.USER_ERROR, output[-3000:]
    assert_clean(output)
    verdict = [line for line in output.splitlines() if "failed (USER_ERROR)" in line]
    assert len(verdict) == 1 and f"[rank {bad_rank}]" in verdict[0] and f"{bad_rank}.png" in verdict[0], output[-3000:]


def test_hydra_rejecting_the_command_line_is_a_user_error(tmp_path):
    result = run_module("paddletrain.fit", ["trainer.no_such_key=1", f"hydra.run.dir={tmp_path}"], cwd=tmp_path)
    assert result.returncode == ExitCode.USER_ERROR, result.stderr[-2000:]


def test_the_exit_code_table_in_the_docs_is_the_one_in_the_code():
    text = (ROOT / "docs" / "reliability.md").read_text()
    section = text[text.index("## Processes, signals and exit codes"):]
    documented = {int(code): name for code, name in re.findall(r"^\| (\d+) \| `(\w+)`", section, re.M)}
    assert documented == {int(code): code.name for code in ExitCode}


# ---------------------------------------------------------------------------------------------- verdicts
SPEC = NodeSpec(nproc=2)
LOG = Path("launch/launcher.log")


def outcome(rank: int, code: int, message: str = "", at: float = 0.0, lost=None) -> RankOutcome:
    return RankOutcome(rank, code, message or f"rank {rank} says {code}", at, lost)


def test_the_first_real_failure_decides_the_jobs_code_not_the_ranks_it_took_down():
    outcomes = {0: outcome(0, ExitCode.RANK_LOST, at=2.0, lost=[1]),
                1: outcome(1, ExitCode.USER_ERROR, "bad.png", at=1.0)}
    verdict = decide(SPEC, outcomes, {}, None, 1, LOG)
    assert verdict.code == ExitCode.USER_ERROR
    assert verdict.message.startswith("[rank 1] failed") and "bad.png" in verdict.message


def test_a_requested_stop_wins_over_the_collateral_of_stopping():
    outcomes = {0: outcome(0, 143, "Stopped by SIGTERM after step 3; saved x"),
                1: outcome(1, ExitCode.RANK_LOST, lost=[0])}
    assert decide(SPEC, outcomes, {}, signal.SIGTERM, 1, LOG) == decide(SPEC, {0: outcomes[0]}, {}, signal.SIGTERM,
                                                                         0, LOG)
    assert decide(SPEC, {}, {}, signal.SIGINT, -9, LOG).code == 130  # nothing started yet


def test_a_rank_that_vanished_is_named_by_whoever_noticed():
    # rank 1 killed (no outcome, nothing in its log); rank 0 aborted inside Paddle after gloo lost rank 1.
    silent = {0: "terminate called after throwing an instance of 'gloo::TimeoutException'\n  what():  [/paddle/"
                 "third_party/gloo/gloo/transport/tcp/pair.cc:584] TIMEOUT self_rank = 0 pair_rank = 1 peer_str = "
                 "[127.0.0.1]:10138", 1: "[rank 1] Epoch 2/500"}
    verdict = decide(SPEC, {}, silent, None, -6, LOG)
    assert verdict.code == ExitCode.RANK_LOST
    assert "rank 1 ended without a report" in verdict.message and "rank 0 stopped because it lost contact with rank 1" \
        in verdict.message
    # The other node's view: only its own rank, which noticed.
    far = decide(NodeSpec(1, 2, 0), {0: outcome(0, ExitCode.RANK_LOST, lost=[1])}, {}, None, 4, LOG)
    assert far.code == ExitCode.RANK_LOST and "rank 0 lost contact with rank 1" in far.message


def test_gloo_failures_name_the_lost_rank_by_number_or_by_address():
    named = "[/paddle/third_party/gloo/gloo/transport/tcp/pair.cc:584] TIMEOUT self_rank = 0 pair_rank = 3 peer_str"
    assert lost_peers(named, [], 0) == [3]
    by_address = "[/paddle/third_party/gloo/gloo/transport/tcp/pair.cc:576] Read error [10.0.0.2]:7552: Connection"
    endpoints = ["10.0.0.1:6000", "10.0.0.1:6001", "10.0.0.2:6000", "10.0.0.2:6001"]
    assert lost_peers(by_address, endpoints, 0) == [2, 3]
    loopback = by_address.replace("10.0.0.2", "127.0.0.1")
    assert lost_peers(loopback, ["127.0.0.1:1", "127.0.0.1:2"], 0) == [1]
    assert lost_peers("RuntimeError: out of memory", endpoints, 0) is None


def test_an_unreadable_outcome_file_is_ignored(tmp_path):
    (tmp_path / "outcome.0.json").write_text("{not json")
    (tmp_path / "outcome.1.json").write_text(json.dumps({"rank": 1, "code": 2, "message": "m", "time": 1.0}))
    assert list(RankOutcome.read_all(tmp_path)) == [1]
