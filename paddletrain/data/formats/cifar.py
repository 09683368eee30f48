"""CIFAR-10 / CIFAR-100 read from the python-pickle archives Paddle downloads (``cifar-10{,0}-python.tar.gz``).

The batches inside are pickles, and unpickling runs whatever the file asks for. They are read with the
checkpoint reader's restricted unpickler (:mod:`paddletrain.checkpoint.safe_pickle`), which only rebuilds
numpy arrays and plain containers and refuses every other global, so a tampered archive fails with an error
instead of running code. An already extracted ``cifar-10-batches-py`` /
``cifar-100-python`` directory next to the archive works too.
"""
from __future__ import annotations

import shutil
import tarfile
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import numpy as np
from paddle.dataset import common as paddle_dataset  # module, not names: tests replace its download()
from paddle.vision.datasets import cifar as paddle_cifar

from paddletrain.checkpoint import safe_pickle
from paddletrain.checkpoint.errors import CheckpointError
from paddletrain.data.datasets import (
    DatasetError,
    ImageDataset,
    Transform,
    paddle_cache_dir,
    register_dataset,
    split_builder,
)


class _Layout:
    def __init__(self, archive: str, folder: str, members: dict[str, Callable[[str], bool]], meta: str,
                 labels_key: bytes, names_key: bytes, url_attr: str) -> None:  # fmt: skip
        self.archive, self.folder, self.members, self.meta = archive, folder, members, meta
        self.labels_key, self.names_key, self.url_attr = labels_key, names_key, url_attr


LAYOUTS: dict[str, _Layout] = {
    "cifar10": _Layout(
        "cifar-10-python.tar.gz", "cifar-10-batches-py",
        {"train": lambda n: n.startswith("data_batch"), "val": lambda n: n == "test_batch"},
        "batches.meta", b"labels", b"label_names", "CIFAR10",
    ),
    "cifar100": _Layout(
        "cifar-100-python.tar.gz", "cifar-100-python",
        {"train": lambda n: n == "train", "val": lambda n: n == "test"},
        "meta", b"fine_labels", b"fine_label_names", "CIFAR100",
    ),
}  # fmt: skip


def safe_load(data: bytes, source: str) -> Any:
    """Unpickle a batch (a Python 2 pickle: str read as bytes) with the checkpoint reader's rules; errors name
    ``source``."""
    try:
        return safe_pickle.loads(data, f"CIFAR batch {source!r}", encoding="bytes")
    except CheckpointError as e:  # refused or malformed: either way a bad file
        raise DatasetError(str(e)) from e


def _members(root: Path, layout: _Layout) -> Iterator[tuple[str, str, bytes]]:
    """(file name, source for messages, bytes) of each file in the tar.gz or the extracted folder."""
    archive = root / layout.archive if root.is_dir() else root
    if archive.is_file():
        try:
            with tarfile.open(archive, "r:*") as tar:
                for member in tar:
                    if member.isfile():
                        handle = tar.extractfile(member)
                        assert handle is not None
                        yield member.name.rsplit("/", 1)[-1], f"{archive}:{member.name}", handle.read()
        except (tarfile.TarError, OSError, EOFError) as e:
            raise DatasetError(f"cannot read CIFAR archive {str(archive)!r}: {e}") from e
        return
    folder = root / layout.folder
    for path in sorted(folder.iterdir()):
        if path.is_file():
            yield path.name, str(path), path.read_bytes()


def _download(kind: str, target: Path) -> None:
    layout = LAYOUTS[kind]
    url, md5 = getattr(paddle_cifar, f"{layout.url_attr}_URL"), getattr(paddle_cifar, f"{layout.url_attr}_MD5")
    fetched = Path(paddle_dataset.download(url, "cifar", md5))
    target.mkdir(parents=True, exist_ok=True)
    if fetched.resolve() != (target / layout.archive).resolve():
        shutil.copyfile(fetched, target / layout.archive)


class CifarDataset(ImageDataset):
    """CIFAR-10 (``kind="cifar10"``) or CIFAR-100 fine labels (``kind="cifar100"``): 32x32x3 uint8 images.

    ``root`` is the directory holding the archive (or the archive path itself); ``None`` means Paddle's download
    cache. ``split="val"`` is the official test batch. ``download=True`` fetches a missing archive with
    Paddle's downloader (md5-checked) into ``root``.
    """

    in_chans = 3

    def __init__(
        self,
        root: str | Path | None,
        split: str = "train",
        kind: str = "cifar10",
        transform: Transform = None,
        download: bool = False,
    ) -> None:
        super().__init__(transform)
        if kind not in LAYOUTS:
            raise DatasetError(f"CIFAR kind must be one of {sorted(LAYOUTS)}, got {kind!r}")
        layout = LAYOUTS[kind]
        if split not in layout.members:
            raise DatasetError(f"{kind} split must be one of {sorted(layout.members)}, got {split!r}")
        self.kind, self.split = kind, split
        self.root = Path(root).expanduser() if root else paddle_cache_dir("cifar")
        if not self._present(layout):
            if not download:
                raise DatasetError(
                    f"{kind}: neither {layout.archive!r} nor {layout.folder + '/'!r} found in {str(self.root)!r}; "
                    f"point data.root at the directory holding it, or set data.download=true"
                )
            _download(kind, self.root)
        self._load(layout)

    def _present(self, layout: _Layout) -> bool:
        if self.root.is_file():
            return True
        return (self.root / layout.archive).is_file() or (self.root / layout.folder).is_dir()

    def _load(self, layout: _Layout) -> None:
        wanted = layout.members[self.split]
        batches: list[tuple[str, dict[bytes, Any]]] = []
        meta: dict[bytes, Any] | None = None
        for name, source, data in _members(self.root, layout):
            if wanted(name):
                batches.append((source, safe_load(data, source)))
            elif name == layout.meta:
                meta = safe_load(data, source)
        where = str(self.root)
        if not batches:
            raise DatasetError(f"{self.kind}: no {self.split} batches in {where!r}; "
                               f"is it the {layout.archive} archive?")
        if meta is None or layout.names_key not in meta:
            raise DatasetError(f"{self.kind}: {layout.meta!r} with {layout.names_key!r} missing from {where!r}")
        self.classes = [n.decode() if isinstance(n, bytes) else str(n) for n in meta[layout.names_key]]
        images, labels = [], []
        batches.sort(key=lambda item: item[0])
        for source, batch in batches:
            data, batch_labels = _check_batch(batch, layout.labels_key, source)
            images.append(data)
            labels.append(batch_labels)
        self.targets = np.concatenate(labels)
        if self.targets.max() >= len(self.classes):
            raise DatasetError(f"{self.kind}: label {self.targets.max()} in {where!r} but {len(self.classes)} classes")
        # Stored CHW-flat per row; transposed once so every sample is a contiguous HWC array.
        self.images = np.ascontiguousarray(np.concatenate(images).reshape(-1, 3, 32, 32).transpose(0, 2, 3, 1))
        self.sources = [source for source, _ in batches]
        self._offsets = np.cumsum([len(x) for x in labels])

    def load_image(self, index: int) -> np.ndarray:
        return self.images[index]

    def describe(self, index: int) -> str:
        batch = int(np.searchsorted(self._offsets, index, side="right"))
        first = int(self._offsets[batch - 1]) if batch else 0
        return f"{self.sources[batch]}[{index - first}]"


def _check_batch(batch: Any, labels_key: bytes, source: str) -> tuple[np.ndarray, np.ndarray]:
    if not isinstance(batch, dict) or b"data" not in batch or labels_key not in batch:
        raise DatasetError(f"CIFAR batch {source!r} is not a dict with b'data' and {labels_key!r}")
    data, labels = batch[b"data"], np.asarray(batch[labels_key], dtype=np.int64)
    if not isinstance(data, np.ndarray) or data.dtype != np.uint8 or data.ndim != 2 or data.shape[1] != 3 * 32 * 32:
        raise DatasetError(f"CIFAR batch {source!r}: data must be a uint8 (N, 3072) array, got {_shape(data)}")
    if labels.shape != (len(data),):
        raise DatasetError(f"CIFAR batch {source!r} has {len(data)} images but {labels.shape[0]} labels")
    return data, labels


def _shape(value: Any) -> str:
    return f"{value.dtype} {value.shape}" if isinstance(value, np.ndarray) else type(value).__name__


build_cifar10 = register_dataset("cifar10")(split_builder(
    CifarDataset, "cifar10", "``data.name=cifar10``: the python archive in ``data.root`` (or Paddle's cache; "
    "``data.download``)."))
build_cifar100 = register_dataset("cifar100")(split_builder(
    CifarDataset, "cifar100", "``data.name=cifar100``: fine labels, otherwise as ``cifar10``."))
