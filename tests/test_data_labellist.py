"""Label lists (PaddleClas's format, CSV, multi-label): every problem named by list and line, before training."""
from __future__ import annotations

import json
import logging
import os
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from paddletrain.config import DataConfig
from paddletrain.data.datasets import DatasetError, build_datasets
from paddletrain.data.formats.label_list import LabelListDataset, LineProblem, check_label_list, read_label_list
from paddletrain.data.formats.sample_index import SampleIndex
from paddletrain.errors import ExitCode
from tests.conftest import run_module

HYMENOPTERA = Path("/work/shared/data/hymenoptera_data")


def _image(path: Path, label: int) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    pixels = np.full((12, 14, 3), 40, np.uint8)
    pixels[..., label % 3] = 220  # a colour per class
    Image.fromarray(pixels).save(path)


@pytest.fixture
def root(tmp_path: Path) -> Path:
    """Images of 3 classes under root/images (one name with a space), and a list of each split."""
    root = tmp_path / "data"
    for i in range(9):
        _image(root / "images" / f"train {i}.png", i % 3)
    for i in range(3):
        _image(root / "images" / f"val{i}.jpg", i)
    (root / "train_list.txt").write_text("".join(f"images/train {i}.png {i % 3}\n" for i in range(9)))
    (root / "val_list.txt").write_text("".join(f"images/val{i}.jpg {i}\n" for i in range(3)))
    return root


def _read(root: Path, text: str | bytes, name: str = "list.txt", **options):
    path = root / name
    path.write_bytes(text if isinstance(text, bytes) else text.encode())
    return read_label_list(path, root, key="data.train_list", **options)


def test_a_paddleclas_list_becomes_an_index_with_its_labels(root):
    found = read_label_list(root / "train_list.txt", root, key="data.train_list")
    assert (found.num_classes, found.lines, found.skipped, len(found.index)) == (3, 9, 0, 9)
    assert found.index.relpath(0) == "images/train 0.png"  # everything before the last delimiter is the path
    assert found.index.labels.dtype == np.int64 and found.index.labels.tolist() == [i % 3 for i in range(9)]
    assert found.index.path(4) == os.path.join(str(root), "images/train 4.png")


def test_the_labellist_dataset_trains_from_its_lists(root):
    (root / "names.txt").write_text("red\ngreen\nblue\n")
    cfg = DataConfig(name="labellist", root=str(root), train_list="train_list.txt", val_list="val_list.txt",
                     class_names="names.txt")
    splits = build_datasets(cfg)
    assert splits.classes == ["red", "green", "blue"] and (len(splits.train), len(splits.val)) == (9, 3)
    image, label = splits.val[2]
    assert np.asarray(image)[0, 0].argmax() == 2 and label == 2 and label.dtype == np.int64
    without_names = build_datasets(DataConfig(name="labellist", root=str(root), train_list="train_list.txt",
                                              val_list="val_list.txt"))
    assert without_names.classes == ["0", "1", "2"]  # the indices are the names


def test_a_csv_list_with_a_header_reads_its_path_and_label_columns(root):
    text = "id,label,path\n" + "".join(f'{i},{i % 3},"images/train {i}.png"\n' for i in range(4))
    found = _read(root, text, "train.csv")
    assert found.index.relpaths()[:2] == ["images/train 0.png", "images/train 1.png"]
    assert found.index.labels.tolist() == [0, 1, 2, 0]
    with pytest.raises(DatasetError, match=r"CSV list needs a header line with 'path' and 'label'"):
        _read(root, "images/train 0.png,0\n", "nohead.csv")


def test_another_delimiter_and_the_class_count_of_the_val_list(root):
    found = _read(root, "images/train 0.png|2\nimages/train 1.png|0\n", delimiter="|")
    assert found.num_classes == 3
    with pytest.raises(DatasetError, match=r"line 1 has label 3, out of range for 3 classes \(0..2\)"):
        _read(root, "images/val0.jpg 3\n", num_classes=3)


BAD_LINES = [
    ("images/nope.png 0\n", 1, r"names 'images/nope.png', which does not exist"),
    ("images/val0.jpg 0\nimages/val1.jpg x\n", 2, r"has label 'x', not a class index"),
    ("images/val0.jpg -1\n", 1, r"has label '-1', not a class index"),
    ("images/val0.jpg\n", 1, r"has no ' ' between the path and its label"),
    ("../data/images/val0.jpg 0\n", 1, r"has path '../data/images/val0.jpg', which leaves data.root"),
    ("/etc/passwd 0\n", 1, r"has an absolute path '/etc/passwd'"),
    ("images/val0.jpg 0\nimages/./val0.jpg 1\n", 2, r"lists 'images/./val0.jpg' again \(first on line 1\)"),
    ("images/val0.jpg 0\n\nimages/val1.jpg 1\n", 2, r"is blank"),
    ("images/val0.jpg 0\r\nimages/val1.jpg 1\r\n", 1, r"ends with CR, a Windows line ending"),
    (b"\xef\xbb\xbfimages/val0.jpg 0\n", 1, r"starts with a UTF-8 byte-order mark"),
    (b"images/val0.jpg 0\nimages/caf\xe9.jpg 1\n", 2, r"is not UTF-8 \(byte 0xe9 at column 11\)"),
    ("images 0\n", 1, r"names 'images', which is a directory, not an image file"),
]


@pytest.mark.parametrize("text, line, message", BAD_LINES)
def test_each_bad_line_is_refused_naming_the_list_and_line(root, text, line, message):
    with pytest.raises(DatasetError, match=rf"data.train_list='.*list.txt' line {line} {message}.*data.bad_lines=skip"):
        _read(root, text)


def test_symlinks_out_of_the_root_are_refused_file_or_folder(root, tmp_path):
    outside = tmp_path / "outside"
    _image(outside / "secret.png", 0)
    (root / "images" / "link.png").symlink_to(outside / "secret.png")
    (root / "linked_dir").symlink_to(outside)
    (root / "images" / "inside.png").symlink_to(root / "images" / "val0.jpg")
    with pytest.raises(DatasetError, match=r"line 1 names 'images/link.png', a symlink out of data.root"):
        _read(root, "images/link.png 0\n")
    with pytest.raises(DatasetError, match=r"line 1 names 'linked_dir/secret.png', whose folder is a symlink out"):
        _read(root, "linked_dir/secret.png 0\n")
    assert len(_read(root, "images/inside.png 0\n").index) == 1  # a link that stays inside is fine


def test_bad_lines_skip_warns_per_line_and_keeps_the_rest(root, caplog):
    text = "images/val0.jpg 0\nimages/nope.png 1\n\nimages/val1.jpg 1\nimages/val2.jpg z\n"
    with caplog.at_level(logging.INFO, logger="paddletrain"):
        found = _read(root, text, bad_lines="skip")
    assert found.index.relpaths() == ["images/val0.jpg", "images/val1.jpg"] and (found.lines, found.skipped) == (5, 3)
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert [w.split(" line ")[1].split(" ")[0] for w in warnings] == ["2", "3", "5"]
    assert any("2 of 5 lines used, 3 bad lines skipped" in r.getMessage() for r in caplog.records)
    with pytest.raises(DatasetError, match=r"has no usable line"):
        _read(root, "images/nope.png 0\n", bad_lines="skip")


def test_the_first_bad_line_is_named_with_the_count_of_the_others(root):
    with pytest.raises(DatasetError, match=r"line 2 has label 'a'.* \(2 more bad lines\)"):
        _read(root, "images/val0.jpg 0\nimages/val1.jpg a\nimages/val2.jpg b\nimages/x.png 0\n")


def test_a_multilabel_list_reads_multi_hot_rows_split_on_the_tab(root):
    found = _read(root, "images/val0.jpg\t0,1,1\nimages/val1.jpg\t1,0,0\n", multilabel=True)
    assert found.num_classes == 3 and found.index.multilabel
    assert found.index.labels.tolist() == [[0, 1, 1], [1, 0, 0]] and found.index.labels.dtype == np.uint8
    assert found.index.labels.sum(axis=0).tolist() == [1, 1, 1]  # each class on once
    dataset = LabelListDataset(found.index, ["a", "b", "c"])
    assert dataset[0][1].tolist() == [0.0, 1.0, 1.0] and dataset[0][1].dtype == np.float32
    with pytest.raises(DatasetError, match=r"line 2 has 2 label values, not one per class \(3\)"):
        _read(root, "images/val0.jpg\t0,1,1\nimages/val1.jpg\t1,0\n", multilabel=True)
    with pytest.raises(DatasetError, match=r"line 1 has labels '0,2', not comma-separated 0/1"):
        _read(root, "images/val0.jpg\t0,2\n", multilabel=True)


def test_the_index_keeps_paths_in_one_buffer_and_round_trips_any_name():
    names = ["a/b.png", "ü/ß e.jpg", os.fsdecode(b"raw\xff.png"), ""]
    index = SampleIndex.build("/r", names, [3, 1, 2, 0])
    assert index.relpaths() == names and index.path(1) == "/r/ü/ß e.jpg"
    assert index.path_bytes.dtype == np.uint8 and index.offsets.tolist()[-1] == index.path_bytes.size
    assert index.labels.tolist() == [3, 1, 2, 0] and index.labels.dtype == np.int64


def _fit_args(root: Path, run_dir: Path, *extra: str) -> list[str]:
    return ["data=labellist", f"data.root={root}", "data.train_list=train_list.txt", "data.val_list=val_list.txt",
            "model=resnet20", "data.image_size=16", "data.batch_size=4", "data.num_workers=0",
            "trainer.max_epochs=1", "callbacks.progress_bar.enabled=false", "trainer.cpu_threads=1",
            "data.train_transform=small", "data.eval_transform=small", *extra, f"hydra.run.dir={run_dir}"]


def test_fit_evaluate_and_export_take_label_lists(root, tmp_path):
    run_dir = tmp_path / "run"
    result = run_module("paddletrain.fit", _fit_args(root, run_dir), cwd=root)  # lists relative to the cwd
    assert result.returncode == 0, (result.stdout + result.stderr)[-3000:]
    assert "data.train_list='train_list.txt': 9 of 9 lines used" in result.stdout + result.stderr
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["global_step"] == 2
    # evaluate from elsewhere: the relative lists are found under data.root; another val list replaces the saved
    (root / "val_two.txt").write_text("images/val0.jpg 0\nimages/val1.jpg 1\n")
    result = run_module("paddletrain.evaluate", [f"checkpoint={run_dir}:last", "data.val_list=val_two.txt",
                                                 f"hydra.run.dir={tmp_path / 'ev'}"], cwd=tmp_path)
    assert result.returncode == 0, result.stderr[-3000:]
    assert "val_two.txt': 2 of 2 lines used" in result.stdout + result.stderr
    result = run_module("paddletrain.export", [f"checkpoint={run_dir}:last", f"out_dir={tmp_path / 'export'}",
                                               "num_check_images=3"], cwd=tmp_path)
    assert result.returncode == 0, result.stderr[-3000:]
    assert json.loads((tmp_path / "export" / "preprocess.json").read_text())["labels"] == ["0", "1", "2"]
    # predict a label list: its checks, and each line carries the list's class as "target"
    result = run_module("paddletrain.predict", [f"model_dir={tmp_path / 'export'}", "input=val_list.txt",
                                                f"data_root={root}", f"output={tmp_path / 'preds.jsonl'}",
                                                "num_workers=0", "progress_bar=false",
                                                f"hydra.run.dir={tmp_path / 'pr'}"], cwd=root)
    assert result.returncode == 0, result.stderr[-3000:]
    lines = [json.loads(line) for line in (tmp_path / "preds.jsonl").read_text().splitlines()]
    assert [(Path(line["path"]).name, line["target"]) for line in lines] == [(f"val{i}.jpg", i) for i in range(3)]
    (root / "bad_val.txt").write_text("images/val0.jpg 0\nimages/gone.jpg 1\n")
    result = run_module("paddletrain.predict", [f"model_dir={tmp_path / 'export'}", "input=bad_val.txt",
                                                f"data_root={root}", f"hydra.run.dir={tmp_path / 'pr2'}"], cwd=root)
    assert result.returncode == ExitCode.USER_ERROR
    assert "input='bad_val.txt' line 2 names 'images/gone.jpg', which does not exist" in result.stdout + result.stderr


def test_a_bad_list_stops_fit_at_start_up_with_one_line(root, tmp_path):
    (root / "train_list.txt").write_text("images/train 0.png 0\nimages/train 1.png 7x\n")
    result = run_module("paddletrain.fit", _fit_args(root, tmp_path / "run"), cwd=root)
    output = result.stdout + result.stderr
    assert result.returncode == ExitCode.USER_ERROR and "Traceback" not in output
    assert "data.train_list='train_list.txt' line 2 has label '7x', not a class index" in output
    result = run_module("paddletrain.fit", _fit_args(root, tmp_path / "run2", "data.val_list=null"), cwd=root)
    assert result.returncode == ExitCode.USER_ERROR
    assert "missing required value for data.val_list" in result.stdout + result.stderr


@pytest.mark.skipif(not HYMENOPTERA.is_dir(), reason=f"the ants/bees images are not at {HYMENOPTERA}")
def test_a_list_of_the_ants_and_bees_photos_reads_and_decodes_them(tmp_path):
    lines = [f"{split}/{name}/{image.name} {label}"
             for split in ("train", "val") for label, name in enumerate(("ants", "bees"))
             for image in sorted((HYMENOPTERA / split / name).iterdir()) if image.suffix.lower() == ".jpg"]
    (tmp_path / "all.txt").write_text("\n".join(lines) + "\n")
    found = read_label_list(tmp_path / "all.txt", HYMENOPTERA, key="data.train_list")
    assert len(found.index) == len(lines) > 300 and found.num_classes == 2
    dataset = LabelListDataset(found.index, ["ants", "bees"])
    for i in (0, len(dataset) - 1):
        image, label = dataset[i]
        assert image.size[0] > 100 and label == int(lines[i].rsplit(" ", 1)[1])


def test_check_label_list_returns_every_bad_line_with_its_kind(root):
    (root / "bad.txt").write_text("images/train 0.png 0\nimages/train 0.png 0\nimages/nope.png 1\n"
                                  "images/train 1.png 9\nimages/train 2.png two\n../x.png 0\n\nimages/train 3.png 2\n")
    checked = check_label_list(root / "bad.txt", root, key="data.train_list", num_classes=3)
    assert [(p.line, p.kind) for p in checked.problems] == [
        (2, "listed-twice"), (3, "missing-file"), (4, "label-out-of-range"), (5, "bad-line"), (6, "bad-path"),
        (7, "bad-line")]
    assert checked.problems[2] == LineProblem(4, "label-out-of-range", "has label 9, out of range for 3 classes (0..2)")
    # the good lines are what bad_lines=skip trains on, each with its line
    assert checked.found.index.relpaths() == ["images/train 0.png", "images/train 3.png"]
    assert checked.sample_lines == [1, 8] and checked.lines == 8 and checked.found.skipped == 6
    with pytest.raises(DatasetError, match="line 2 lists 'images/train 0.png' again"):
        read_label_list(root / "bad.txt", root, key="data.train_list", num_classes=3)  # training still stops
