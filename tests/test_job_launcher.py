"""What `trainer.devices=N` prints: one line per rank started, rank 0's lines without Paddle's start-up chatter,
and Paddle's launcher's own log kept in the run directory."""
from __future__ import annotations

import io
import re
from pathlib import Path
from types import SimpleNamespace

from paddletrain.callbacks.heartbeat import Heartbeat
from paddletrain.errors import ExitCode
from paddletrain.job.distributed import OUTCOME_MARKER, RankOutcome
from paddletrain.job.launcher import (
    JobOutcome,
    Launcher,
    NodeSpec,
    _LogTail,
    decide,
    first_failed_rank,
    shown_on_console,
)
from paddletrain.job.watchdog import Watchdog
from tests.conftest import TINY, run_module

RANK_LOG = f"""\
======================= Modified FLAGS detected =======================
FLAGS(name='FLAGS_enable_pir_in_executor', current_value=True, default_value=False)
=======================================================================
I1123 13:37:58.563987  3622 tcp_store.cc:336] create libuv server at port: 45452
I1123 13:37:58.569332  3622 tcp_utils.cc:132] Successfully connected to 127.0.0.1:45452
[2026-11-23 13:37:58,963][paddletrain][INFO] - [rank 0] Device cpu, 1 CPU thread, paddle 3.3.1
W1123 13:37:59.000000  3622 gloo_context.cc:10] a warning from gloo
[2026-11-23 13:37:59,745][paddletrain][INFO] - [rank 0] {OUTCOME_MARKER} (exit 0): finished
====
"""


def test_rank_log_echo_leaves_out_paddle_chatter(tmp_path):
    log = tmp_path / "workerlog.0"
    log.write_text("")
    console = io.StringIO()
    tail = _LogTail(log, console)
    with open(log, "a") as handle:  # written in two pieces, the first ending mid-line
        handle.write(RANK_LOG[:300])
        handle.flush()
        tail.pump()
        handle.write(RANK_LOG[300:])
    tail.pump()
    assert console.getvalue().splitlines() == [
        "[2026-11-23 13:37:58,963][paddletrain][INFO] - [rank 0] Device cpu, 1 CPU thread, paddle 3.3.1",
        "W1123 13:37:59.000000  3622 gloo_context.cc:10] a warning from gloo",
        "====",  # a rule outside the FLAGS banner is the rank's own output
    ]


def test_shown_on_console_follows_the_flags_banner():
    assert shown_on_console("=== Modified FLAGS detected ===") == (False, True)
    assert shown_on_console("FLAGS(name='x')", in_banner=True) == (False, True)
    assert shown_on_console("=======", in_banner=True) == (False, False)
    assert shown_on_console("plain output") == (True, False)
    assert shown_on_console("E1123 13:37:58.563987  3622 x.cc:1] an error") == (True, False)


def test_two_ranks_print_one_line_each_and_keep_the_launcher_log(tmp_path):
    run_dir = tmp_path / "run"
    result = run_module("paddletrain.fit", [*TINY, "trainer.devices=2", "callbacks.visualdl=null",
                                            f"hydra.run.dir={run_dir}"], cwd=tmp_path)
    output = result.stdout + result.stderr
    assert result.returncode == 0, output[-3000:]
    started = re.findall(r"Started rank (\d) \(pid \d+\), log (\S+)", output)
    assert sorted(rank for rank, _ in started) == ["0", "1"]
    assert all(Path(path).is_file() for _, path in started)
    for noise in ("LAUNCH INFO", "Modified FLAGS", "tcp_store.cc", OUTCOME_MARKER):
        assert noise not in output, noise
    assert "[rank 0] Summary:" in output
    launcher_log = (run_dir / "launch" / "launcher.log").read_text()
    assert "LAUNCH INFO" in launcher_log


PADDLE_REPORT = ("LAUNCH ERROR 2026-11-26 00:12:49,652 Container failed !!!\n"
                 "Container rank 1 status failed cmd ['python', '-u', 'fit.py', 'a=1'] code -9 log /r/workerlog.1\n")


def test_the_first_rank_paddle_saw_fail_is_read_with_its_status_as_a_global_rank():
    assert first_failed_rank(PADDLE_REPORT, NodeSpec(2)) == (1, -9)
    assert first_failed_rank(PADDLE_REPORT, NodeSpec(2, nnodes=2, node_rank=1)) == (3, -9)
    assert first_failed_rank("LAUNCH INFO Pod completed\n", NodeSpec(2)) is None


def test_a_rank_that_left_no_report_is_named_with_its_signal(tmp_path):
    outcomes = {0: RankOutcome(0, ExitCode.RANK_LOST, "lost contact", 1.0, lost_ranks=[1])}
    verdict = decide(NodeSpec(2), outcomes, {1: "training...\n"}, None, 1, tmp_path / "launcher.log",
                     exit_codes={1: -9})
    assert verdict.code == ExitCode.RANK_LOST
    assert verdict.message.startswith("rank 1 ended without a report (killed by SIGKILL; see its workerlog)")


def test_a_lost_peer_is_a_hang_only_when_the_ranks_that_ended_first_were_waiting(tmp_path):
    watchdog = Watchdog([tmp_path], timeout=1800, expected=[0, 1])
    watchdog.reset()
    Heartbeat(tmp_path, 1).on_train_batch_end(SimpleNamespace(epoch=0, global_step=1), None, None, 0)
    Heartbeat(tmp_path, 0).on_train_batch_start(SimpleNamespace(epoch=0, global_step=1), None, 1)
    lost = JobOutcome(ExitCode.RANK_LOST, "rank 0 lost contact with rank 1")
    launcher = Launcher(NodeSpec(2), tmp_path, watchdog=watchdog)
    # Rank 0 ended first (gloo gave up on rank 1, which was alive but late): a hang.
    launcher._ended = {0: 10.0, 1: 12.0}
    verdict = launcher._stall_verdict(lost)
    assert verdict.code == ExitCode.TIMED_OUT
    assert verdict.message.startswith("rank 1 did not arrive: rank 0 waited 0 s in step 2 of epoch 0 (batch 1: ")
    assert verdict.message.endswith("; the collective's own timeout ended the wait")
    # The late rank ended first, or in the same poll as the others: it was lost (killed), not late.
    for ended in ({1: 10.0, 0: 12.0}, {1: 10.0, 0: 10.0}):
        launcher._ended = ended
        assert launcher._stall_verdict(lost) == lost
    # The late rank is on another node (its heartbeat is on the shared run directory): nobody here saw how it
    # ended, so it stays lost.
    other_node = Launcher(NodeSpec(1), tmp_path, watchdog=Watchdog([tmp_path], timeout=1800, expected=[0]))
    other_node._ended = {0: 10.0}
    assert other_node._stall_verdict(lost) == lost
