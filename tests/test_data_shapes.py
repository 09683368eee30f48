"""ShapesDataset: determinism, split independence, balance, speed, the factory and the registry."""
from __future__ import annotations

import time

import numpy as np
import pytest
from omegaconf import OmegaConf

from paddletrain.config import DataConfig
from paddletrain.data.datasets import (
    DatasetError,
    DatasetSplits,
    build_datasets,
    list_datasets,
    register_dataset,
)
from paddletrain.data.formats import shapes
from paddletrain.data.formats.shapes import CLASSES, ShapesDataset, preview


def _images(ds: ShapesDataset, indices) -> np.ndarray:
    return np.stack([ds[i][0] for i in indices])


def test_sample_contract() -> None:
    ds = ShapesDataset("train", num_samples=20, image_size=32, seed=0)
    image, label = ds[17]
    assert image.shape == (32, 32, 3) and image.dtype == np.uint8
    assert label.dtype == np.int64 and label == ds.targets[17]
    assert ds.classes == CLASSES and ds.in_chans == 3 and len(ds) == 20
    assert ds.describe(17) == "shapes[train][17]"
    assert ds[-1][1] == ds.targets[19]
    with pytest.raises(IndexError):
        ds[20]


def test_same_seed_same_images_in_any_order() -> None:
    a = ShapesDataset("train", num_samples=16, seed=3)
    b = ShapesDataset("train", num_samples=16, seed=3)
    np.testing.assert_array_equal(_images(a, range(16)), _images(b, reversed(range(16)))[::-1])


def test_splits_and_seeds_give_different_images() -> None:
    train = _images(ShapesDataset("train", num_samples=16, seed=0), range(16)).astype(int)
    val = _images(ShapesDataset("val", num_samples=16, seed=0), range(16)).astype(int)
    other_seed = _images(ShapesDataset("train", num_samples=16, seed=1), range(16)).astype(int)
    for other in (val, other_seed):
        # No image of one set is close to any image of the other.
        distances = np.abs(train[:, None] - other[None]).mean(axis=(2, 3, 4))
        assert distances.min() > 10


def test_classes_are_balanced_and_images_vary() -> None:
    ds = ShapesDataset("train", num_samples=len(CLASSES) * 5)
    assert np.bincount(ds.targets).tolist() == [5] * len(CLASSES)
    images = _images(ds, range(len(ds))).reshape(len(ds), -1).astype(float)
    assert len({image.tobytes() for image in images}) == len(ds)
    assert images.std(axis=1).min() > 5  # every image shows a shape against its background


def test_each_class_draws_its_own_shape() -> None:
    # Without noise and colour, the mask of one class differs from every other class's mask.
    masks = []
    for name in CLASSES:
        mask = shapes._draw_mask(name, 128, np.array([64.0, 64.0]), 50.0, 0.0, 0.4)
        masks.append(np.asarray(mask, dtype=float) / 255)
    for i in range(len(CLASSES)):
        for j in range(i + 1, len(CLASSES)):
            assert np.abs(masks[i] - masks[j]).mean() > 0.02, (CLASSES[i], CLASSES[j])


def test_other_image_sizes() -> None:
    for size in (16, 64, 224):
        assert ShapesDataset("val", num_samples=2, image_size=size)[1][0].shape == (size, size, 3)


def test_generating_the_default_splits_is_fast() -> None:
    train, val = ShapesDataset("train", 4000), ShapesDataset("val", 1000)
    start = time.process_time()  # CPU time: other processes on the machine do not make this flaky
    for ds in (train, val):
        for i in range(len(ds)):
            ds.load_image(i)
    assert time.process_time() - start < 3.0


@pytest.mark.parametrize(
    "kwargs, key",
    [({"split": "test"}, "split"), ({"num_samples": 0}, "num_train"), ({"image_size": 4}, "image_size"),
     ({"seed": -1}, "seed")],
)  # fmt: skip
def test_invalid_arguments_name_the_key(kwargs, key) -> None:
    with pytest.raises(DatasetError, match=key):
        ShapesDataset(**kwargs)


def test_transform_is_applied() -> None:
    ds = ShapesDataset("val", num_samples=2, transform=lambda image: image.mean())
    assert isinstance(ds[0][0], float)


def test_preview_grid() -> None:
    grid = preview(ShapesDataset("val", num_samples=8, image_size=16), rows=2, columns=4, scale=2)
    assert grid.size == (4 * 16 * 2, 2 * 16 * 2)


def test_factory_reads_config_and_dictconfig() -> None:
    cfg = DataConfig()
    cfg.shapes.num_train, cfg.shapes.num_val, cfg.shapes.seed = 24, 8, 5
    splits = build_datasets(cfg, train_transform=lambda im: im[::2, ::2])
    assert isinstance(splits, DatasetSplits)
    assert (len(splits.train), len(splits.val)) == (24, 8)
    assert splits.classes == CLASSES and splits.num_classes == len(CLASSES) and splits.in_chans == 3
    assert splits.train[0][0].shape == (16, 16, 3) and splits.val[0][0].shape == (32, 32, 3)
    structured = OmegaConf.merge(OmegaConf.structured(DataConfig), {"image_size": 24, "shapes": {"num_val": 4}})
    again = build_datasets(structured)
    assert len(again.val) == 4 and again.val[0][0].shape == (24, 24, 3)


def test_unknown_name_lists_valid_names() -> None:
    with pytest.raises(DatasetError) as info:
        build_datasets(DataConfig(name="shapez"))
    message = str(info.value)
    assert "'shapez'" in message
    for name in ("shapes", "imagefolder", "fashion_mnist", "mnist", "cifar10", "cifar100"):
        assert name in message


def test_register_dataset_adds_a_user_dataset() -> None:
    @register_dataset("test_tiny_shapes")
    def build(cfg, train_transform, eval_transform) -> DatasetSplits:
        train = ShapesDataset("train", 4, transform=train_transform)
        return DatasetSplits(train, ShapesDataset("val", 2), classes=["a"] * 8, in_chans=3)

    try:
        assert "test_tiny_shapes" in list_datasets()
        splits = build_datasets(OmegaConf.create({"name": "test_tiny_shapes"}), train_transform=lambda im: "t")
        assert len(splits.train) == 4 and splits.train[0][0] == "t" and splits.classes == ["a"] * 8
        with pytest.raises(ValueError, match="already registered"):
            register_dataset("test_tiny_shapes")(lambda *a: None)
    finally:
        from paddletrain.registry import DATASETS

        DATASETS.unregister("test_tiny_shapes")
