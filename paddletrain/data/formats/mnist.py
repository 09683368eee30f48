"""MNIST and Fashion-MNIST read from their IDX files (``*-idx3-ubyte.gz`` / ``*-idx1-ubyte.gz``).

The files are read with numpy + gzip and checked (magic number, sizes, matching counts, label range) so a
truncated or mislabelled file fails at construction with its name. They are searched in ``root``; with
``root=None`` in Paddle's download cache and, for Fashion-MNIST, where Debian's ``dataset-fashion-mnist``
package puts them. Nothing is downloaded unless ``download=True``, which uses Paddle's downloader and the
URLs/checksums of ``paddle.vision.datasets``.
"""
from __future__ import annotations

import gzip
import os
import shutil
from pathlib import Path

import numpy as np
from paddle.dataset import common as paddle_dataset  # module, not names: tests replace its download()
from paddle.vision.datasets import MNIST, FashionMNIST

from paddletrain.data.datasets import (
    DatasetError,
    ImageDataset,
    Transform,
    paddle_cache_dir,
    register_dataset,
    split_builder,
)

FASHION_MNIST_CLASSES = [
    "T-shirt/top", "Trouser", "Pullover", "Dress", "Coat", "Sandal", "Shirt", "Sneaker", "Bag", "Ankle boot",
]  # fmt: skip
MNIST_CLASSES = [str(digit) for digit in range(10)]
CLASSES: dict[str, list[str]] = {"mnist": MNIST_CLASSES, "fashion_mnist": FASHION_MNIST_CLASSES}

# split -> (images file, labels file); "val" is the official test set.
FILES: dict[str, tuple[str, str]] = {
    "train": ("train-images-idx3-ubyte.gz", "train-labels-idx1-ubyte.gz"),
    "val": ("t10k-images-idx3-ubyte.gz", "t10k-labels-idx1-ubyte.gz"),
}
DEBIAN_FASHION_MNIST_DIR = "/usr/share/datasets/fashion-mnist"
_IMAGES_MAGIC, _LABELS_MAGIC = 2051, 2049


def _paddle_dataset_class(kind: str):
    return FashionMNIST if kind == "fashion_mnist" else MNIST


def default_search_dirs(kind: str) -> list[Path]:
    """Directories tried when ``data.root`` is not set."""
    dirs = [paddle_cache_dir(_paddle_dataset_class(kind).NAME)]
    if kind == "fashion_mnist":
        dirs.append(Path(DEBIAN_FASHION_MNIST_DIR))
    return dirs


def read_idx(path: str | Path, magic: int) -> np.ndarray:
    """An IDX array of unsigned bytes (``.gz`` or raw), checked against ``magic`` and its declared size."""
    path = str(path)
    opener = gzip.open if path.endswith(".gz") else open
    try:
        with opener(path, "rb") as f:
            data = f.read()
    except (OSError, EOFError) as e:
        raise DatasetError(f"cannot read IDX file {path!r}: {e}") from e
    if len(data) < 4:
        raise DatasetError(f"IDX file {path!r} is too short ({len(data)} bytes) to hold a header")
    found = int.from_bytes(data[:4], "big")
    if found != magic:
        raise DatasetError(f"IDX file {path!r} has magic number {found}, expected {magic}; is it the right file?")
    ndim = data[3]
    header = 4 + 4 * ndim
    shape = tuple(int.from_bytes(data[4 + 4 * i : 8 + 4 * i], "big") for i in range(ndim))
    expected = header + int(np.prod(shape))
    if len(data) != expected:
        raise DatasetError(
            f"IDX file {path!r} declares shape {shape} ({expected} bytes) but holds {len(data)} bytes; truncated?"
        )
    return np.frombuffer(data, dtype=np.uint8, offset=header).reshape(shape)


def _find(directory: Path, name: str) -> Path | None:
    """The ``.gz`` file, or its uncompressed twin."""
    for candidate in (directory / name, directory / name[: -len(".gz")]):
        if candidate.is_file():
            return candidate
    return None


def _download(kind: str, split: str, target: Path) -> None:
    """Fetch the split's two files with Paddle's downloader (md5-checked) and copy them into ``target``."""
    cls = _paddle_dataset_class(kind)
    prefix = "TRAIN" if split == "train" else "TEST"
    target.mkdir(parents=True, exist_ok=True)
    for part in ("IMAGE", "LABEL"):
        url, md5 = getattr(cls, f"{prefix}_{part}_URL"), getattr(cls, f"{prefix}_{part}_MD5")
        fetched = Path(paddle_dataset.download(url, cls.NAME, md5))
        name = FILES[split][0 if part == "IMAGE" else 1]
        if fetched.resolve() != (target / name).resolve():
            shutil.copyfile(fetched, target / name)


class IDXDataset(ImageDataset):
    """MNIST (``kind="mnist"``) or Fashion-MNIST (``kind="fashion_mnist"``): 28x28x1 uint8 images.

    ``split="val"`` is the official 10k test set. With ``root=None`` the files are looked for in
    ``default_search_dirs(kind)``; ``download=True`` fetches missing files into ``root`` (or Paddle's cache).
    """

    in_chans = 1

    def __init__(
        self,
        root: str | Path | None,
        split: str = "train",
        kind: str = "fashion_mnist",
        transform: Transform = None,
        download: bool = False,
    ) -> None:
        super().__init__(transform)
        if kind not in CLASSES:
            raise DatasetError(f"IDX dataset kind must be one of {sorted(CLASSES)}, got {kind!r}")
        if split not in FILES:
            raise DatasetError(f"{kind} split must be one of {sorted(FILES)}, got {split!r}")
        self.kind, self.split = kind, split
        self.classes = list(CLASSES[kind])
        self.directory = self._locate(root, download)
        images_path = _find(self.directory, FILES[split][0])
        labels_path = _find(self.directory, FILES[split][1])
        assert images_path is not None and labels_path is not None  # _locate guarantees both
        images = read_idx(images_path, _IMAGES_MAGIC)
        labels = read_idx(labels_path, _LABELS_MAGIC)
        if images.ndim != 3 or labels.ndim != 1:
            raise DatasetError(
                f"{images_path} / {labels_path}: expected images (N, H, W) and labels (N,), "
                f"got {images.shape} and {labels.shape}"
            )
        if len(images) != len(labels):
            raise DatasetError(f"{images_path} has {len(images)} images but {labels_path} has {len(labels)} labels")
        if len(labels) and labels.max() >= len(self.classes):
            raise DatasetError(f"{labels_path} has label {labels.max()}, but {kind} has {len(self.classes)} classes")
        self.images_path = images_path
        self.images = images[..., None]  # HWC with C=1
        self.targets = labels.astype(np.int64)

    def _locate(self, root: str | Path | None, download: bool) -> Path:
        dirs = [Path(root).expanduser()] if root else default_search_dirs(self.kind)
        names = FILES[self.split]
        for directory in dirs:
            if all(_find(directory, name) for name in names):
                return directory
        if download:
            _download(self.kind, self.split, dirs[0])
            return dirs[0]
        where = " or ".join(repr(str(d)) for d in dirs)
        hint = " (Debian: apt-get install dataset-fashion-mnist)" if self.kind == "fashion_mnist" else ""
        raise DatasetError(
            f"{self.kind} {self.split} files {list(names)} not found in {where}; point data.root at the directory "
            f"holding them, or set data.download=true to fetch them with Paddle's downloader{hint}"
        )

    def load_image(self, index: int) -> np.ndarray:
        return self.images[index]

    def describe(self, index: int) -> str:
        return f"{os.fspath(self.images_path)}[{index}]"


# data.root None: Paddle's download cache, or Debian's fashion-mnist package (IDXDataset looks in both).
build_mnist = register_dataset("mnist")(split_builder(
    IDXDataset, "mnist", "``data.name=mnist``: the IDX files in ``data.root`` (or Paddle's cache; ``data.download`` "
    "fetches them)."))
build_fashion_mnist = register_dataset("fashion_mnist")(split_builder(
    IDXDataset, "fashion_mnist", "``data.name=fashion_mnist``: as ``mnist``, also found where Debian's dataset "
    "package installs it."))
