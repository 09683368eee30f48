"""checkpoint=<run dir>[:best|:last]: one resolver finds the checkpoint, or says what is there and how to choose."""
from __future__ import annotations

import json
import os

import numpy as np
import pytest

from paddletrain.checkpoint import CheckpointManager, checkpoint_name
from paddletrain.checkpoint.locate import CheckpointNotFound, locate_checkpoint, split_choice


def make_run(run_dir, metrics, monitor="val/top1"):
    """A run directory whose checkpoints/ holds one checkpoint per metric (epochs 1.., 10 steps each)."""
    manager = CheckpointManager(run_dir / "checkpoints", keep_last=len(metrics), keep_best=len(metrics),
                                monitor=monitor, mode="max")
    paths = [manager.save({"model": {"w": np.full(2, i, np.float32)}},
                          metadata={"epoch": i + 1, "global_step": 10 * (i + 1)}, metric=metric)
             for i, metric in enumerate(metrics)]
    return paths


@pytest.mark.parametrize("spec, parsed", [
    ("runs/a:best", ("runs/a", "best")), ("runs/a:last", ("runs/a", "last")), ("runs/a", ("runs/a", None)),
    ("runs/a:other", ("runs/a:other", None)), (":best", (":best", None)),
])
def test_only_a_best_or_last_suffix_is_a_choice(spec, parsed):
    assert split_choice(spec) == parsed


def test_a_checkpoint_directory_is_itself(tmp_path):
    first, second = make_run(tmp_path, [0.5, 0.7])
    assert locate_checkpoint(first) == first
    with pytest.raises(CheckpointNotFound, match="is itself a checkpoint; drop ':best'"):
        locate_checkpoint(f"{first}:best")


def test_best_and_last_of_a_run_directory_and_of_its_checkpoints_folder(tmp_path):
    first, second, third = make_run(tmp_path, [0.5, 0.9, 0.7])
    assert locate_checkpoint(f"{tmp_path}:best") == second
    assert locate_checkpoint(f"{tmp_path}:last") == third
    assert locate_checkpoint(f"{tmp_path / 'checkpoints'}:best") == second
    assert third.name == checkpoint_name(3, 30)


def test_an_ambiguous_run_directory_lists_its_checkpoints_and_the_words_that_choose(tmp_path):
    make_run(tmp_path, [0.5, 0.9, 0.7])
    with pytest.raises(CheckpointNotFound) as error:
        locate_checkpoint(tmp_path)
    message = str(error.value)
    assert "\n" not in message and "holds 3 checkpoints" in message
    assert f"{checkpoint_name(2, 20)} [best, val/top1=0.9]" in message
    assert f"{checkpoint_name(3, 30)} [last, val/top1=0.7]" in message
    assert f"checkpoint={tmp_path}:last" in message and f"checkpoint={tmp_path}:best" in message


@pytest.mark.parametrize("metrics", [[0.3], [0.3, 0.8]])
def test_a_run_directory_is_enough_when_there_is_nothing_to_choose(tmp_path, metrics):
    paths = make_run(tmp_path, metrics)  # one checkpoint, or the last one is also the best
    assert locate_checkpoint(tmp_path) == paths[-1]


def test_without_a_monitored_metric_there_is_no_best(tmp_path):
    paths = make_run(tmp_path, [None, None], monitor=None)
    assert locate_checkpoint(f"{tmp_path}:last") == paths[-1]
    with pytest.raises(CheckpointNotFound, match=r"has no best checkpoint .*choose checkpoint=.*:last"):
        locate_checkpoint(f"{tmp_path}:best")


def test_an_incomplete_checkpoint_is_never_chosen(tmp_path):
    first, second = make_run(tmp_path, [0.9, 0.5])
    with open(second / "tensors.safetensors", "r+b") as handle:  # truncated after the manifest was written
        handle.truncate(10)
    assert locate_checkpoint(f"{tmp_path}:last") == first
    assert locate_checkpoint(tmp_path) == first  # the only complete one


def test_a_best_pointer_cannot_lead_out_of_the_run(tmp_path):
    make_run(tmp_path / "run", [0.9, 0.5])
    elsewhere = make_run(tmp_path / "other", [0.1])[0]
    pointer = tmp_path / "run" / "checkpoints" / "best.json"
    pointer.write_text(json.dumps({**json.loads(pointer.read_text()), "name": f"../../other/checkpoints/"
                                                                              f"{elsewhere.name}"}))
    with pytest.raises(CheckpointNotFound, match="has no best checkpoint"):
        locate_checkpoint(f"{tmp_path / 'run'}:best")


def test_a_checkpoints_symlink_out_of_the_run_is_refused(tmp_path):
    make_run(tmp_path / "other", [0.1])
    (tmp_path / "run").mkdir()
    os.symlink(tmp_path / "other" / "checkpoints", tmp_path / "run" / "checkpoints")
    with pytest.raises(CheckpointNotFound, match="leads outside"):
        locate_checkpoint(f"{tmp_path / 'run'}:last")


def test_a_folder_of_runs_lists_them_newest_last(tmp_path):
    for name in ("2026-01-01_10-00-00", "2026-01-02_10-00-00"):
        make_run(tmp_path / name, [0.5])
    with pytest.raises(CheckpointNotFound) as error:
        locate_checkpoint(f"{tmp_path}:best")
    assert "holds 2 run directories (2026-01-01_10-00-00, 2026-01-02_10-00-00)" in str(error.value)
    assert f"checkpoint={tmp_path / '2026-01-02_10-00-00'}:best" in str(error.value)


def test_nothing_there_says_so_and_lists_the_folder(tmp_path):
    with pytest.raises(CheckpointNotFound, match="does not exist"):
        locate_checkpoint(tmp_path / "missing", key="checkpoint")
    (tmp_path / "notes.txt").write_text("x")
    with pytest.raises(CheckpointNotFound, match="is a file"):
        locate_checkpoint(tmp_path / "notes.txt")
    with pytest.raises(CheckpointNotFound, match=r"neither a checkpoint.*it holds: notes.txt"):
        locate_checkpoint(tmp_path)
    (tmp_path / "run" / "checkpoints").mkdir(parents=True)
    with pytest.raises(CheckpointNotFound, match="holds no complete checkpoint; it is empty"):
        locate_checkpoint(tmp_path / "run")
