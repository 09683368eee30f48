"""Images without labels, added to the training split for label-free distillation (SSLD).

PaddleClas' SSLD mined unlabeled ImageNet-22k images: the student learns from the teacher's outputs only, so
any image helps. ``trainer.distill.unlabeled_root`` names a folder of such images (any depth, no class
directories); they join the training split with the label :data:`UNLABELED`, which no loss reads (the
distillation weight must be 1) and no prediction matches (train accuracy counts them as misses).
"""
from __future__ import annotations

import logging
import os
import stat
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
from PIL import Image

from paddletrain.data.datasets import BadSampleError, DatasetError, ImageDataset, Transform
from paddletrain.data.formats.images import ImageReadError, is_image_file, open_image

log = logging.getLogger("paddletrain")

# The label of an image without one.
UNLABELED = -1
# Bounds on what one folder may add: a mistyped root ("/") must fail quickly, not walk the whole disk.
MAX_UNLABELED_IMAGES = 10_000_000
_MODES = {1: "L", 3: "RGB"}


def scan_images(root: Path) -> list[str]:
    """Sorted paths of the visible image files under ``root``, at any depth, confined to it: symlinked
    directories are not followed and symlinked files must resolve inside ``root``."""
    real_root = os.path.realpath(root)
    found: list[str] = []
    for top, dirs, files in os.walk(root, followlinks=False):
        dirs[:] = sorted(d for d in dirs if not d.startswith("."))
        for name in sorted(files):
            path = os.path.join(top, name)
            if not is_image_file(path):
                continue
            real = os.path.realpath(path)
            if os.path.commonpath([real, real_root]) != real_root or not stat.S_ISREG(os.stat(real).st_mode):
                continue
            found.append(path)
            if len(found) > MAX_UNLABELED_IMAGES:
                raise DatasetError(f"trainer.distill.unlabeled_root={str(root)!r} holds more than "
                                   f"{MAX_UNLABELED_IMAGES} images; point it at the image folder itself")
    return found


class UnlabeledImageFolder(ImageDataset):
    """Every image under ``root`` with the label :data:`UNLABELED` and the labelled split's ``classes``."""

    def __init__(self, root: str | Path, classes: Sequence[str], in_chans: int = 3,
                 transform: Transform = None) -> None:
        super().__init__(transform)
        self.root = Path(root).expanduser()
        if not self.root.is_dir():
            raise DatasetError(f"trainer.distill.unlabeled_root={str(root)!r} is not a directory")
        self.samples = scan_images(self.root)
        if not self.samples:
            raise DatasetError(f"trainer.distill.unlabeled_root={str(root)!r} holds no images")
        self.targets = np.full(len(self.samples), UNLABELED, np.int64)
        self.classes = list(classes)
        self.in_chans = in_chans

    def load_image(self, index: int) -> Image.Image:
        path = self.samples[index]
        try:
            return open_image(path, _MODES[self.in_chans])
        except ImageReadError as e:
            raise BadSampleError(f"cannot decode image {path!r}: {e}", index, path) from e

    def describe(self, index: int) -> str:
        return self.samples[index]


class JoinedDataset(ImageDataset):
    """``first`` followed by ``second`` (same classes and channels), each sample described by its own dataset."""

    def __init__(self, first: Any, second: Any) -> None:
        super().__init__(None)
        self.parts = (first, second)
        self.classes = list(first.classes)
        self.in_chans = getattr(first, "in_chans", getattr(second, "in_chans", 3))
        self.targets = np.concatenate([np.asarray(first.targets, np.int64), np.asarray(second.targets, np.int64)])

    def _part(self, index: int) -> tuple[Any, int]:
        index = self._check_index(index)
        first = self.parts[0]
        return (first, index) if index < len(first) else (self.parts[1], index - len(first))

    def __getitem__(self, index: int):
        part, inner = self._part(index)
        return part[inner]

    def load_image(self, index: int) -> Any:
        part, inner = self._part(index)
        return part.load_image(inner)

    def describe(self, index: int) -> str:
        part, inner = self._part(index)
        return part.describe(inner)


def with_unlabeled(train: Any, root: str, in_chans: int) -> JoinedDataset:
    """The training split followed by the images under ``root`` (labelled :data:`UNLABELED`)."""
    extra = UnlabeledImageFolder(root, train.classes, in_chans=in_chans)
    log.info("Added %d unlabeled images from %s to the %d training images", len(extra), root, len(train))
    return JoinedDataset(train, extra)
