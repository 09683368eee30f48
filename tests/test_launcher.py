"""What `trainer.devices=N` prints: one line per rank started, rank 0's lines without Paddle's start-up chatter,
and Paddle's launcher's own log kept in the run directory."""
from __future__ import annotations

import io
import re
from pathlib import Path

from paddletrain.distributed import OUTCOME_MARKER
from paddletrain.launcher import _LogTail, shown_on_console
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
