"""One run directory, one writer: a second `fit` on a busy run directory is refused at once, naming the
directory and the holder's pid; a lock left by a killed run never blocks the next one."""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from paddletrain.errors import UserError
from paddletrain.job.rundir import (
    LOCK_FILE,
    held_run_dir,
    hold_run_dir,
    holding_run_dir,
    release_run_dir,
    wait_until_free,
)
from tests.conftest import TINY, run_module

# Enough epochs that the first run is still training while the second one starts; it is killed anyway.
LONG = [*TINY, "trainer.max_epochs=10000", "callbacks.visualdl=null"]

HOLD_SCRIPT = """
import sys, time
from paddletrain.job.rundir import hold_run_dir
hold_run_dir(sys.argv[1])
print("held", flush=True)
time.sleep(600)
"""


def start(args, cwd):
    env = dict(os.environ, PYTHONWARNINGS="ignore", HYDRA_FULL_ERROR="0")
    return subprocess.Popen([sys.executable, *args], cwd=cwd, env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True, start_new_session=True)


def wait_for_holder(run_dir: Path, pid: int, timeout: float = 120) -> None:
    """Until the lock file names ``pid``: that process holds the directory."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            if json.loads((run_dir / LOCK_FILE).read_text())["pid"] == pid:
                return
        except (OSError, ValueError, KeyError):
            pass
        time.sleep(0.2)
    raise AssertionError(f"pid {pid} never took the lock on {run_dir}")


def wait_for(predicate, timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return
        time.sleep(0.2)
    raise AssertionError(f"timed out waiting for {what}")


def stop(proc: subprocess.Popen, sig: int = signal.SIGKILL) -> str:
    if proc.poll() is None:
        os.killpg(proc.pid, sig)
    out, _ = proc.communicate(timeout=120)
    return out


@pytest.fixture(autouse=True)
def no_lock_left_in_this_process():
    yield
    release_run_dir()


def test_a_held_directory_is_refused_to_another_process_naming_the_holder(tmp_path):
    hold_run_dir(tmp_path)
    other = subprocess.run([sys.executable, "-c", "import sys\nfrom paddletrain.job.rundir import hold_run_dir\n"
                            "try:\n    hold_run_dir(sys.argv[1])\nexcept Exception as exc:\n    print(exc)\n"
                            "    sys.exit(2)", str(tmp_path)], capture_output=True, text=True, timeout=120,
                           env=dict(os.environ, PYTHONWARNINGS="ignore"))
    assert other.returncode == 2
    assert f"run directory {tmp_path.resolve()} is in use" in other.stdout and f"pid {os.getpid()} " in other.stdout


def test_waiting_for_a_run_directory_ends_when_its_holder_has_gone(tmp_path):
    assert wait_until_free(tmp_path / "never_run", timeout=0)  # no lock file: free
    holder = start(["-c", HOLD_SCRIPT, str(tmp_path)], tmp_path)
    try:
        assert holder.stdout.readline().strip() == "held"
        started = time.monotonic()
        assert not wait_until_free(tmp_path, timeout=0.5, poll=0.1)  # held: gives up after its timeout
        assert time.monotonic() - started >= 0.5
        killer = subprocess.Popen([sys.executable, "-c", f"import os, signal, time; time.sleep(0.5); "
                                           f"os.kill({holder.pid}, signal.SIGKILL)"])
        assert wait_until_free(tmp_path, timeout=60, poll=0.05)  # free once the holder is killed
        killer.wait(timeout=60)
    finally:
        holder.kill()
        holder.wait()


def test_holding_is_idempotent_and_the_context_releases_only_what_it_took(tmp_path):
    first, second = tmp_path / "a", tmp_path / "b"
    lock = hold_run_dir(first)
    assert hold_run_dir(first) is lock and held_run_dir() == first.resolve()
    with holding_run_dir(first):  # already held: stays held afterwards
        pass
    assert held_run_dir() == first.resolve()
    with holding_run_dir(second):  # a process writes one run directory: taking b gives up a
        assert held_run_dir() == second.resolve()
    assert held_run_dir() is None
    assert json.loads((second / LOCK_FILE).read_text())["pid"] == os.getpid()


@pytest.mark.parametrize("plant", ["symlink", "fifo"])
def test_a_planted_lock_file_is_refused_without_touching_its_target(tmp_path, plant):
    victim = tmp_path / "victim.txt"
    victim.write_text("precious")
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    if plant == "symlink":
        (run_dir / LOCK_FILE).symlink_to(victim)
    else:
        os.mkfifo(run_dir / LOCK_FILE)
    with pytest.raises(UserError, match=LOCK_FILE.replace(".", r"\.")):
        hold_run_dir(run_dir)
    assert victim.read_text() == "precious"


def test_second_fit_is_refused_and_a_killed_holder_does_not_block_the_next_run(tmp_path):
    run_dir = tmp_path / "run"
    first = start(["-m", "paddletrain.fit", *LONG, f"hydra.run.dir={run_dir}"], tmp_path)
    try:
        wait_for_holder(run_dir, first.pid)
        # The lock is taken before Hydra writes .hydra/: wait for the holder's config too.
        overrides = run_dir / ".hydra" / "overrides.yaml"
        wait_for(lambda: overrides.is_file() and overrides.stat().st_size > 0, 60, "the first run's overrides.yaml")
        saved_config = overrides.read_text()
        started = time.monotonic()
        second = run_module("paddletrain.fit", [*TINY, f"hydra.run.dir={run_dir}"], cwd=tmp_path, timeout=120)
        assert second.returncode == 2, second.stdout + second.stderr
        lines = [line for line in second.stderr.splitlines() if line.strip()]
        assert len(lines) == 1 and "Traceback" not in second.stdout + second.stderr, second.stderr
        assert f"run directory {run_dir} is in use" in lines[0] and f"pid {first.pid} " in lines[0]
        assert time.monotonic() - started < 60  # refused at start-up, not after waiting for the holder
        # The refused run wrote nothing, not even its own config over the running one's.
        assert (run_dir / ".hydra" / "overrides.yaml").read_text() == saved_config
        assert first.poll() is None
        wait_for(lambda: any((run_dir / "checkpoints").glob("epoch*")), 120, "the first run's checkpoint")
    finally:
        stop(first, signal.SIGKILL)
    assert first.returncode == -signal.SIGKILL
    # The lock file still names the dead process; only a live holder counts.
    assert json.loads((run_dir / LOCK_FILE).read_text())["pid"] == first.pid
    third = run_module("paddletrain.fit", [*TINY, "trainer.resume=auto", f"hydra.run.dir={run_dir}"], cwd=tmp_path,
                       timeout=300)
    assert third.returncode == 0, third.stdout[-2000:] + third.stderr[-2000:]
    assert "Summary:" in third.stdout + third.stderr


@pytest.mark.slow  # 24 s; the lock itself is tested in one process
def test_the_launcher_of_a_two_process_run_holds_the_directory_for_its_ranks(tmp_path):
    run_dir = tmp_path / "run"
    launcher = start(["-m", "paddletrain.fit", *LONG, "trainer.devices=2", f"hydra.run.dir={run_dir}"], tmp_path)
    try:
        wait_for_holder(run_dir, launcher.pid)
        # The ranks train (rank 0 writes checkpoints) while their launcher holds the lock: no deadlock.
        wait_for(lambda: any((run_dir / "checkpoints").glob("epoch*")), 180, "a checkpoint of the two ranks")
        other = run_module("paddletrain.fit", [*TINY, f"hydra.run.dir={run_dir}"], cwd=tmp_path, timeout=120)
        assert other.returncode == 2 and f"pid {launcher.pid} " in other.stderr, other.stdout + other.stderr
        assert launcher.poll() is None
    finally:
        out = stop(launcher, signal.SIGTERM)
    assert launcher.returncode is not None, out
    hold_run_dir(run_dir)  # released: the launcher is gone


def test_a_run_directory_that_cannot_be_made_is_one_clear_error(tmp_path):
    (tmp_path / "file").write_text("not a directory")
    with pytest.raises(UserError, match=r"cannot open the run directory lock .*file/run/\.paddletrain\.lock"):
        hold_run_dir(tmp_path / "file" / "run")
