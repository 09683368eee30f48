"""Unlabeled images for label-free distillation: confined scanning, the UNLABELED label, joined datasets."""
from __future__ import annotations

import os

import numpy as np
import pytest
from PIL import Image

from paddletrain.config import DataConfig
from paddletrain.data.datasets import DatasetError
from paddletrain.data.formats.unlabeled import UNLABELED, UnlabeledImageFolder, with_unlabeled
from paddletrain.data.loading.loaders import build_loader
from paddletrain.data.transforms.presets import build_transform


def _image(path, value=0):
    path.parent.mkdir(parents=True, exist_ok=True)
    Image.fromarray(np.full((6, 6, 3), value, np.uint8)).save(path)


class Labelled:
    classes = ["a", "b"]
    in_chans = 3
    targets = [0, 1, 1, 0]

    def __len__(self):
        return 4

    def __getitem__(self, index):
        return np.full((6, 6, 3), 200, np.uint8), np.int64(self.targets[index])

    def describe(self, index):
        return f"labelled[{index}]"


def test_scan_takes_images_at_any_depth_inside_the_root_only(tmp_path):
    root = tmp_path / "unlabeled"
    _image(root / "x.png")
    _image(root / "deep" / "er" / "y.jpg")
    _image(root / ".hidden" / "z.png")
    (root / "notes.txt").write_text("not an image")
    _image(tmp_path / "outside" / "secret.png")
    os.symlink(tmp_path / "outside" / "secret.png", root / "link.png")
    os.symlink(tmp_path / "outside", root / "linked_dir")
    dataset = UnlabeledImageFolder(root, classes=["a", "b"])
    assert [os.path.relpath(p, root) for p in dataset.samples] == ["x.png", "deep/er/y.jpg"]
    assert list(dataset.targets) == [UNLABELED, UNLABELED]
    image, label = dataset[1]
    assert image.size == (6, 6) and label == UNLABELED


def test_an_empty_or_missing_folder_is_one_clear_error(tmp_path):
    with pytest.raises(DatasetError, match="unlabeled_root=.* is not a directory"):
        UnlabeledImageFolder(tmp_path / "missing", classes=["a"])
    (tmp_path / "empty").mkdir()
    with pytest.raises(DatasetError, match="unlabeled_root=.* holds no images"):
        UnlabeledImageFolder(tmp_path / "empty", classes=["a"])


def test_joined_split_loads_labelled_then_unlabeled_through_the_checked_loader(tmp_path):
    for i in range(4):
        _image(tmp_path / "u" / f"{i}.png", value=i)
    joined = with_unlabeled(Labelled(), str(tmp_path / "u"), in_chans=3)
    assert len(joined) == 8 and joined.classes == ["a", "b"]
    assert joined.describe(1) == "labelled[1]" and joined.describe(5).endswith("1.png")
    cfg = DataConfig(image_size=6, batch_size=8, hflip=False, train_transform="none")
    loader = build_loader(joined, cfg, train=False, seed=0, transform=build_transform(cfg, train=False))
    (images, labels), = [(x.numpy(), y.numpy()) for x, y in loader]
    assert list(labels) == [0, 1, 1, 0, UNLABELED, UNLABELED, UNLABELED, UNLABELED]  # not refused as bad labels
    assert images.shape == (8, 3, 6, 6)
