"""The image-folder scan cache: reused while the folder is unchanged, never different from a fresh scan, never
a way around the confinement, and never a reason to fail (a damaged or foreign file means a rescan)."""
from __future__ import annotations

import logging
import os
import time
import zipfile
from pathlib import Path

import numpy as np
import pytest

from paddletrain.config import DataConfig
from paddletrain.data.formats import folder_scan, scancache
from paddletrain.data.formats.imagefolder import ImageFolderDataset, build_imagefolder
from paddletrain.data.formats.sample_index import SampleIndex
from paddletrain.data.formats.scancache import CACHE_DIR_ENV, load_scan, scan_cache_dir

HOUR_AGO_NS = time.time_ns() - 3600 * 10**9


@pytest.fixture
def cache_dir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv(CACHE_DIR_ENV, str(tmp_path / "cache"))
    return tmp_path / "cache" / "scans"


def _age(root: Path) -> None:
    """Date every directory an hour back: a directory modified in the last seconds is not cached (racy mtime)."""
    for directory, _, _ in os.walk(root):
        os.utime(directory, ns=(HOUR_AGO_NS, HOUR_AGO_NS))


@pytest.fixture
def root(tmp_path: Path) -> Path:
    """root/{train,val}/{a,b}/ with empty .jpg files (the scan never opens them), one nested directory."""
    root = tmp_path / "data"
    for split, n in (("train", 5), ("val", 2)):
        for cls in ("a", "b"):
            for i in range(n):
                (root / split / cls).mkdir(parents=True, exist_ok=True)
                (root / split / cls / f"{i}.jpg").write_bytes(b"")
    (root / "train" / "b" / "deep").mkdir()
    (root / "train" / "b" / "deep" / "x.jpg").write_bytes(b"")
    (root / "train" / "a" / "notes.txt").write_text("skipped by extension")
    _age(root)
    return root


class ScanCounter:
    """Counts the scans that really walk the folder."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        self.calls = 0
        real = folder_scan.SplitScan.run

        def run(scan, class_dirs):
            self.calls += 1
            return real(scan, class_dirs)

        monkeypatch.setattr(folder_scan.SplitScan, "run", run)


@pytest.fixture
def scans(monkeypatch: pytest.MonkeyPatch) -> ScanCounter:
    return ScanCounter(monkeypatch)


def _same(a: ImageFolderDataset, b: ImageFolderDataset) -> None:
    assert str(a.index.root) == str(b.index.root) and a.classes == b.classes and a.class_dirs == b.class_dirs
    for name in ("path_bytes", "offsets", "labels"):
        np.testing.assert_array_equal(getattr(a.index, name), getattr(b.index, name))
        assert getattr(a.index, name).dtype == getattr(b.index, name).dtype
    assert a.scan_report == b.scan_report


def _fresh(root: Path, split: str = "train") -> ImageFolderDataset:
    return ImageFolderDataset(root, split, scan_cache=False)


def test_a_second_start_reuses_the_scan_and_gives_the_same_dataset(root, cache_dir, scans, caplog):
    first = ImageFolderDataset(root, "train")
    assert scans.calls == 1 and len(list(cache_dir.glob("*.npz"))) == 1
    with caplog.at_level(logging.INFO, logger="paddletrain"):
        second = ImageFolderDataset(root, "train")
    assert scans.calls == 1  # not walked again
    _same(second, first)
    _same(second, _fresh(root))
    assert len(second) == 11 and second.samples == first.samples
    messages = [r.getMessage() for r in caplog.records]
    assert "train: 11 images in 2 classes; skipped 1 by extension (.txt: 1), 0 symlinks out of root, " \
           "0 non-regular files" in messages  # the same summary line as a scan
    assert any("reusing it" in m for m in messages)
    val = ImageFolderDataset(root, "val")
    ImageFolderDataset(root, "val")
    assert scans.calls == 3 and len(val) == 4 and len(list(cache_dir.glob("*.npz"))) == 2  # one per split


@pytest.mark.parametrize("change", ["add", "remove", "rename", "add_dir", "add_class", "add_val", "chmod"])
def test_any_change_to_a_listed_directory_rescans(root, cache_dir, scans, change):
    ImageFolderDataset(root, "train")
    b = root / "train" / "b"
    if change == "add":
        (b / "deep" / "new.jpg").write_bytes(b"")
    elif change == "remove":
        (b / "deep" / "x.jpg").unlink()
    elif change == "rename":
        (root / "train" / "a" / "0.jpg").rename(root / "train" / "a" / "9.jpg")
    elif change == "add_dir":
        (b / "deeper").mkdir()
        (b / "deeper" / "y.jpg").write_bytes(b"")
    elif change == "add_class":
        (root / "train" / "c").mkdir()
        (root / "train" / "c" / "z.jpg").write_bytes(b"")
    elif change == "add_val":  # the root's listing: a new split changes what counts as "the other split"
        (root / "val" / "a" / "5.jpg").write_bytes(b"")
    else:
        os.chmod(b / "deep", 0o700)  # only the ctime changes
    second = ImageFolderDataset(root, "train")
    expected_scans = 1 if change == "add_val" else 2  # val's files are not train's business
    assert scans.calls == expected_scans
    _same(second, _fresh(root))


def test_a_symlink_out_of_the_root_added_later_is_skipped_not_served_from_the_cache(root, cache_dir, scans,
                                                                                      tmp_path):
    ImageFolderDataset(root, "train")
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "secret.jpg").write_bytes(b"")
    (root / "train" / "a" / "secret.jpg").symlink_to(outside / "secret.jpg")
    (root / "train" / "b" / "deep" / "leak").symlink_to(outside)
    _age(root)  # even with the old mtimes restored the ctime tells
    second = ImageFolderDataset(root, "train")
    assert scans.calls == 2
    assert second.scan_report.skipped[folder_scan.OUTSIDE_ROOT] == 2
    assert not any("secret" in p for p, _ in second.samples)
    ImageFolderDataset(root, "train")
    assert scans.calls == 3  # a scan that met a symlink is never cached


def test_a_just_modified_folder_is_not_cached(root, cache_dir, scans):
    (root / "train" / "a" / "new.jpg").write_bytes(b"")  # mtime now: a change in the same tick would go unseen
    ImageFolderDataset(root, "train")
    ImageFolderDataset(root, "train")
    assert scans.calls == 2 and not list(cache_dir.glob("*.npz"))


def test_scan_cache_false_neither_reads_nor_writes(root, cache_dir, scans):
    cfg = DataConfig(name="imagefolder", root=str(root), scan_cache=False)
    build_imagefolder(cfg, None, None)
    build_imagefolder(cfg, None, None)
    assert scans.calls == 4 and not cache_dir.exists()
    build_imagefolder(DataConfig(name="imagefolder", root=str(root)), None, None)
    build_imagefolder(DataConfig(name="imagefolder", root=str(root)), None, None)
    assert scans.calls == 6


def _only_cache_file(cache_dir: Path) -> Path:
    (path,) = cache_dir.glob("*.npz")
    return path


def _rewrite(path: Path, **changes: np.ndarray) -> None:
    with np.load(path) as npz:
        arrays = {k: npz[k] for k in npz.files}
    arrays.update(changes)
    with open(path, "wb") as f:
        np.savez(f, **arrays)


def _pickled(path: Path) -> None:
    with open(path, "wb") as f:
        np.savez(f, **{"meta": np.array([{"evil": 1}], dtype=object)})


TAMPERING = {
    "truncated": lambda p: p.write_bytes(p.read_bytes()[:200]),
    "garbage": lambda p: p.write_bytes(b"not a zip at all"),
    "empty": lambda p: p.write_bytes(b""),
    "pickle": _pickled,
    "labels_out_of_range": lambda p: _rewrite(p, labels=np.full(11, 7, np.int64)),
    "labels_as_float": lambda p: _rewrite(p, labels=np.zeros(11, np.float64)),
    "offsets_short": lambda p: _rewrite(p, offsets=np.zeros(3, np.int64)),
    "path_leaves_the_root": lambda p: _set_first_path(p, "train/a/../../../outside.jpg"),
    "absolute_path": lambda p: _set_first_path(p, "/etc/passwd"),
    "path_into_an_unlisted_dir": lambda p: _set_first_path(p, "train/a/q/0.jpg"),
    "dot_dot_name": lambda p: _set_first_path(p, "train/a/.."),
    "empty_name": lambda p: _set_first_path(p, "train/a/"),
    "nul_byte": lambda p: _set_first_path(p, "train/a/0.jpg\0"),
    "other_root": lambda p: _tamper_meta(p, b'"root": "', b'"root": "/elsewhere'),
    "version": lambda p: _rewrite(p, version=np.array([99], np.int64)),
    "world_writable": lambda p: os.chmod(p, 0o666),
}


def _set_first_path(path: Path, relpath: str) -> None:
    with np.load(path) as npz:
        index = SampleIndex("", npz["path_bytes"], npz["offsets"], npz["labels"])
    paths = index.relpaths()
    assert paths[0] == "train/a/0.jpg"
    changed = SampleIndex.build("", [relpath, *paths[1:]], index.labels)
    _rewrite(path, path_bytes=changed.path_bytes, offsets=changed.offsets)


def _tamper_meta(path: Path, old: bytes, new: bytes) -> None:
    with np.load(path) as npz:
        data = npz["meta"].tobytes()
    assert old in data
    _rewrite(path, meta=np.frombuffer(data.replace(old, new, 1), np.uint8))


@pytest.mark.parametrize("tamper", list(TAMPERING))
def test_a_damaged_or_foreign_cache_file_is_ignored_and_the_folder_rescanned(root, cache_dir, scans, caplog, tamper):
    ImageFolderDataset(root, "train")
    path = _only_cache_file(cache_dir)
    TAMPERING[tamper](path)
    with caplog.at_level(logging.INFO, logger="paddletrain"):
        second = ImageFolderDataset(root, "train")
    assert scans.calls == 2
    _same(second, _fresh(root))
    assert any("ignoring the cached scan" in r.getMessage() for r in caplog.records)
    assert (path.stat().st_mode & 0o777) == 0o600  # rewritten by the rescan, readable by this user only


def test_a_cache_bigger_than_its_bound_is_not_read(root, cache_dir, scans, monkeypatch):
    ImageFolderDataset(root, "train")
    monkeypatch.setattr(scancache, "MAX_CACHE_BYTES", 100)
    assert load_scan(root, "train") is None
    with zipfile.ZipFile(_only_cache_file(cache_dir)) as z:  # what the bound is checked against
        assert sum(i.file_size for i in z.infolist()) > 100


def test_an_unwritable_cache_directory_is_logged_not_fatal(root, tmp_path, monkeypatch, scans, caplog):
    blocker = tmp_path / "file"
    blocker.write_text("a file where the cache directory should be")
    monkeypatch.setenv(CACHE_DIR_ENV, str(blocker))
    with caplog.at_level(logging.INFO, logger="paddletrain"):
        assert len(ImageFolderDataset(root, "train")) == 11
    assert any("not cached: cannot write" in r.getMessage() for r in caplog.records)


def test_the_cache_directory_follows_the_environment(monkeypatch, tmp_path):
    monkeypatch.setenv(CACHE_DIR_ENV, str(tmp_path / "c"))
    assert scan_cache_dir() == tmp_path / "c" / "scans"
    monkeypatch.delenv(CACHE_DIR_ENV)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    assert scan_cache_dir() == tmp_path / "xdg" / "paddletrain" / "scans"
    monkeypatch.delenv("XDG_CACHE_HOME")
    assert scan_cache_dir() == Path.home() / ".cache" / "paddletrain" / "scans"
