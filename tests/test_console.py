"""What a run shows in a terminal and in a log: warnings that never split a bar, the same log file with and
without a terminal, the exact command that continues a stopped run, and no directory left by a failed start.

The end-to-end cases run ``python -m paddletrain.fit`` under a pseudo-terminal (``pty``) and through a pipe.
"""
from __future__ import annotations

import io
import json
import logging
import os
import pty
import re
import select
import shlex
import signal
import struct
import subprocess
import sys
import time
import warnings
from pathlib import Path

import pytest
from tqdm import tqdm

from paddletrain import console
from paddletrain.console import (
    FILE_ONLY,
    KNOWN_WARNINGS,
    above_bar,
    install_warning_filters,
    route_warnings_to_log,
    warning_line,
)
from paddletrain.engine.callback import Callback

REPO = Path(__file__).resolve().parents[1]
TEST_WARNING = "a warning raised on every training batch by tests.test_console"


class WarnEveryBatch(Callback):
    """A real warning raised while the bar is drawn (a callback the runs below add with ``_target_``)."""

    def on_train_batch_end(self, trainer, output, batch, batch_idx):
        warnings.warn(TEST_WARNING, UserWarning, stacklevel=1)


# 4 training batches and 2 validation batches per epoch; a progress line after every batch.
RUN = ["data.shapes.num_train=64", "data.shapes.num_val=32", "data.image_size=16", "data.batch_size=16",
       "trainer.max_epochs=2", "trainer.cpu_threads=1", "data.num_workers=0",
       "callbacks.progress_bar.log_every_seconds=0.000001", "+callbacks.progress_bar.mininterval=0",
       "+callbacks.warner={_target_: tests.test_console.WarnEveryBatch}"]


def fit_env() -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONWARNINGS", "COLUMNS", "LINES")}
    env["PYTHONPATH"] = os.pathsep.join([str(REPO), *filter(None, [os.environ.get("PYTHONPATH")])])
    env["TERM"] = "xterm"
    return env


def run_in_terminal(args: list[str], cwd: Path, timeout: float = 300) -> tuple[int, str]:
    """``python -m paddletrain.fit args`` with a pseudo-terminal as stdin, stdout and stderr; returns its exit
    code and everything it wrote to the terminal."""
    import fcntl
    import termios

    main, child = pty.openpty()
    fcntl.ioctl(child, termios.TIOCSWINSZ, struct.pack("HHHH", 40, 150, 0, 0))
    proc = subprocess.Popen([sys.executable, "-m", "paddletrain.fit", *args], cwd=cwd, env=fit_env(),
                            stdin=child, stdout=child, stderr=child, close_fds=True)
    os.close(child)
    chunks, deadline = [], time.monotonic() + timeout
    try:
        while time.monotonic() < deadline:
            ready, _, _ = select.select([main], [], [], 0.2)
            if ready:
                try:
                    data = os.read(main, 65536)
                except OSError:  # the terminal closed: every writer is gone
                    break
                if not data:
                    break
                chunks.append(data)
            elif proc.poll() is not None:
                break
        code = proc.wait(timeout=max(1.0, deadline - time.monotonic()))
    finally:
        os.close(main)
        if proc.poll() is None:
            proc.kill()
    return code, b"".join(chunks).decode("utf-8", errors="replace")


def run_piped(args: list[str], cwd: Path, timeout: float = 300) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "paddletrain.fit", *args], cwd=cwd, env=fit_env(),
                          stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                          timeout=timeout)


ANSI = re.compile(r"\x1b\[[0-9;?]*[A-Za-z]")
BAR = re.compile(r"(Epoch|Validation) \d+/\d+: +\d+%\|[^|]*\| *\d+/\d+ \[[^\]]*\]\s*")
LOG_LINE = re.compile(r"\[\d{4}-\d\d-\d\d [\d:,]+\]\[[\w.]+\]\[[A-Z]+\] - ")


def screen_segments(text: str) -> list[str]:
    """What the terminal received, cut at every carriage return and newline (a bar redraws after ``\\r``)."""
    return [s for s in re.split(r"[\r\n]", ANSI.sub("", text)) if s.strip()]


def comparable(log: str, run_dir: Path) -> list[str]:
    """A log's lines without what differs between two runs of the same config: times, speeds, the directory."""
    return [re.sub(r"\d+", "#", line.replace(str(run_dir), "RUN")) for line in log.splitlines()]


@pytest.fixture(scope="module")
def terminal_and_pipe(tmp_path_factory):
    """The same 2-epoch run twice: on a terminal and into a pipe."""
    root = tmp_path_factory.mktemp("console")
    code, screen = run_in_terminal([*RUN, f"hydra.run.dir={root / 'tty'}"], cwd=root)
    assert code == 0, screen[-3000:]
    piped = run_piped([*RUN, f"hydra.run.dir={root / 'pipe'}"], cwd=root)
    assert piped.returncode == 0, piped.stdout[-3000:]
    return root, screen, piped.stdout


def test_warnings_never_split_the_bar_on_a_terminal(terminal_and_pipe):
    root, screen, _ = terminal_and_pipe
    segments = screen_segments(screen)
    bars = [s for s in segments if "%|" in s]
    assert any(s.startswith("Epoch 2/2:") for s in bars) and any(s.startswith("Validation 1/2:") for s in bars)
    for segment in bars:  # a bar redraw is one whole line: nothing written into it
        assert BAR.fullmatch(segment), segment
    for segment in segments:  # and every log line starts on a line of its own
        if "][paddletrain" in segment or "][py.warnings]" in segment:
            assert LOG_LINE.match(segment), segment
    # Paddle's known-harmless warnings are gone; a real warning is shown once, in one line, above the bar.
    for known in ("No ccache found", "we now always track global mean and variance"):
        assert known not in screen
    shown = [s for s in segments if TEST_WARNING in s]
    assert len(shown) == 1 and re.search(r"\]\[py.warnings\]\[WARNING\] - UserWarning: " + TEST_WARNING
                                         + r" \(test_console.py:\d+\)$", shown[0]), shown
    # With a bar on the screen the timed progress lines go to the log file only.
    assert "Train: epoch" not in screen and "Validation: epoch" not in screen
    log = (root / "tty" / "fit.log").read_text()
    assert log.count("Train: epoch") == 8 and log.count("Validation: epoch") == 4
    assert log.count(TEST_WARNING) == 1


def test_without_a_terminal_progress_lines_are_printed_and_the_log_is_the_same(terminal_and_pipe):
    root, _, output = terminal_and_pipe
    assert "%|" not in output  # no bar in a pipe
    assert output.count("Train: epoch 1/2 [") == 4 and output.count("Validation: epoch 2/2 [") == 2
    assert output.count(TEST_WARNING) == 1 and "No ccache found" not in output
    tty_log = comparable((root / "tty" / "fit.log").read_text(), root / "tty")
    pipe_log = comparable((root / "pipe" / "fit.log").read_text(), root / "pipe")
    assert tty_log == pipe_log


def test_epoch_line_end_table_and_summary_json_show_one_throughput(terminal_and_pipe):
    root, _, output = terminal_and_pipe
    summary = json.loads((root / "pipe" / "summary.json").read_text())
    table = re.search(r"training +([\d.]+) img/s \((\d+) images in", output)
    assert table and float(table.group(1)) == round(summary["train/throughput"], 1)
    assert int(table.group(2)) == summary["train/images"] == 128
    assert summary["train/throughput"] == pytest.approx(summary["train/images"] / summary["train/step_seconds"])
    # The run's figure is the images over the time of both epochs' steps: between the two epochs' figures.
    epochs = [float(x) for x in re.findall(r"Epoch \d/2 \|.*\| train ([\d.]+) img/s \| wall", output)]
    assert len(epochs) == 2
    assert min(epochs) - 0.05 <= summary["train/throughput"] <= max(epochs) + 0.05
    assert summary["wall_seconds"] > summary["train/step_seconds"]  # validation and checkpoints are not steps


# ---------------------------------------------------------------------------------------------- unit level
def test_known_warnings_are_dropped_and_others_shown_once():
    with warnings.catch_warnings(record=True) as caught:
        warnings.resetwarnings()
        install_warning_filters()
        for known in KNOWN_WARNINGS:
            for _ in range(3):
                warnings.warn_explicit(known.message + " (rest of the text)", known.category, "paddle/x.py", 1)
        for line in (10, 20, 30):  # the same text from three places: one warning
            warnings.warn_explicit("something real", UserWarning, "user.py", line)
        warnings.warn_explicit("something else", RuntimeWarning, "user.py", 40)
    assert [str(w.message) for w in caught] == ["something real", "something else"]


def test_a_warning_is_one_log_line(caplog):
    previous = warnings.showwarning
    try:
        route_warnings_to_log()
        with caplog.at_level(logging.WARNING, logger="py.warnings"), warnings.catch_warnings():
            warnings.simplefilter("always")
            warnings.warn_explicit("two\n  lines", UserWarning, "/some/where/module.py", 7)
    finally:
        warnings.showwarning = previous
    assert [r.getMessage() for r in caplog.records] == ["UserWarning: two lines (module.py:7)"]
    assert warning_line("x", DeprecationWarning, "a/b.py", 3) == "DeprecationWarning: x (b.py:3)"


def test_above_bar_writes_log_lines_above_the_bar_and_keeps_file_only_lines_off_the_console(
        tmp_path, monkeypatch):
    terminal = io.StringIO()
    monkeypatch.setattr(sys, "stdout", terminal)
    logger = logging.getLogger("tests.console.above_bar")
    logger.propagate = False
    console = logging.StreamHandler(sys.stdout)
    log_file = logging.FileHandler(tmp_path / "run.log")
    logger.handlers = [console, log_file]
    logger.setLevel(logging.INFO)
    bar = tqdm(total=10, file=sys.stdout, mininterval=0, desc="Epoch 1/1", ascii=True)
    try:
        with above_bar((logger,)):
            bar.update(3)
            logger.info("epoch line")
            logger.info("progress line", extra=FILE_ONLY)
            bar.update(3)
        assert logger.handlers == [console, log_file]  # restored, in order
    finally:
        bar.close()
        log_file.close()
    segments = [s for s in re.split(r"[\r\n]", terminal.getvalue()) if s.strip()]
    assert "epoch line" in segments  # a line of its own, not glued to a bar
    assert "progress line" not in terminal.getvalue()
    assert (tmp_path / "run.log").read_text().splitlines() == ["epoch line", "progress line"]


def test_above_bar_routes_python_warnings_above_the_bar(monkeypatch):
    terminal = io.StringIO()
    monkeypatch.setattr(sys, "stderr", terminal)
    monkeypatch.setattr(warnings, "showwarning", console._DEFAULT_SHOWWARNING)  # Python's own hook, not pytest's
    bar = tqdm(total=4, file=sys.stderr, mininterval=0, ascii=True)
    try:
        with warnings.catch_warnings(), above_bar(()):
            warnings.simplefilter("always")
            bar.update(1)
            warnings.warn("plain warning", UserWarning, stacklevel=1)
            bar.update(1)
    finally:
        bar.close()
    lines = re.split(r"[\r\n]", terminal.getvalue())
    assert any(line.endswith("UserWarning: plain warning") for line in lines)
    assert not any("%|" in line and "Warning" in line for line in lines)


@pytest.mark.slow  # 23 s; tests/test_cli.py checks the continue command's words
# ---------------------------------------------------------------------------------------------- continuing
def test_stop_hint_is_the_exact_command_that_continues_the_same_run(tmp_path):
    run_dir = tmp_path / "run dir"  # a space: the printed command must quote it
    args = ["data.shapes.num_train=256", "data.shapes.num_val=32", "data.image_size=16", "data.batch_size=16",
            "trainer.max_epochs=3", "optim.lr=0.002", "name=my run", "trainer.cpu_threads=1",
            "callbacks.visualdl=null", f"hydra.run.dir={run_dir}"]
    proc = subprocess.Popen([sys.executable, "-m", "paddletrain.fit", *args], cwd=tmp_path, env=fit_env(),
                            stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    lines = []
    for line in proc.stdout:  # stop during the second epoch, once the first one saved its checkpoint
        lines.append(line)
        if "Saved checkpoint" in line:
            proc.send_signal(signal.SIGINT)
            break
    lines += proc.stdout.readlines()
    assert proc.wait(timeout=120) == 130, "".join(lines)[-3000:]
    hint = next(line for line in lines if "Continue with: " in line).split("Continue with: ", 1)[1].strip()
    command = shlex.split(hint)
    assert command[:3] == ["python", "-m", "paddletrain.fit"]
    # The run's overrides, then how to continue it; nothing else.
    assert command[3:] == [*args[:-1], "trainer.resume=auto", f"hydra.run.dir={run_dir}"]

    resumed = subprocess.run([sys.executable, *command[1:]], cwd=tmp_path, env=fit_env(), capture_output=True,
                             text=True, timeout=300)
    output = resumed.stdout + resumed.stderr
    assert resumed.returncode == 0, output[-3000:]
    assert "Resumed from" in output and "differs from the one it was trained with" not in output
    assert json.loads((run_dir / "summary.json").read_text())["epochs"] == 3

    # The hint of old (the same command plus resume, missing overrides) changes the run: said in one line.
    changed = subprocess.run([sys.executable, "-m", "paddletrain.fit", *args[:4], "trainer.max_epochs=4",
                              "callbacks.visualdl=null", "trainer.resume=auto", f"hydra.run.dir={run_dir}"],
                             cwd=tmp_path, env=fit_env(), capture_output=True, text=True, timeout=300)
    output = changed.stdout + changed.stderr
    assert changed.returncode == 0, output[-3000:]
    [warning] = [line for line in output.splitlines() if "differs from the one it was trained with" in line]
    assert warning.endswith("with a config that differs from the one it was trained with: "
                            "optim.lr=0.003 (checkpoint: 0.002), trainer.max_epochs=4 (checkpoint: 3)"), warning


# ---------------------------------------------------------------------------------------------- failed starts
def test_a_failed_start_leaves_no_run_directory(tmp_path):
    run_dir = tmp_path / "outputs" / "run"
    result = run_piped(["data=imagefolder", f"data.root={tmp_path / 'missing'}", f"hydra.run.dir={run_dir}"],
                       cwd=tmp_path)
    assert result.returncode == 2, result.stdout[-3000:]
    assert "data.root" in result.stdout and f"removed the run directory {run_dir}" in result.stdout
    # Nor the parents it created: outputs/<name>/ of outputs/<name>/<time>.
    assert not (tmp_path / "outputs").exists() and "Traceback" not in result.stdout


def test_a_failed_start_keeps_a_directory_that_was_there_before(tmp_path):
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    (run_dir / "notes.txt").write_text("mine")
    result = run_piped([*RUN[:4], "model.num_classes=3", f"hydra.run.dir={run_dir}"], cwd=tmp_path)
    assert result.returncode == 2 and "model.num_classes=3" in result.stdout, result.stdout[-3000:]
    assert (run_dir / "notes.txt").read_text() == "mine" and "removed" not in result.stdout
