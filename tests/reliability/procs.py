"""Real processes for the reliability tests: start `python -m paddletrain.fit`, watch its output and process tree,
signal or kill it, and check that nothing is left behind."""
from __future__ import annotations

import os
import re
import socket
import subprocess
import sys
import time
from pathlib import Path

import psutil

from tests.conftest import TINY

# Lines that say something went wrong in a way a user should never see for an intentional stop.
NOISE = ("Traceback", "LAUNCH ERROR", "Container failed", "FatalError", "KeyboardInterrupt")


class Run:
    """One `python -m paddletrain.fit` in its own session (as a terminal would start it), output in a file."""

    def __init__(self, tmp_path: Path, *args: str, name: str = "run", run_dir: Path | None = None,
                 tiny: bool = True) -> None:
        self.run_dir = run_dir or tmp_path / name
        self.log = tmp_path / f"{name}.out"
        self.args = [*(TINY if tiny else []), *args, f"hydra.run.dir={self.run_dir}"]
        env = dict(os.environ, PYTHONWARNINGS="ignore", HYDRA_FULL_ERROR="0")
        with open(self.log, "w") as out:
            self.proc = subprocess.Popen([sys.executable, "-m", "paddletrain.fit", *self.args], cwd=tmp_path,
                                         stdout=out, stderr=subprocess.STDOUT, env=env, start_new_session=True)
        self.started = time.monotonic()
        self.seen: dict[int, psutil.Process] = {}

    @property
    def output(self) -> str:
        return self.log.read_text(errors="replace")

    def watch(self) -> None:
        """Remember every process of the tree (they come and go: loader workers start every epoch)."""
        try:
            root = psutil.Process(self.proc.pid)
            for process in [root, *root.children(recursive=True)]:
                self.seen.setdefault(process.pid, process)
        except psutil.NoSuchProcess:
            pass

    def wait_for(self, pattern: str, timeout: float = 120.0) -> None:
        """Until ``pattern`` (a regex) appears in the output, watching the process tree meanwhile."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            self.watch()
            if re.search(pattern, self.output):
                return
            if self.proc.poll() is not None:
                raise AssertionError(f"exited {self.proc.returncode} before {pattern!r}:\n{self.output[-3000:]}")
            time.sleep(0.05)
        raise AssertionError(f"no {pattern!r} within {timeout} s:\n{self.output[-3000:]}")

    def signal(self, signum: int, group: bool = False) -> float:
        """Send ``signum`` (to the whole process group, like a terminal's Ctrl-C, with ``group``); returns when."""
        self.watch()
        (os.killpg if group else os.kill)(self.proc.pid, signum)
        return time.monotonic()

    def wait(self, timeout: float = 120.0) -> int:
        try:
            return self.proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            raise AssertionError(f"still running after {timeout} s:\n{self.output[-3000:]}") from None

    def survivors(self, timeout: float) -> list[str]:
        """Processes of the tree still alive after up to ``timeout`` seconds (killed before returning)."""
        deadline = time.monotonic() + timeout
        alive = list(self.seen.values())
        while True:
            alive = [p for p in alive if _alive(p)]
            if not alive or time.monotonic() > deadline:
                break
            time.sleep(0.1)
        described = [f"{p.pid} {' '.join(_cmdline(p))[:120]}" for p in alive]
        for process in alive:
            process.kill()
        return described

    def kill(self) -> None:
        """Test clean-up: nothing of this run may outlive the test, whatever it asserted."""
        self.watch()
        for process in self.seen.values():
            if _alive(process):
                process.kill()


def _alive(process: psutil.Process) -> bool:
    try:
        return process.is_running() and process.status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


def _cmdline(process: psutil.Process) -> list[str]:
    try:
        return process.cmdline()
    except psutil.Error:
        return []


def rank_pid(run: Run, rank: int) -> int:
    """The pid of global rank ``rank`` among the run's processes (not one of its loader workers: they inherit its
    environment and command line, but their parent is the rank)."""
    candidates = {}
    for process in run.seen.values():
        try:
            if process.environ().get("PADDLE_TRAINER_ID") == str(rank) and any(
                    arg.endswith("fit.py") for arg in process.cmdline()):
                candidates[process.pid] = process.ppid()
        except psutil.Error:
            continue
    ranks = [pid for pid, parent in candidates.items() if parent not in candidates]
    assert len(ranks) == 1, (rank, candidates, sorted(run.seen))
    return ranks[0]


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def count_lines(text: str, pattern: str) -> int:
    return sum(1 for line in text.splitlines() if re.search(pattern, line))


def assert_clean(output: str) -> None:
    for noise in NOISE:
        assert noise not in output, output[-4000:]

