"""The one index of a dataset read from files: its paths and labels in NumPy arrays.

An image folder and a label list (single- or multi-label) all become a :class:`SampleIndex` before anything
else sees them, so samplers, loaders, metrics and ``predict`` never care where a dataset came from.

Why arrays: a Python list of 1.28 M path strings is 1.28 M objects, and every loader worker that reads one
writes its reference count, so the pages holding them are copied into each worker one by one as an epoch goes.
Here the paths are one ``uint8`` buffer with ``int64`` offsets and the labels one array: a handful of objects
whose pages the workers share after a fork (reading them writes nothing) or receive once after a spawn.
"""
from __future__ import annotations

import os
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np

__all__ = ["SampleIndex"]


@dataclass(frozen=True, eq=False)
class SampleIndex:
    """Paths relative to ``root`` and their labels.

    ``path_bytes`` holds the file-system encoded relative paths back to back, sample ``i`` at
    ``path_bytes[offsets[i]:offsets[i + 1]]``. ``labels`` is ``int64 [n]`` (class indices) or ``uint8 [n, C]``
    (multi-hot rows, one column per class).
    """

    root: str
    path_bytes: np.ndarray
    offsets: np.ndarray
    labels: np.ndarray

    @classmethod
    def build(cls, root: str | Path, relpaths: Sequence[str], labels: Sequence[int] | np.ndarray) -> SampleIndex:
        """An index of ``relpaths`` (relative to ``root``) labelled by ``labels`` (class indices or multi-hot rows)."""
        joined = "".join(relpaths)
        if joined.isascii():  # the usual case: one encode, and each path's length in bytes is its length
            data = joined.encode("ascii")
            lengths = np.fromiter(map(len, relpaths), np.int64, len(relpaths))
        else:
            encoded = [os.fsencode(p) for p in relpaths]
            data = b"".join(encoded)
            lengths = np.fromiter(map(len, encoded), np.int64, len(encoded))
        offsets = np.zeros(len(lengths) + 1, np.int64)
        np.cumsum(lengths, out=offsets[1:])
        labels = np.asarray(labels)
        labels = labels.astype(np.uint8 if labels.ndim == 2 else np.int64, copy=False)
        if labels.ndim == 1 and not len(labels):
            labels = np.zeros(0, np.int64)
        if len(labels) != len(lengths):
            raise ValueError(f"{len(lengths)} paths but {len(labels)} labels")
        return cls(str(root), np.frombuffer(data, np.uint8), offsets, labels)

    def __len__(self) -> int:
        return len(self.offsets) - 1

    def relpath(self, index: int) -> str:
        """Sample ``index``'s path relative to :attr:`root`."""
        return os.fsdecode(self.path_bytes[self.offsets[index]:self.offsets[index + 1]].tobytes())

    def path(self, index: int) -> str:
        """Sample ``index``'s path (``root`` joined with its relative path)."""
        return os.path.join(self.root, self.relpath(index))

    def relpaths(self) -> list[str]:
        """Every relative path, in order (a list: for checks and reports, not for the loader's workers)."""
        return [self.relpath(i) for i in range(len(self))]

    @property
    def multilabel(self) -> bool:
        return self.labels.ndim == 2

    @property
    def nbytes(self) -> int:
        """The memory the index's arrays hold."""
        return self.path_bytes.nbytes + self.offsets.nbytes + self.labels.nbytes
