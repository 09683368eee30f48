"""The label-list reader's fast ways give the general way's verdicts: a plain line taken as it is, and a folder
listed once instead of an lstat per file (tests/test_data_labellist.py checks the verdicts themselves)."""
from __future__ import annotations

import logging
import os
from pathlib import Path

import pytest

from paddletrain.data.datasets import DatasetError
from paddletrain.data.formats import label_list_file as label_lists
from paddletrain.data.formats.label_list import read_label_list

GOOD = "a/2.jpg 2"
# Lines that are fine, odd or bad in each way the reader checks; on line 1 every line takes the general way.
LINES = [
    "a/1.jpg 1", "a/1.jpg 1  ", "a/1.jpg  1", "a/1.jpg\t1", "a/./1.jpg 1", "./a/1.jpg 1", "a//1.jpg 1", "a/1.jpg/ 1",
    "a/../a/1.jpg 1", "../a/1.jpg 1", "/a/1.jpg 1", "C:/a.jpg 1", "c:\\a.jpg 1", " a/1.jpg 1", "\u3000a/1.jpg 1",
    "  1", " 1", "a/.hidden.jpg 1", "a/1.jpg 0000000001", "a/1.jpg 12345678901234567890", "a/1.jpg 7", "a/1.jpg -1",
    "a/1.jpg +1", "a/1.jpg 1_0", "a/1.jpg \u0663", "a/1.jpg \u00b2", "a/1.jpg", "a/1.jpg ", "", " \t", "a/1.jpg 1\r",
]


def _verdict(root: Path, text: str, **options) -> tuple:
    """What reading ``text`` gives: the samples, or the error with its line number taken out."""
    path = root / "list.txt"
    path.write_text(text)
    try:
        found = read_label_list(path, root, key="k", num_classes=3, **options)
    except DatasetError as exc:
        message = str(exc)
        return "error", message.split(" line ", 1)[1].split(" ", 1)[1] if " line " in message else message
    return found.index.relpaths(), found.index.labels.tolist(), found.skipped


@pytest.mark.parametrize("line", LINES)
def test_a_line_reads_the_same_whether_the_general_or_the_fast_way_takes_it(tmp_path, line):
    for name in ("1.jpg", "2.jpg", ".hidden.jpg"):
        (tmp_path / "a").mkdir(exist_ok=True)
        (tmp_path / "a" / name).write_bytes(b"")
    for policy in ("error", "skip"):
        first = _verdict(tmp_path, f"{line}\n{GOOD}\n", check_files=False, bad_lines=policy)  # the general way
        second = _verdict(tmp_path, f"{GOOD}\n{line}\n", check_files=False, bad_lines=policy)
        if first[0] == "error" or second[0] == "error":
            assert first == second
        else:  # the same samples, in the order of their lines
            assert (first[0][::-1], first[1][::-1], first[2]) == second


def test_a_duplicate_is_named_on_its_later_line_whatever_its_label_and_the_first_counts_even_if_bad(tmp_path, caplog):
    (tmp_path / "list.txt").write_text(f"{GOOD}\na/1.jpg 9\na/./1.jpg 1\na/1.jpg x\na/3.jpg 1\n")
    with caplog.at_level(logging.WARNING, logger="paddletrain"):
        found = read_label_list(tmp_path / "list.txt", tmp_path, key="k", num_classes=3, check_files=False,
                                bad_lines="skip")
    assert found.index.relpaths() == ["a/2.jpg", "a/3.jpg"]
    assert [r.getMessage().split(" line ", 1)[1] for r in caplog.records] == [
        "2 has label 9, out of range for 3 classes (0..2): skipped",
        "3 lists 'a/./1.jpg' again (first on line 2): skipped",
        "4 lists 'a/1.jpg' again (first on line 2): skipped"]


def _tree(root: Path, outside: Path) -> list[str]:
    """A folder of 40 images plus every kind of entry a list may wrongly name; returns the list's lines."""
    folder = root / "a"
    folder.mkdir(parents=True)
    for i in range(40):
        (folder / f"{i}.jpg").write_bytes(b"")
    outside.mkdir()
    (outside / "secret.jpg").write_bytes(b"")
    (folder / "out.jpg").symlink_to(outside / "secret.jpg")
    (folder / "in.jpg").symlink_to(folder / "1.jpg")
    (folder / "broken.jpg").symlink_to(folder / "nowhere.jpg")
    (folder / "dir.jpg").mkdir()
    os.mkfifo(folder / "fifo.jpg")
    (root / "b").symlink_to(outside)
    names = [f"a/{i}.jpg" for i in range(40)] + [f"a/{n}.jpg" for n in ("out", "in", "broken", "dir", "fifo", "nope")]
    return [f"{name} {i % 3}" for i, name in enumerate(names + ["b/secret.jpg", "."])]


def test_a_folder_listed_once_gives_the_problems_an_lstat_per_file_gives(tmp_path, monkeypatch, caplog):
    root = tmp_path / "root"
    lines = _tree(root, tmp_path / "outside")
    (root / "list.txt").write_text("\n".join(lines) + "\n")

    def read() -> tuple[list[str], list[str]]:
        caplog.clear()
        with caplog.at_level(logging.WARNING, logger="paddletrain"):
            found = read_label_list(root / "list.txt", root, key="k", bad_lines="skip")
        return found.index.relpaths(), [r.getMessage() for r in caplog.records]

    listed = read()
    monkeypatch.setattr(label_lists, "_LISTED_FOLDER", len(lines) + 1)  # every file lstat-ed on its own
    assert read() == listed
    relpaths, warnings = listed
    assert relpaths == [f"a/{i}.jpg" for i in range(40)] + ["a/in.jpg"]
    expected = ["a symlink out of data.root", "which does not exist", "which is a directory, not an image file",
                "which is a FIFO", "which does not exist", "whose folder is a symlink out of data.root",
                "which is a directory, not an image file"]
    assert len(warnings) == len(expected)
    for warning, problem in zip(warnings, expected, strict=True):
        assert problem in warning
