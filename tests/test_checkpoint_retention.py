"""CheckpointManager retention (last N, best K, protected), pointers, resume state; check_writable."""
from __future__ import annotations

import json
import math
import os

import numpy as np
import pytest

from paddletrain.checkpoint import CheckpointError, CheckpointManager, check_writable, load_checkpoint, read_pointer


def _save(manager, epoch, metric):
    state = {"weights": np.full(3, epoch, np.float32), "manager": manager.state_dict()}
    return manager.save(state, metadata={"epoch": epoch, "global_step": (epoch + 1) * 10}, metric=metric)


def _names(root):
    return sorted(p.name for p in root.iterdir() if p.is_dir())


def _epochs(root):
    return sorted(int(name.split("-")[0][len("epoch"):]) for name in _names(root))


def test_six_epochs_keep_last_two_best_one_and_the_protected_one(tmp_path):
    metrics = [0.1, 0.5, math.nan, 0.3, None, 0.2]
    first = CheckpointManager(tmp_path, keep_last=2, keep_best=1, monitor="val/top1", mode="max")
    after = []
    paths = []
    for epoch in range(3):
        paths.append(_save(first, epoch, metrics[epoch]))
        after.append(_epochs(tmp_path))
    assert paths[0].name == "epoch0000-step0000010"
    assert after == [[0], [0, 1], [1, 2]]  # 0.1 is neither last-2 nor best once 0.5 arrives

    # A new process resumes from epoch 2: the state saved in it predates epoch 2's own record.
    resumed = load_checkpoint(paths[2]).state
    second = CheckpointManager(tmp_path, keep_last=2, keep_best=1, monitor="val/top1", mode="max")
    second.load_state_dict(resumed["manager"])
    second.protect(paths[2])
    for epoch in range(3, 6):
        _save(second, epoch, metrics[epoch])
        after.append(_epochs(tmp_path))
    # epoch 2 (NaN) is protected; epoch 1 (0.5) stays the best; 3 (0.3) goes once it is not among the last 2.
    assert after[3:] == [[1, 2, 3], [1, 2, 3, 4], [1, 2, 4, 5]]
    assert second.best_path.name == "epoch0001-step0000020" == read_pointer(tmp_path, "best").name
    assert second.last_path.name == "epoch0005-step0000060" == read_pointer(tmp_path, "latest").name
    best = json.loads((tmp_path / "best.json").read_text())
    assert best["metric"] == 0.5 and best["global_step"] == 20
    assert load_checkpoint(second.best_path).metadata["metric"] == 0.5


def test_min_mode_nan_is_worst_and_no_best_without_a_finite_metric(tmp_path):
    manager = CheckpointManager(tmp_path, keep_last=1, keep_best=1, monitor="val/loss", mode="min")
    _save(manager, 0, math.nan)
    assert manager.best_path is None and not (tmp_path / "best.json").exists()
    for epoch, loss in [(1, 3.0), (2, 1.0), (3, 2.0), (4, math.nan)]:
        _save(manager, epoch, loss)
    assert _epochs(tmp_path) == [2, 4]
    assert read_pointer(tmp_path, "best").name.startswith("epoch0002")


def test_keep_best_two_and_ties_keep_the_earlier(tmp_path):
    manager = CheckpointManager(tmp_path, keep_last=1, keep_best=2, monitor="acc")
    for epoch, acc in enumerate([0.7, 0.9, 0.7, 0.1]):
        _save(manager, epoch, acc)
    assert _epochs(tmp_path) == [0, 1, 3]  # epoch 0 reached 0.7 before epoch 2 did


def test_without_monitor_only_the_last_are_kept(tmp_path):
    manager = CheckpointManager(tmp_path, keep_last=2, keep_best=3, monitor=None)
    for epoch in range(4):
        _save(manager, epoch, float(10 - epoch))
    assert _epochs(tmp_path) == [2, 3] and manager.best_path is None


def test_manager_state_round_trip_continues_pruning(tmp_path):
    manager = CheckpointManager(tmp_path, keep_last=1, keep_best=1, monitor="acc")
    for epoch, acc in enumerate([0.9, 0.2, 0.3]):
        _save(manager, epoch, acc)
    state = manager.state_dict()
    assert json.loads(json.dumps(state)) == state  # plain data: storable in any checkpoint
    restored = CheckpointManager(tmp_path, keep_last=1, keep_best=1, monitor="acc")
    restored.load_state_dict(state)
    assert restored.best_path == manager.best_path and restored.last_path == manager.last_path
    _save(restored, 3, 0.95)  # new best: the old best (epoch 0) and old last (epoch 2) are pruned
    assert _epochs(tmp_path) == [3]


def test_load_state_dict_drops_deleted_and_rejects_paths_outside_root(tmp_path):
    manager = CheckpointManager(tmp_path, keep_last=2, monitor="acc")
    gone = _save(manager, 0, 0.1)
    _save(manager, 1, 0.2)
    state = manager.state_dict()
    for item in (gone / "tensors.safetensors", gone / "state.json", gone / "manifest.json"):
        item.unlink()
    gone.rmdir()
    restored = CheckpointManager(tmp_path, keep_last=2, monitor="acc")
    restored.load_state_dict(state)
    assert [r["name"] for r in restored.state_dict()["records"]] == ["epoch0001-step0000020"]

    outside = tmp_path.parent / f"{tmp_path.name}-victim"
    outside.mkdir()
    state["records"][0]["name"] = f"../{outside.name}"
    with pytest.raises(CheckpointError, match=r"records\[0\]\.name .*expected a plain name"):
        restored.load_state_dict(state)
    assert outside.is_dir()


def test_save_requires_a_global_step_and_validates_arguments(tmp_path):
    manager = CheckpointManager(tmp_path)
    with pytest.raises(ValueError, match="global_step"):
        manager.save({"x": 1}, metadata={"epoch": 1})
    with pytest.raises(ValueError, match="keep_last must be >= 1"):
        CheckpointManager(tmp_path, keep_last=0)
    with pytest.raises(ValueError, match="mode must be 'max' or 'min'"):
        CheckpointManager(tmp_path, mode="maximum")


def test_check_writable_creates_the_directory_and_leaves_nothing(tmp_path):
    root = check_writable(tmp_path / "run" / "checkpoints")
    assert root.is_dir() and list(root.iterdir()) == []


def test_check_writable_under_a_file_names_the_path(tmp_path):
    blocker = tmp_path / "some_file"
    blocker.write_text("x")
    with pytest.raises(CheckpointError, match=f"{blocker / 'x'} is not writable"):
        check_writable(blocker / "x")


@pytest.mark.skipif(not hasattr(os, "geteuid") or os.geteuid() == 0, reason="root ignores directory permissions")
def test_check_writable_read_only_dir(tmp_path):
    read_only = tmp_path / "ro"
    read_only.mkdir()
    read_only.chmod(0o500)
    try:
        with pytest.raises(CheckpointError, match="ro is not writable: Permission denied"):
            check_writable(read_only)
    finally:
        read_only.chmod(0o700)
