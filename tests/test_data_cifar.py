"""CifarDataset: tiny fake archives in both CIFAR layouts, the restricted unpickler, errors naming the file."""
from __future__ import annotations

import codecs
import io
import os
import pickle
import tarfile
from pathlib import Path

import numpy as np
import paddle.dataset.common
import pytest
from paddle.vision.datasets import cifar as paddle_cifar

from paddletrain.config import DataConfig
from paddletrain.data.datasets import DatasetError, build_datasets
from paddletrain.data.formats.cifar import LAYOUTS, CifarDataset, safe_load


def _pickle(obj) -> bytes:
    return pickle.dumps(obj, protocol=2)


def _batch(rng, n: int, labels_key: bytes, num_classes: int) -> dict:
    return {
        b"batch_label": b"fake batch",
        b"data": rng.integers(0, 256, (n, 3072), dtype=np.uint8),
        labels_key: [int(x) for x in rng.integers(0, num_classes, n)],
        b"filenames": [b"img_%d.png" % i for i in range(n)],
    }


def make_archive(root: Path, kind: str, members: dict | None = None, extracted: bool = False) -> dict:
    """Write a tiny CIFAR-like archive (or extracted folder) into root; returns the member objects."""
    layout = LAYOUTS[kind]
    rng = np.random.default_rng(0)
    if members is None:
        n_classes = 10 if kind == "cifar10" else 100
        names = [f"class{i}".encode() for i in range(n_classes)]
        if kind == "cifar10":
            members = {f"data_batch_{i}": _batch(rng, 3, layout.labels_key, n_classes) for i in (2, 1)}
            members.update({"test_batch": _batch(rng, 2, layout.labels_key, n_classes),
                            "batches.meta": {b"label_names": names}})
        else:
            members = {"train": _batch(rng, 4, layout.labels_key, n_classes),
                       "test": _batch(rng, 2, layout.labels_key, n_classes),
                       "meta": {b"fine_label_names": names, b"coarse_label_names": [b"c"] * 20}}  # fmt: skip
    root.mkdir(parents=True, exist_ok=True)
    if extracted:
        folder = root / layout.folder
        folder.mkdir()
        for name, obj in members.items():
            (folder / name).write_bytes(obj if isinstance(obj, bytes) else _pickle(obj))
        return members
    with tarfile.open(root / layout.archive, "w:gz") as tar:
        for name, obj in members.items():
            data = obj if isinstance(obj, bytes) else _pickle(obj)
            info = tarfile.TarInfo(f"{layout.folder}/{name}")
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
    return members


@pytest.mark.parametrize("extracted", [False, True], ids=["archive", "extracted"])
def test_cifar10_train_batches_in_order_as_hwc(tmp_path: Path, extracted: bool) -> None:
    members = make_archive(tmp_path, "cifar10", extracted=extracted)
    ds = CifarDataset(tmp_path, "train", kind="cifar10")
    assert len(ds) == 6 and ds.in_chans == 3 and ds.classes[:2] == ["class0", "class1"] and len(ds.classes) == 10
    first, second = members["data_batch_1"], members["data_batch_2"]
    assert list(ds.targets) == first[b"labels"] + second[b"labels"]
    image, label = ds[4]
    assert image.shape == (32, 32, 3) and image.dtype == np.uint8 and label.dtype == np.int64
    np.testing.assert_array_equal(image, second[b"data"][1].reshape(3, 32, 32).transpose(1, 2, 0))
    assert ds.describe(4).endswith("data_batch_2[1]") and ds.describe(0).endswith("data_batch_1[0]")


def test_cifar100_fine_labels_and_val_split(tmp_path: Path) -> None:
    members = make_archive(tmp_path, "cifar100")
    ds = CifarDataset(tmp_path / LAYOUTS["cifar100"].archive, "val", kind="cifar100")  # the archive path works too
    assert len(ds.classes) == 100 and list(ds.targets) == members["test"][b"fine_labels"]


def test_factory(tmp_path: Path) -> None:
    make_archive(tmp_path, "cifar10")
    splits = build_datasets(DataConfig(name="cifar10", root=str(tmp_path)))
    assert (len(splits.train), len(splits.val), splits.in_chans, len(splits.classes)) == (6, 2, 3, 10)


class _Exploit:
    """Unpickling this runs a shell command that leaves a marker file."""

    def __init__(self, marker: Path) -> None:
        self.marker = marker

    def __reduce__(self):
        return (os.system, (f"touch {self.marker}",))


def test_restricted_unpickler_refuses_arbitrary_globals(tmp_path: Path) -> None:
    marker = tmp_path / "pwned"
    with pytest.raises(DatasetError, match="CIFAR batch 'evil'.*references (posix|os).system"):
        safe_load(_pickle({b"data": _Exploit(marker)}), "evil")
    members = {"test_batch": {b"data": _Exploit(marker), b"labels": [0]}, "batches.meta": {b"label_names": [b"a"]}}
    make_archive(tmp_path / "root", "cifar10", members={k: _pickle(v) for k, v in members.items()})
    with pytest.raises(DatasetError, match="test_batch.*references (posix|os).system"):
        CifarDataset(tmp_path / "root", "val")
    assert not marker.exists()


def test_restricted_unpickler_refuses_other_codecs() -> None:
    class _Codec:
        def __reduce__(self):
            return (codecs.encode, ("x", "rot13"))

    with pytest.raises(DatasetError, match="_codecs.encode is called with other arguments"):
        safe_load(_pickle(_Codec()), "codec")


@pytest.mark.parametrize("protocol", [2, 4, 5])
def test_restricted_unpickler_still_reads_numpy_arrays(protocol: int) -> None:
    array = np.arange(12, dtype=np.uint8).reshape(3, 4)
    loaded = safe_load(pickle.dumps({b"data": array, b"labels": [1, 2]}, protocol=protocol), "ok")
    np.testing.assert_array_equal(loaded[b"data"], array)


def test_missing_archive_names_directory_and_download(tmp_path: Path) -> None:
    with pytest.raises(DatasetError) as info:
        CifarDataset(tmp_path, "train", kind="cifar100")
    assert str(tmp_path) in str(info.value) and "cifar-100-python.tar.gz" in str(info.value)
    assert "data.download=true" in str(info.value)


def test_corrupt_archive_names_file(tmp_path: Path) -> None:
    (tmp_path / "cifar-10-python.tar.gz").write_bytes(b"not a tarball")
    with pytest.raises(DatasetError, match="cifar-10-python.tar.gz"):
        CifarDataset(tmp_path, "train")


def test_bad_batch_shape_names_member(tmp_path: Path) -> None:
    members = {"test_batch": {b"data": np.zeros((2, 100), np.uint8), b"labels": [0, 1]},
               "batches.meta": {b"label_names": [b"a", b"b"]}}  # fmt: skip
    make_archive(tmp_path, "cifar10", members=members)
    with pytest.raises(DatasetError, match="test_batch.*uint8 \\(N, 3072\\)"):
        CifarDataset(tmp_path, "val")


def test_missing_meta_is_an_error(tmp_path: Path) -> None:
    rng = np.random.default_rng(0)
    make_archive(tmp_path, "cifar10", members={"test_batch": _batch(rng, 2, b"labels", 10)})
    with pytest.raises(DatasetError, match="batches.meta"):
        CifarDataset(tmp_path, "val")


def test_download_uses_paddle_downloader(tmp_path: Path, monkeypatch) -> None:
    source = tmp_path / "cache"
    make_archive(source, "cifar10")
    requested = []

    def fake_download(url: str, module: str, md5: str) -> str:
        requested.append((url, module, md5))
        return str(source / LAYOUTS["cifar10"].archive)

    monkeypatch.setattr(paddle.dataset.common, "download", fake_download)
    ds = CifarDataset(tmp_path / "root", "val", download=True)
    assert len(ds) == 2 and (tmp_path / "root" / "cifar-10-python.tar.gz").is_file()
    assert requested == [(paddle_cifar.CIFAR10_URL, "cifar", paddle_cifar.CIFAR10_MD5)]


def test_root_with_tilde_is_expanded(tmp_path: Path, monkeypatch) -> None:
    make_archive(tmp_path / "cifar", "cifar10")
    monkeypatch.setenv("HOME", str(tmp_path))
    assert len(CifarDataset("~/cifar", "val")) == 2
