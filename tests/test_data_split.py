"""python -m paddletrain.data split: stratified, seeded PaddleClas lists that data=labellist reads back."""
from __future__ import annotations

import logging
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from paddletrain.config import DataConfig
from paddletrain.data.__main__ import main
from paddletrain.data.datasets import build_datasets
from paddletrain.data.tools.check import check_dataset
from paddletrain.data.tools.split import split_folder, val_count
from paddletrain.errors import ExitCode, UserError
from tests.conftest import data_command

COUNTS = {"ant": 20, "bee": 5, "moth": 3, "wasp": 1}  # per class



def _folder(root: Path, counts: dict[str, int] = COUNTS) -> Path:
    for c, (name, n) in enumerate(counts.items()):
        for i in range(n):
            path = root / name / f"img {i}.png"  # a space: the path is everything before the last delimiter
            path.parent.mkdir(parents=True, exist_ok=True)
            Image.fromarray(np.full((10, 10, 3), 50 * c + i, np.uint8)).save(path)
    return root


def _lines(path: Path) -> list[str]:
    return path.read_text().splitlines()


@pytest.mark.parametrize("images, val, expected", [
    (10, 0.1, 1), (5, 0.1, 1), (4, 0.1, 0), (15, 0.1, 2), (25, 0.1, 3), (20, 0.25, 5), (3, 0.5, 2), (2, 0.5, 1),
    (1, 0.5, 0), (2, 0.9, 1), (1000, 0.001, 1), (0, 0.1, 0),
])
def test_val_count_is_the_share_rounded_half_up_keeping_one_training_image(images, val, expected):
    assert val_count(images, val) == expected


def test_split_is_stratified_and_warns_of_classes_too_small_for_val(tmp_path, caplog):
    folder = _folder(tmp_path / "photos")
    with caplog.at_level(logging.WARNING, "paddletrain"):
        result = split_folder(folder, val=0.25, seed=0)
    assert result.classes == ["ant", "bee", "moth", "wasp"]  # sorted class names: the indices
    assert result.val_counts == [5, 1, 1, 0] and result.train_counts == [15, 4, 2, 1]
    assert [f.name for f in result.files] == ["train_list.txt", "val_list.txt", "class_names.txt"]
    assert _lines(folder / "class_names.txt") == result.classes
    val = _lines(folder / "val_list.txt")
    assert [line.rsplit(" ", 1)[1] for line in val] == ["0"] * 5 + ["1", "2"]
    assert all(line.startswith(("ant/img ", "bee/img ", "moth/img ")) for line in val)
    train = _lines(folder / "train_list.txt")
    assert len(train) == 22 and not set(train) & set(val) and "wasp/img 0.png 3" in train
    assert [r.message for r in caplog.records] == result.warnings == [
        "class 'wasp' has 1 image, too few to put one in val at --val 0.25 (that takes 2): all of them are in train"]


def test_the_same_seed_gives_the_same_lists_and_another_class_does_not_reshuffle(tmp_path):
    first = split_folder(_folder(tmp_path / "a"), seed=3, val=0.25, out=tmp_path / "out1").files
    again = split_folder(tmp_path / "a", seed=3, val=0.25, out=tmp_path / "out2").files
    assert [f.read_bytes() for f in first] == [f.read_bytes() for f in again]
    other = split_folder(tmp_path / "a", seed=4, val=0.25, out=tmp_path / "out3").files
    assert _lines(other[1]) != _lines(first[1])
    grown = split_folder(_folder(tmp_path / "b", {"aardvark": 4, **COUNTS}), seed=3, val=0.25).files
    ants = [line.rsplit(" ", 1)[0] for line in _lines(grown[1]) if line.startswith("ant/")]
    assert ants == [line.rsplit(" ", 1)[0] for line in _lines(first[1]) if line.startswith("ant/")]


def test_data_labellist_and_the_check_read_the_written_lists_without_a_problem(tmp_path, caplog):
    folder = _folder(tmp_path / "photos")
    out = tmp_path / "lists"
    split_folder(folder, val=0.2, seed=0, out=out)  # warns that wasp has no val image
    caplog.clear()
    with caplog.at_level(logging.WARNING):
        splits = build_datasets(DataConfig(name="labellist", root=str(folder), train_list=str(out / "train_list.txt"),
                                           val_list=str(out / "val_list.txt"),
                                           class_names=str(out / "class_names.txt")))
    assert not [r for r in caplog.records if r.levelno >= logging.WARNING]
    assert splits.classes == ["ant", "bee", "moth", "wasp"] and (len(splits.train), len(splits.val)) == (23, 6)
    image, label = splits.val[0]
    assert np.asarray(image).shape == (10, 10, 3) and label == 0
    report = check_dataset([out / "train_list.txt", out / "val_list.txt"], root=folder,
                           class_names=str(out / "class_names.txt"), workers=0, min_size=0)
    assert report.problems == [] and [s.counts for s in report.splits] == [[16, 4, 2, 1], [4, 1, 1, 0]]


def test_existing_lists_are_kept_unless_forced(tmp_path, capsys, monkeypatch):
    folder = _folder(tmp_path / "photos", {"a": 3, "b": 3})
    assert main(["split", str(folder), "--val", "0.34"]) == ExitCode.OK
    assert "2 val images of 2 classes" in capsys.readouterr().out
    before = (folder / "val_list.txt").read_bytes()
    assert data_command(["split", str(folder), "--seed", "1"], monkeypatch) == ExitCode.USER_ERROR
    err = capsys.readouterr().err
    assert "exist already; pass --force to overwrite" in err and len(err.splitlines()) == 1
    assert (folder / "val_list.txt").read_bytes() == before
    assert main(["split", str(folder), "--seed", "1", "--val", "0.4", "--force"]) == ExitCode.OK
    assert len(_lines(folder / "val_list.txt")) == 2 and len(_lines(folder / "train_list.txt")) == 4


@pytest.mark.parametrize("make, args, message", [
    (lambda p: None, ["missing"], "is not a folder"),
    (lambda p: _folder(p / "f", {"a": 2}), ["f", "--val", "1.5"], "--val 1.5 must be a fraction between 0 and 1"),
    (lambda p: _folder(p / "f" / "train", {"a": 2}), ["f"], "has a train folder, so it is split already"),
    (lambda p: (p / "f" / "a").mkdir(parents=True), ["f"], "no images in the class folders"),
])
def test_user_mistakes_exit_2_in_one_line(tmp_path, monkeypatch, capsys, make, args, message):
    monkeypatch.chdir(tmp_path)
    make(tmp_path)
    assert data_command(["split", *args], monkeypatch) == ExitCode.USER_ERROR
    err = capsys.readouterr().err
    assert message in err and len(err.splitlines()) == 1


def test_an_empty_class_folder_is_left_out_with_a_warning(tmp_path):
    folder = _folder(tmp_path / "photos", {"a": 4, "c": 4})
    (folder / "b").mkdir()
    result = split_folder(folder, val=0.25)
    assert result.classes == ["a", "c"] and "class folder 'b' has no images: left out of the classes" in result.warnings
    assert {line.rsplit(" ", 1)[1] for line in _lines(folder / "train_list.txt")} == {"0", "1"}
    with pytest.raises(UserError, match="exist already"):
        split_folder(folder)
