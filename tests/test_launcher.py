"""What `trainer.devices=N` prints: one line per rank started, rank 0's lines without Paddle's start-up chatter,
and Paddle's launcher's own log kept in the run directory."""
from __future__ import annotations

import io
import re
from pathlib import Path

from paddletrain.distributed import OUTCOME_MARKER, RankOutcome
from paddletrain.errors import ExitCode
from paddletrain.launcher import JobOutcome, Launcher, NodeSpec, _LogTail, decide, first_failed_rank, shown_on_console
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


class StubWatchdog:
    def describe(self) -> str:
        return "rank 1 did not arrive: rank 0 waited 30 s in step 2 of epoch 0"


def test_a_lost_peer_that_was_alive_is_a_timeout_and_a_killed_one_is_not(tmp_path):
    launcher = Launcher(NodeSpec(2), tmp_path, watchdog=StubWatchdog())
    lost = JobOutcome(ExitCode.RANK_LOST, "rank 0 lost contact with rank 1")
    # Rank 0 failed first, reporting the lost peer itself (exit 4): gloo gave up waiting for a live rank 1.
    timed_out = launcher._stall_verdict(lost, (0, int(ExitCode.RANK_LOST)))
    assert timed_out == JobOutcome(ExitCode.TIMED_OUT, "rank 1 did not arrive: rank 0 waited 30 s in step 2 of "
                                                       "epoch 0; the collective's own timeout ended the wait")
    # Rank 1 was killed first: it was lost, whatever the heartbeats say.
    assert launcher._stall_verdict(lost, (1, -9)) == lost
