"""This app's own dataset: a bright horizontal or vertical bar on dark noise, drawn on the fly."""
from __future__ import annotations

from typing import Any

import numpy as np

from paddletrain.data import DatasetError, DatasetSplits, register_dataset
from paddletrain.data.datasets import ImageDataset, Transform

CLASSES = ["horizontal", "vertical"]
NUM_TRAIN, NUM_VAL = 512, 128
SPLIT_SEEDS = {"train": 0, "val": 1}


class Bars(ImageDataset):
    """``num_samples`` bar images of one split; a sample depends only on (split, index)."""

    classes = CLASSES
    in_chans = 3

    def __init__(self, split: str, num_samples: int, image_size: int, transform: Transform = None,
                 bar_width: int = 3) -> None:
        super().__init__(transform)
        self.split, self.size, self.bar_width = split, image_size, bar_width
        self.targets = np.random.default_rng(SPLIT_SEEDS[split]).integers(0, len(CLASSES), num_samples)

    def load_image(self, index: int) -> np.ndarray:
        rng = np.random.default_rng([SPLIT_SEEDS[self.split], index])
        image = rng.integers(0, 64, (self.size, self.size, 3), dtype=np.uint8)
        middle = int(rng.integers(2, self.size - 2))
        bar = slice(max(0, middle - self.bar_width // 2), middle + (self.bar_width + 1) // 2)
        if self.targets[index] == 0:
            image[bar, :] = 255
        else:
            image[:, bar] = 255
        return image

    def describe(self, index: int) -> str:
        return f"bars[{self.split}][{index}]"


@register_dataset("bars")
def build_bars(cfg: Any, train_transform: Transform, eval_transform: Transform, *, bar_width: int = 3) -> DatasetSplits:
    """``data.name=bars``: 512 training and 128 validation images of ``data.image_size`` pixels, with bars
    ``bar_width`` pixels wide (its own option: ``data.bar_width=5`` on the command line)."""
    if bar_width < 1:
        raise DatasetError(f"data.bar_width={bar_width} must be >= 1")
    return DatasetSplits.of(Bars("train", NUM_TRAIN, cfg.image_size, train_transform, bar_width),
                            Bars("val", NUM_VAL, cfg.image_size, eval_transform, bar_width))
