"""IDXDataset (MNIST / Fashion-MNIST): IDX parsing, validation errors naming the file, download plumbing."""
from __future__ import annotations

import gzip
import os
from pathlib import Path

import numpy as np
import paddle.dataset.common
import pytest
from paddle.vision.datasets import FashionMNIST

from paddletrain.config import DataConfig
from paddletrain.data.datasets import DatasetError, build_datasets
from paddletrain.data.formats import mnist
from paddletrain.data.formats.mnist import FASHION_MNIST_CLASSES, FILES, IDXDataset, read_idx


def _idx_bytes(array: np.ndarray, magic: int) -> bytes:
    header = magic.to_bytes(4, "big") + b"".join(int(d).to_bytes(4, "big") for d in array.shape)
    return header + array.astype(np.uint8).tobytes()


def write_idx_split(directory: Path, split: str, images: np.ndarray, labels: np.ndarray, gz: bool = True) -> None:
    directory.mkdir(parents=True, exist_ok=True)
    for name, payload in zip(FILES[split], (_idx_bytes(images, 2051), _idx_bytes(labels, 2049)), strict=True):
        if gz:
            with gzip.open(directory / name, "wb") as f:
                f.write(payload)
        else:
            (directory / name[: -len(".gz")]).write_bytes(payload)


@pytest.fixture
def idx_root(tmp_path: Path) -> Path:
    rng = np.random.default_rng(0)
    write_idx_split(tmp_path, "train", rng.integers(0, 256, (6, 28, 28)), np.array([0, 1, 2, 9, 9, 3]))
    write_idx_split(tmp_path, "val", rng.integers(0, 256, (3, 28, 28)), np.array([5, 6, 7]), gz=False)
    return tmp_path


def test_reads_images_and_labels(idx_root: Path) -> None:
    ds = IDXDataset(idx_root, "train", kind="fashion_mnist")
    assert len(ds) == 6 and ds.in_chans == 1 and ds.classes == FASHION_MNIST_CLASSES
    image, label = ds[3]
    assert image.shape == (28, 28, 1) and image.dtype == np.uint8
    assert label.dtype == np.int64 and label == 9
    with gzip.open(idx_root / FILES["train"][0]) as f:
        raw = np.frombuffer(f.read(), np.uint8, offset=16).reshape(6, 28, 28)
    np.testing.assert_array_equal(image[..., 0], raw[3])
    assert ds.describe(3) == f"{idx_root / FILES['train'][0]}[3]"


def test_uncompressed_files_and_mnist_classes(idx_root: Path) -> None:
    ds = IDXDataset(idx_root, "val", kind="mnist")
    assert ds.classes == [str(d) for d in range(10)]
    assert list(ds.targets) == [5, 6, 7]


def test_missing_files_error_names_directory_files_and_remedies(tmp_path: Path) -> None:
    with pytest.raises(DatasetError) as info:
        IDXDataset(tmp_path, "train", kind="fashion_mnist")
    message = str(info.value)
    for fragment in (str(tmp_path), "train-images-idx3-ubyte.gz", "data.download=true", "dataset-fashion-mnist"):
        assert fragment in message


def test_wrong_magic_names_file(idx_root: Path) -> None:
    images, labels = FILES["train"]
    os.replace(idx_root / labels, idx_root / "tmp")
    os.replace(idx_root / images, idx_root / labels)  # an images file where the labels should be
    os.replace(idx_root / "tmp", idx_root / images)
    with pytest.raises(DatasetError, match=f"{images}.*magic number 2049, expected 2051"):
        IDXDataset(idx_root, "train")


def test_truncated_file_names_file(tmp_path: Path) -> None:
    path = tmp_path / "x.gz"
    with gzip.open(path, "wb") as f:
        f.write(_idx_bytes(np.zeros((4, 28, 28)), 2051)[:-10])
    with pytest.raises(DatasetError, match=f"{path}.*declares shape \\(4, 28, 28\\).*truncated"):
        read_idx(path, 2051)


def test_count_mismatch_and_label_range(tmp_path: Path) -> None:
    write_idx_split(tmp_path / "a", "train", np.zeros((3, 28, 28)), np.array([0, 1]))
    with pytest.raises(DatasetError, match="has 3 images but .*labels-idx1-ubyte.gz has 2 labels"):
        IDXDataset(tmp_path / "a", "train")
    write_idx_split(tmp_path / "b", "train", np.zeros((2, 28, 28)), np.array([0, 10]))
    with pytest.raises(DatasetError, match="label 10"):
        IDXDataset(tmp_path / "b", "train")


def test_not_gzip_names_file(tmp_path: Path) -> None:
    for name in FILES["train"]:
        (tmp_path / name).write_bytes(b"plain bytes, not gzip")
    with pytest.raises(DatasetError, match=FILES["train"][0]):
        IDXDataset(tmp_path, "train")


def test_download_uses_paddle_downloader_and_fills_root(idx_root: Path, tmp_path: Path, monkeypatch) -> None:
    requested = []

    def fake_download(url: str, module: str, md5: str) -> str:
        requested.append((url, module, md5))
        return str(idx_root / Path(url).name)

    monkeypatch.setattr(paddle.dataset.common, "download", fake_download)
    target = tmp_path / "fresh"
    ds = IDXDataset(target, "train", kind="fashion_mnist", download=True)
    assert len(ds) == 6 and sorted(p.name for p in target.iterdir()) == sorted(FILES["train"])
    assert requested == [
        (FashionMNIST.TRAIN_IMAGE_URL, "fashion-mnist", FashionMNIST.TRAIN_IMAGE_MD5),
        (FashionMNIST.TRAIN_LABEL_URL, "fashion-mnist", FashionMNIST.TRAIN_LABEL_MD5),
    ]


def test_root_none_searches_default_dirs(idx_root: Path, monkeypatch) -> None:
    monkeypatch.setattr(mnist, "default_search_dirs", lambda kind: [idx_root.parent / "absent", idx_root])
    assert len(IDXDataset(None, "train")) == 6


def test_factory(idx_root: Path) -> None:
    splits = build_datasets(DataConfig(name="mnist", root=str(idx_root)))
    assert splits.in_chans == 1 and splits.classes[0] == "0"
    assert (len(splits.train), len(splits.val)) == (6, 3)


@pytest.mark.skipif(not Path(mnist.DEBIAN_FASHION_MNIST_DIR).is_dir(), reason="dataset-fashion-mnist not installed")
def test_debian_fashion_mnist_package() -> None:
    ds = IDXDataset(mnist.DEBIAN_FASHION_MNIST_DIR, "val", kind="fashion_mnist")
    assert len(ds) == 10000 and np.bincount(ds.targets).tolist() == [1000] * 10
    assert ds[0][0].shape == (28, 28, 1)


def test_root_with_tilde_is_expanded(idx_root: Path, monkeypatch) -> None:
    monkeypatch.setenv("HOME", str(idx_root.parent))
    assert len(IDXDataset(f"~/{idx_root.name}", "val")) == 3
