"""A checkpoint is a trust boundary: a crafted run directory never makes paddletrain write, truncate or delete
anything outside it, and every bad value ends in one line naming the checkpoint file and the key.

The attacks are real: a trained run directory is edited the way a forger would (the manifest resealed so the
sha256 checks pass) and resumed through ``python -m paddletrain.fit ... trainer.resume=auto``.
"""
from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import numpy as np
import paddle
import pytest
import safetensors.numpy

from paddletrain.build import train
from paddletrain.callbacks import ModelCheckpoint, VisualDLLogger
from paddletrain.checkpoint import CheckpointError, CheckpointManager, load_checkpoint, save_checkpoint
from paddletrain.checkpoint.storage import STATE, TENSORS
from paddletrain.checkpoint.untrusted import StateValueError, confined_path
from paddletrain.engine.resume import load_resume_checkpoint
from paddletrain.errors import UserError
from tests.conftest import TINY, compose_fit
from tests.reliability.checkpoint_craft import (
    BAD_TENSOR_FILES,
    assert_one_error_line,
    fit_cli,
    latest,
    output,
    reseal,
    rewrite_state,
)

VDL = ["callbacks.visualdl.log_images=true"]


def _copy_run(template: Path, tmp_path: Path) -> Path:
    run_dir = tmp_path / "run"
    shutil.copytree(template, run_dir, symlinks=True)
    return run_dir


@pytest.fixture(scope="module")
def finished_run(tmp_path_factory) -> Path:
    """One epoch with VisualDL on: a checkpoint at an epoch end and a log file."""
    run_dir = tmp_path_factory.mktemp("finished") / "run"
    result = fit_cli(run_dir, *VDL)
    assert result.returncode == 0, output(result)[-3000:]
    return run_dir


@pytest.fixture(scope="module")
def mid_epoch_run(tmp_path_factory) -> Path:
    """Two of the epoch's four steps: the checkpoint holds a sampler position and a train meter too."""
    run_dir = tmp_path_factory.mktemp("mid_epoch") / "run"
    result = fit_cli(run_dir, "trainer.max_steps=2")
    assert result.returncode == 0, output(result)[-3000:]
    assert load_checkpoint(latest(run_dir)).state["progress"]["batch_in_epoch"] == 2
    return run_dir


# ------------------------------------------------------------------------------------- the VisualDL record
@pytest.mark.parametrize("attack", ["relative", "absolute", "symlink", "hardlink"])
def test_crafted_visualdl_record_never_touches_a_file_outside_the_run_dir(finished_run, tmp_path, attack):
    run_dir = _copy_run(finished_run, tmp_path)
    logdir = run_dir / "visualdl"
    victim = tmp_path / "victim.txt"
    victim.write_bytes(b"a file the resumed run must never cut or write\n" * 200)
    before = victim.read_bytes()
    name = {"relative": os.path.relpath(victim, logdir), "absolute": str(victim)}.get(attack, "vdlrecords.1.log")
    if attack == "symlink":
        (logdir / name).symlink_to(victim)
    elif attack == "hardlink":
        os.link(victim, logdir / name)  # same file system (tmp_path): the link is the victim's own inode
    original_logs = {p.name: p.read_bytes() for p in logdir.iterdir() if p.is_file() and not p.is_symlink()}
    rewrite_state(latest(run_dir), lambda s: s["callbacks"]["VisualDLLogger"].update(file_name=name, file_size=3))

    result = fit_cli(run_dir, *VDL, "trainer.max_epochs=2", "trainer.resume=auto")

    assert result.returncode == 0, output(result)[-3000:]
    assert victim.read_bytes() == before
    assert "VisualDLLogger: not appending" in output(result) and "writing a new" in output(result)
    new_logs = [p for p in logdir.iterdir() if p.name.startswith("vdlrecords.") and p.name not in original_logs
                and not p.is_symlink() and p.stat().st_nlink == 1]
    assert len(new_logs) == 1 and new_logs[0].stat().st_size > 0  # the resumed run logs into a fresh file


@pytest.mark.parametrize("record, problem", [
    ({"file_size": -5}, "file_size is -5"),
    ({"file_size": "10"}, "file_size is '10'"),
    ({"last_step": True}, "last_step is True"),
    ({"file_name": ["a"]}, "file_name is ['a']"),
])
def test_visualdl_record_of_the_wrong_type_starts_a_new_log_with_a_warning(record, problem, caplog):
    logger = VisualDLLogger(logdir="unused")
    good = {"file_name": "vdlrecords.1.log", "file_size": 10, "last_step": 4, "epoch_keys": []}
    logger.load_state_dict({**good, **record})
    assert logger._file_name is None and logger._resume_size is None
    assert problem in caplog.text and "writing a new log file" in caplog.text


def test_visualdl_logdir_symlinked_out_of_the_run_dir_is_refused(tmp_path):
    run_dir, outside = tmp_path / "run", tmp_path / "elsewhere"
    run_dir.mkdir()
    outside.mkdir()
    (run_dir / "visualdl").symlink_to(outside)
    trainer = type("T", (), {"run_dir": str(run_dir)})()
    with pytest.raises(StateValueError, match="VisualDL log directory .*leads outside"):
        VisualDLLogger(logdir=str(run_dir / "visualdl"))._open(trainer)
    assert list(outside.iterdir()) == []


# ------------------------------------------------------------------------------- checkpoint directory and names
def test_one_helper_confines_every_name(tmp_path):
    root, outside = tmp_path / "root", tmp_path / "outside"
    root.mkdir()
    outside.mkdir()
    (root / "out").symlink_to(outside)
    (root / "in").symlink_to(root / ".")
    for name, problem in [("../outside", "'..' would lead outside"), (str(outside), "is the absolute path"),
                          ("out", "leads outside"), ("out/x", "leads outside"), ("", "non-empty"),
                          (7, "non-empty file name"), ("a\x00b", "NUL")]:
        with pytest.raises(StateValueError, match=problem):
            confined_path(root, name, "key")
    assert confined_path(root, "in/sub", "key") == root / "in" / "sub"
    with pytest.raises(StateValueError, match="plain name"):
        confined_path(root, "in/sub", "key", plain_name=True)
    with pytest.raises(StateValueError, match="plain name"):
        confined_path(root, ".old-x", "key", plain_name=True)


@pytest.mark.parametrize("attack", ["relative", "absolute", "symlink"])
def test_retention_records_cannot_make_pruning_delete_outside(tmp_path, attack):
    root = tmp_path / "checkpoints"
    victim = tmp_path / "victim"
    victim.mkdir()
    (victim / "data.txt").write_text("keep me")
    manager = CheckpointManager(root, keep_last=1, keep_best=0)
    manager.save({"x": 1}, name="a", metadata={"global_step": 1})
    name = {"relative": "../victim", "absolute": str(victim), "symlink": "link"}[attack]
    if attack == "symlink":
        (root / "link").symlink_to(victim)
    state = manager.state_dict()
    state["records"].append({**state["records"][0], "name": name, "global_step": 0})
    fresh = CheckpointManager(root, keep_last=1, keep_best=0)
    with pytest.raises(StateValueError, match=r"records\[1\]\.name"):
        fresh.load_state_dict(state)
    fresh.save({"x": 2}, name="b", metadata={"global_step": 2})
    assert (victim / "data.txt").read_text() == "keep me"


def test_checkpoint_directory_symlinked_out_of_the_run_dir_is_refused(tmp_path):
    run_dir, outside = tmp_path / "run", tmp_path / "elsewhere"
    run_dir.mkdir()
    save_checkpoint(outside / "epoch0000-step0000001", {"run": {}}, {"global_step": 1})
    (run_dir / "checkpoints").symlink_to(outside)
    with pytest.raises(UserError, match="trainer.resume=auto: checkpoint directory .*leads outside"):
        load_resume_checkpoint("auto", run_dir, {})
    trainer = type("T", (), {"run_dir": str(run_dir), "is_main": True, "resumed_from": None})()
    with pytest.raises(StateValueError, match="leads outside"):
        ModelCheckpoint(run_dir / "checkpoints").on_fit_start(trainer)
    assert [p.name for p in outside.iterdir()] == ["epoch0000-step0000001"]


def test_manifest_names_and_numbers_are_checked(tmp_path):
    outside = tmp_path / "secret.bin"
    outside.write_bytes(b"x" * 10)
    for files, problem in [({"../secret.bin": {"size": 10, "sha256": "0" * 64}}, "files.../secret.bin is"),
                           ({str(outside): {"size": 10, "sha256": "0" * 64}}, "files.* expected a plain name"),
                           ({"state.json": {"size": -1, "sha256": "0" * 64}}, "files.state.json.size is -1"),
                           ({"state.json": {"size": 1, "sha256": "zz"}}, "files.state.json.sha256")]:
        path = save_checkpoint(tmp_path / "c", {"x": 1}, {"global_step": 1})
        manifest = json.loads((path / "manifest.json").read_text())
        manifest["files"] = files
        (path / "manifest.json").write_text(json.dumps(manifest))
        with pytest.raises(CheckpointError, match=f"checkpoint file .*manifest.json: {problem}"):
            load_checkpoint(path)
    path = save_checkpoint(tmp_path / "d", {"x": 1}, {"global_step": 1})
    (path / "state.json").rename(tmp_path / "moved.json")
    (path / "state.json").symlink_to(tmp_path / "moved.json")  # the right bytes, but outside the checkpoint
    with pytest.raises(CheckpointError, match="state.json is .*leads outside"):
        load_checkpoint(path)


# --------------------------------------------------------------------------- every counter and size is checked
def _resume_in_process(run_dir: Path, *extra: str) -> None:
    cfg = compose_fit([*TINY, "trainer.max_steps=3", "trainer.resume=auto", *extra])
    # A fresh process names parameters conv2d_0...; the same names here let the optimizer state match.
    with paddle.utils.unique_name.guard():
        train(cfg, run_dir)


def _set(path: str, value):
    def mutate(tree: dict) -> None:
        *parents, last = path.split(".")
        node = tree
        for part in parents:
            node = node[int(part)] if isinstance(node, list) else node[part]
        node[int(last) if isinstance(node, list) else last] = value

    return mutate


COUNTERS = [
    ("progress.global_step", -1, "progress.global_step is -1: expected an integer"),
    ("progress.epoch", "0", "progress.epoch is '0'"),
    ("progress.batch_in_epoch", 2.5, "progress.batch_in_epoch is 2.5"),
    ("progress.epoch_finished", "no", "progress.epoch_finished is 'no': expected true or false"),
    ("progress.nonfinite_steps", 2**60, "progress.nonfinite_steps is 1152921504606846976"),
    ("sampler.position", 10**6, "sampler.position is 1000000, but an epoch has only 4 batches"),
    ("sampler.seed", -5, "sampler.seed is -5"),
    ("train_meter.count", -3, "train_meter.count is -3"),
    ("rng", {}, "rng is not a list"),
    ("rng.0.python", [1, 2, 3], "rng[0].python is [1, 2, 3]"),
    ("rng.0.paddle_cpu.0.engine", "1 2 x", "rng.0.paddle_cpu.0.engine is '1 2 x'"),  # checked while decoding
    ("metrics.val/top1", "high", "metrics.val/top1 is 'high': expected a number"),
    ("scheduler.last_epoch", "8", "scheduler.last_epoch is '8'"),
    ("callbacks.ModelCheckpoint.records", [{"name": "../../x", "global_step": 1, "epoch": 0, "metric": None,
                                            "created": 1.0}],
     "callbacks.ModelCheckpoint.records[0].name is '../../x'"),
    ("callbacks.ModelCheckpoint.records", [{"name": "a", "global_step": "1", "epoch": 0, "metric": None,
                                            "created": 1.0}],
     "callbacks.ModelCheckpoint.records[0].global_step is '1'"),
]


@pytest.mark.parametrize("key, value, problem", COUNTERS, ids=[c[0] + "=" + repr(c[1])[:12] for c in COUNTERS])
def test_every_counter_read_from_a_checkpoint_is_checked(mid_epoch_run, tmp_path, key, value, problem):
    run_dir = _copy_run(mid_epoch_run, tmp_path)
    checkpoint = latest(run_dir)
    rewrite_state(checkpoint, _set(key, value))
    with pytest.raises(CheckpointError) as raised:
        _resume_in_process(run_dir)
    message = str(raised.value)
    assert message.startswith(f"checkpoint file {checkpoint / STATE}: ") and problem in message, message


def test_a_bad_counter_through_the_cli_is_one_line(mid_epoch_run, tmp_path):
    run_dir = _copy_run(mid_epoch_run, tmp_path)
    checkpoint = latest(run_dir)
    rewrite_state(checkpoint, _set("progress.global_step", -1))
    result = fit_cli(run_dir, "trainer.max_steps=3", "trainer.resume=auto")
    assert_one_error_line(result, str(checkpoint / STATE), "progress.global_step is -1")


# ------------------------------------------------------------------------------- optimizer of another shape
def _swap_moment(checkpoint: Path) -> str:
    """Give one Adam moment another shape (as if taken from another model), keeping everything else."""
    tree = json.loads((checkpoint / STATE).read_text())
    arrays = safetensors.numpy.load_file(str(checkpoint / TENSORS))
    arrays[tree["optimizer"]["by_parameter"]["conv1.weight"]["moment1"]["key"]] = np.zeros((5, 7), dtype=np.float32)
    safetensors.numpy.save_file(arrays, str(checkpoint / TENSORS))
    reseal(checkpoint)
    return "by_parameter.conv1.weight.moment1"


def test_optimizer_moments_of_another_shape_are_refused_before_training(mid_epoch_run, tmp_path):
    run_dir = _copy_run(mid_epoch_run, tmp_path)
    checkpoint = latest(run_dir)
    name = _swap_moment(checkpoint)
    with pytest.raises(CheckpointError, match=rf"checkpoint file .*state.json: optimizer\.{name} has shape "
                                              r"\[5, 7\], but its parameter conv1.weight has shape \[16, 3, 3, 3\]"):
        _resume_in_process(run_dir)
    result = fit_cli(run_dir, "trainer.max_steps=3", "trainer.resume=auto")
    assert_one_error_line(result, str(checkpoint / STATE), f"optimizer.{name} has shape [5, 7]")


# ------------------------------------------------------------------------------ malformed checkpoint files
@pytest.mark.parametrize("kind", list(BAD_TENSOR_FILES))
def test_malformed_tensor_file_is_one_clear_error(tmp_path, kind):
    path = save_checkpoint(tmp_path / "c", {"w": np.ones(2, np.float32)}, {"global_step": 1})
    (path / TENSORS).write_bytes(BAD_TENSOR_FILES[kind])
    reseal(path)
    with pytest.raises(CheckpointError, match=f"{path / TENSORS} is corrupt or unreadable \\(") as raised:
        load_checkpoint(path)
    assert "\n" not in str(raised.value)


def test_malformed_tensor_file_through_the_cli(finished_run, tmp_path):
    run_dir = _copy_run(finished_run, tmp_path)
    checkpoint = latest(run_dir)
    (checkpoint / TENSORS).write_bytes(BAD_TENSOR_FILES["offsets out of range"])
    reseal(checkpoint)
    result = fit_cli(run_dir, "trainer.max_epochs=2", "trainer.resume=auto")
    assert_one_error_line(result, f"{checkpoint / TENSORS} is corrupt or unreadable", "offset")


def test_state_tree_depth_dtype_and_references_are_checked(tmp_path):
    path = save_checkpoint(tmp_path / "c", {"w": paddle.ones([2])}, {"global_step": 1})
    cases = [
        (lambda t: t.update(deep=json.loads("[" * 150 + "]" * 150)), "deep.0.0.* nests more than 100 levels"),
        (lambda t: t.update(deep=json.loads("[" * 100000 + "]" * 100000)), "state.json nests too deeply"),
        (lambda t: t["w"].update(dtype="float64"), "w is a tensor of dtype 'float64', but tensors.safetensors "
                                                   "holds it as float32"),
        (lambda t: t["w"].update(key="nope"), "w refers to tensor 'nope'"),
        (lambda t: t.update(n={"__pt__": "float", "value": "big"}), "n is the non-finite float 'big'"),
        (lambda t: t.update(n={"__pt__": "weird"}), "n holds an unknown node type 'weird'"),
    ]
    original = (path / STATE).read_text()
    for mutate, problem in cases:
        (path / STATE).write_text(original)
        try:
            rewrite_state(path, mutate)
        except RecursionError:  # json.dumps cannot write it either: write the text by hand
            (path / STATE).write_text(original[:-2] + ', "deep": ' + "[" * 100000 + "]" * 100000 + "}\n")
            reseal(path)
        with pytest.raises(CheckpointError, match=problem):
            load_checkpoint(path)
