"""What a crash or a full disk leaves on disk: resume finds the newest complete checkpoint, nothing saved is lost.

Crashes are real process deaths: a forked child runs ``save_checkpoint`` and calls ``os._exit`` at one step
of the save sequence (no ``finally``, no cleanup runs), leaving exactly what a ``kill -9`` there would.
A full disk is simulated by raising ``ENOSPC`` at each write, and for real with a small tmpfs.
"""
from __future__ import annotations

import errno
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from safetensors import SafetensorError

from paddletrain.checkpoint import (
    CheckpointError,
    CheckpointManager,
    _fs,
    find_latest,
    is_complete,
    load_checkpoint,
    retention,
    save_checkpoint,
    storage,
    tensors,
)
from paddletrain.checkpoint.storage import MANIFEST, STATE, recover_interrupted_saves
from tests.conftest import TINY
from tests.reliability.checkpoint_craft import assert_one_error_line, fit_cli, output

CRASHED = 137


def _state(version: int) -> dict:
    return {"weights": np.full(1000, version, dtype=np.float32), "version": version}


def _version(path: Path) -> int:
    return load_checkpoint(path).state["version"]


def _crash_at(point: str, directory: Path, version: int) -> None:
    """Save ``_state(version)`` to ``directory`` in a child process that dies right after ``point``."""
    pid = os.fork()
    if pid == 0:  # the child: hook the step, save, and never return into pytest
        try:
            def die() -> None:
                os._exit(CRASHED)

            real_write, real_tensors, real_replace = storage.write_bytes_durably, storage.write_tensors, os.replace
            replaced = []

            def write(path, data):
                real_write(path, data)
                if Path(path).name == {"state written": STATE, "manifest written": MANIFEST}.get(point):
                    die()

            def write_tensors(arrays, path):
                real_tensors(arrays, path)
                if point == "tensors written":
                    die()

            def replace(src, dst):
                real_replace(src, dst)
                replaced.append(dst)
                if point == "old parked" and len(replaced) == 1 or point == "new in place" and Path(dst) == directory:
                    die()

            storage.write_bytes_durably, storage.write_tensors = write, write_tensors
            storage.os.replace = replace
            save_checkpoint(directory, _state(version), {"global_step": version})
        finally:
            os._exit(0)  # the save finished without reaching the crash point: the parent fails the test
    _, status = os.waitpid(pid, 0)
    assert os.WIFEXITED(status) and os.WEXITSTATUS(status) == CRASHED, f"the save never reached {point!r}"


def _visible(root: Path) -> list[str]:
    return sorted(p.name for p in root.iterdir())


# (crash point, save v2 over "a" or as a new "b") -> the version resume must pick
CRASH_STATES = [
    ("tensors written", "a", 1), ("state written", "a", 1), ("manifest written", "a", 2),
    ("old parked", "a", 2), ("new in place", "a", 2),
    ("tensors written", "b", 1), ("manifest written", "b", 2), ("new in place", "b", 2),
]


@pytest.mark.parametrize("point, name, newest", CRASH_STATES, ids=[f"{p} ({n})" for p, n, _ in CRASH_STATES])
def test_resume_finds_the_newest_complete_checkpoint_whatever_a_crash_left(tmp_path, point, name, newest):
    root = tmp_path / "checkpoints"
    save_checkpoint(root / "a", _state(1), {"global_step": 1})
    _crash_at(point, root / name, version=2)

    found = find_latest(root)
    assert found is not None and _version(found) == newest
    # The next save puts the directory right: each name holds its newest complete version, nothing hidden.
    save_checkpoint(root / "c", _state(3), {"global_step": 3})
    expected = {"a": 2 if name == "a" and newest == 2 else 1, "c": 3}
    if name == "b" and newest == 2:
        expected["b"] = 2
    assert _visible(root) == sorted(expected)
    assert {n: _version(root / n) for n in expected} == expected
    assert all(is_complete(root / n, verify=True) for n in expected)


def test_a_parked_checkpoint_that_is_the_only_complete_one_is_found_and_restored(tmp_path):
    root = tmp_path / "checkpoints"
    save_checkpoint(root / "a", _state(1), {"global_step": 1})
    _crash_at("old parked", root / "a", version=2)
    # The in-flight copy did not survive (e.g. its data never reached the disk): only .old-a-* is complete.
    in_flight = next(p for p in root.iterdir() if p.name.startswith(".tmp-"))
    (in_flight / MANIFEST).unlink()
    parked = find_latest(root)
    assert parked is not None and parked.name.startswith(".old-a-") and _version(parked) == 1
    recover_interrupted_saves(root)
    assert _visible(root) == ["a"] and _version(root / "a") == 1


def test_resume_auto_continues_from_a_parked_checkpoint_through_the_cli(tmp_path):
    run_dir = tmp_path / "run"
    first = fit_cli(run_dir)
    assert first.returncode == 0, output(first)[-3000:]
    checkpoints = run_dir / "checkpoints"
    saved = find_latest(checkpoints)
    parked = checkpoints / f".old-{saved.name}-0badc0de"
    os.replace(saved, parked)  # what a crash between the two renames of an overwrite leaves
    in_flight = checkpoints / f".tmp-{saved.name}-0ddba11"
    in_flight.mkdir()
    (in_flight / "tensors.safetensors").write_bytes(b"partial")

    result = fit_cli(run_dir, "trainer.max_epochs=2", "trainer.resume=auto")

    text = output(result)
    assert result.returncode == 0, text[-3000:]
    assert f"Resumed from {parked} at epoch 1, batch 0, global step 4" in text and "starting fresh" not in text
    assert not [p for p in checkpoints.iterdir() if p.name.startswith(".")]  # restored or removed by the save
    assert load_checkpoint(find_latest(checkpoints)).state["progress"]["global_step"] == 8


# --------------------------------------------------------------------------------------------- a full disk
def _no_space(*_args, **_kwargs):
    raise OSError(errno.ENOSPC, "No space left on device")


WRITE_POINTS = ["temporary directory", "tensors", "tensors (safetensors' own error)", "tensors fsync",
                "state.json", "manifest.json", "rename into place", "pointer"]


def _fill_disk_at(point: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """Make the save's write at ``point`` (one of :data:`WRITE_POINTS`) fail as a full disk does."""
    real_write, real_mkdir, real_replace = storage.write_bytes_durably, Path.mkdir, os.replace

    def write(path, data):
        if Path(path).name == point:
            _no_space()
        real_write(path, data)

    def mkdir(self, *args, **kwargs):
        if self.name.startswith(".tmp-"):
            _no_space()
        real_mkdir(self, *args, **kwargs)

    def replace(src, dst):
        if Path(src).name.startswith(".tmp-"):
            _no_space()
        real_replace(src, dst)

    def safetensors_full(arrays, path):
        raise SafetensorError("Error while serializing: I/O error: No space left on device (os error 28)")

    faults = {
        "temporary directory": (Path, "mkdir", mkdir),
        "tensors": (storage, "write_tensors", _no_space),
        "tensors (safetensors' own error)": (tensors.safetensors.numpy, "save_file", safetensors_full),
        "tensors fsync": (tensors, "fsync_file", _no_space),
        STATE: (storage, "write_bytes_durably", write),
        MANIFEST: (storage, "write_bytes_durably", write),
        "rename into place": (storage.os, "replace", replace),
        "pointer": (retention, "replace_json_atomically", _no_space),
    }
    assert set(faults) == set(WRITE_POINTS)
    monkeypatch.setattr(*faults[point])


@pytest.mark.parametrize("point", WRITE_POINTS)
@pytest.mark.parametrize("target", ["b", "a"], ids=["new name", "overwrite"])
def test_full_disk_at_each_write_is_one_line_and_keeps_the_previous_checkpoint(tmp_path, monkeypatch, point,
                                                                               target):
    root = tmp_path / "checkpoints"
    manager = CheckpointManager(root, keep_last=1, keep_best=0)
    manager.save(_state(1), name="a", metadata={"global_step": 1})
    _fill_disk_at(point, monkeypatch)

    with pytest.raises(CheckpointError) as raised:
        manager.save(_state(2), name=target, metadata={"global_step": 2})
    monkeypatch.undo()

    message = str(raised.value)
    written = root / ("latest.json" if point == "pointer" else target)
    assert message.startswith(f"cannot write {'checkpoint pointer' if point == 'pointer' else 'checkpoint'} "
                              f"{written}: no space left on the device (") and "\n" not in message
    assert f"free on {root}" in message  # shutil.disk_usage of the checkpoint directory's file system
    assert not [p for p in root.iterdir() if p.name.startswith(".")]
    if point == "pointer":  # the new checkpoint is complete; nothing was pruned, so the old one stays too
        assert _version(root / target) == 2 and is_complete(root / target, verify=True)
        if target == "b":
            assert _version(root / "a") == 1
    else:
        assert _visible(root) == ["a", "best.json", "latest.json"] or _visible(root) == ["a", "latest.json"]
        assert _version(root / "a") == 1 and is_complete(root / "a", verify=True)


def test_free_space_is_measured_with_disk_usage(tmp_path, monkeypatch):
    usage = shutil.disk_usage(tmp_path)._replace(free=12 * 1024 * 1024)
    monkeypatch.setattr(_fs.shutil, "disk_usage", lambda path: usage)
    error = _fs.write_error(tmp_path / "x", OSError(errno.ENOSPC, "No space left on device"))
    assert str(error) == f"cannot write checkpoint {tmp_path / 'x'}: no space left on the device (12.0 MiB free " \
                         f"on {tmp_path})"


def _can_mount_tmpfs(where: Path) -> str | None:
    """None when a private tmpfs can be mounted (a mount namespace of our own), else why not."""
    if sys.platform != "linux" or shutil.which("unshare") is None:
        return "needs Linux and unshare(1)"
    probe = subprocess.run(["unshare", "-m", "sh", "-c", f"mount -t tmpfs -o size=1m tmpfs {where}"],
                           capture_output=True, text=True)
    return None if probe.returncode == 0 else f"mounting a tmpfs is not permitted here: {probe.stderr.strip()}"


VERIFY = """
import json, sys
from pathlib import Path
from paddletrain.checkpoint import find_latest, is_complete, load_checkpoint
root = Path(sys.argv[1])
latest = find_latest(root)
print("VERIFY " + json.dumps({"entries": sorted(p.name for p in root.iterdir()), "latest": latest and latest.name,
      "complete": bool(latest) and is_complete(latest, verify=True),
      "step": latest and load_checkpoint(latest).state["progress"]["global_step"]}))
"""


def test_a_real_full_disk_through_the_cli(tmp_path):
    run_dir = tmp_path / "run"
    checkpoints = run_dir / "checkpoints"
    checkpoints.mkdir(parents=True)
    reason = _can_mount_tmpfs(checkpoints)
    if reason:
        pytest.skip(reason)
    fit = [sys.executable, "-m", "paddletrain.fit", *TINY, "trainer.max_epochs=2", f"hydra.run.dir={run_dir}"]
    # A 5 MiB tmpfs on <run>/checkpoints only (the logs stay writable): one 3.4 MB checkpoint fits, two do not.
    script = (f"mount -t tmpfs -o size=5m tmpfs {checkpoints} && "
              f"{subprocess.list2cmdline(fit)}; echo FIT_EXIT=$?; "
              f"{subprocess.list2cmdline([sys.executable, '-c', VERIFY, str(checkpoints)])}")
    env = dict(os.environ, PYTHONWARNINGS="ignore", HYDRA_FULL_ERROR="0")
    result = subprocess.run(["unshare", "-m", "sh", "-c", script], cwd=tmp_path, env=env, capture_output=True,
                            text=True, timeout=300)
    text = result.stdout + result.stderr
    fit_exit = int(text.split("FIT_EXIT=")[1].split()[0])
    verify = json.loads(next(line for line in result.stdout.splitlines() if line.startswith("VERIFY "))[7:])
    fit_part = subprocess.CompletedProcess(result.args, fit_exit, result.stdout.split("FIT_EXIT=")[0],
                                           result.stderr)
    assert_one_error_line(fit_part, f"cannot write checkpoint {checkpoints}/epoch0001-step0000008: no space left on "
                                    "the device (", f"free on {checkpoints})")
    assert verify == {"entries": ["best.json", "epoch0000-step0000004", "latest.json"],
                      "latest": "epoch0000-step0000004", "complete": True, "step": 4}
