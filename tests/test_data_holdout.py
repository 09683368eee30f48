"""data.holdout: a seeded, stratified validation split held out of the training split; the own split is test."""
from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from paddletrain.build import build_data
from paddletrain.config import DataConfig
from paddletrain.data.datasets import DatasetError, DatasetSplits, build_datasets
from paddletrain.data.sampling.holdout import SubsetDataset, hold_out, hold_out_by_config, holdout_indices
from paddletrain.errors import UserError
from tests.conftest import TINY, compose_fit
from tests.test_data_mnist import write_idx_split


def test_each_class_keeps_its_share_and_the_parts_partition_the_split():
    targets = np.repeat(np.arange(4), [100, 50, 10, 3])  # 3 images: round(0.3) = 0 held out
    kept, held = holdout_indices(targets, 0.1, seed=0)
    assert np.bincount(targets[held], minlength=4).tolist() == [10, 5, 1, 0]
    assert np.intersect1d(kept, held).size == 0
    np.testing.assert_array_equal(np.sort(np.concatenate([kept, held])), np.arange(len(targets)))
    assert list(held) == sorted(held) and list(kept) == sorted(kept)


def test_the_split_is_a_function_of_the_holdout_seed_alone():
    targets = np.random.default_rng(5).integers(0, 10, 2000)
    first, again = holdout_indices(targets, 0.1, seed=0), holdout_indices(targets.copy(), 0.1, seed=0)
    np.testing.assert_array_equal(first[1], again[1])
    other = holdout_indices(targets, 0.1, seed=1)[1]
    assert len(other) == len(first[1]) and not np.array_equal(other, first[1])
    # A class's held-out images do not depend on the other classes (the permutation is seeded per class).
    only_class_3 = np.where(targets == 3, 3, 0)
    held_alone = holdout_indices(only_class_3, 0.1, seed=0)[1]
    np.testing.assert_array_equal(held_alone[only_class_3[held_alone] == 3], first[1][targets[first[1]] == 3])


@pytest.fixture
def fashion_root(tmp_path: Path) -> Path:
    rng = np.random.default_rng(0)
    write_idx_split(tmp_path, "train", rng.integers(0, 256, (40, 28, 28)), np.repeat(np.arange(4), 10))
    write_idx_split(tmp_path, "val", rng.integers(0, 256, (7, 28, 28)), np.arange(7))
    return tmp_path


def test_the_data_config_holds_out_val_and_keeps_the_own_split_as_test(fashion_root):
    plain = build_datasets(DataConfig(name="fashion_mnist", root=str(fashion_root)))
    assert plain.test is None and len(plain.val) == 7
    assert hold_out_by_config(plain, DataConfig(name="fashion_mnist")) is plain  # holdout 0: unchanged
    cfg = DataConfig(name="fashion_mnist", root=str(fashion_root), holdout=0.2, holdout_seed=3)
    splits = hold_out_by_config(build_datasets(cfg), cfg)
    assert (len(splits.train), len(splits.val), len(splits.test)) == (32, 8, 7)
    assert list(splits.test.targets) == list(range(7))  # the official test files, untouched
    assert np.bincount(splits.val.targets).tolist() == [2, 2, 2, 2]
    # The held-out samples are the training files' own, named by their index there.
    inner = int(splits.val.indices[0])
    image, label = splits.val[0]
    np.testing.assert_array_equal(image, plain.train[inner][0])
    assert label == plain.train.targets[inner]
    assert splits.val.describe(0) == plain.train.describe(inner)
    assert splits.classes == plain.classes and splits.in_chans == 1


def test_a_train_subset_is_a_seeded_share_of_each_training_class_apart_from_the_held_out_images(fashion_root):
    held = DataConfig(name="fashion_mnist", root=str(fashion_root), holdout=0.2, holdout_seed=3)
    whole = hold_out_by_config(build_datasets(held), held)
    cfg = DataConfig(name="fashion_mnist", root=str(fashion_root), holdout=0.2, holdout_seed=3, train_subset=0.25)
    splits = hold_out_by_config(build_datasets(cfg), cfg)
    assert (len(splits.train), len(splits.val), len(splits.test)) == (8, 8, 7)  # 2 of each class's 8 training images
    assert np.bincount(splits.train.targets).tolist() == [2, 2, 2, 2]
    np.testing.assert_array_equal(splits.val.indices, whole.val.indices)  # the validation split stays whole
    trained = splits.train.dataset.indices[splits.train.indices]  # the files' own indices
    assert not set(trained) & set(whole.val.indices)
    again = hold_out_by_config(build_datasets(cfg), cfg)
    np.testing.assert_array_equal(again.train.indices, splits.train.indices)  # seeded: the same subset each time
    other = hold_out_by_config(build_datasets(cfg), DataConfig(**{**vars(cfg), "holdout_seed": 4}))
    assert not np.array_equal(other.train.dataset.indices[other.train.indices], trained)


def test_a_dataset_without_one_class_per_sample_cannot_be_held_out():
    class MultiHot:
        classes, in_chans = ["a", "b"], 3
        targets = np.eye(2)[[0, 1, 1, 0]]

        def __len__(self):
            return 4

    splits = DatasetSplits(train=MultiHot(), val=MultiHot(), classes=["a", "b"], in_chans=3)
    with pytest.raises(DatasetError, match=r"data.holdout=0.5: data.name=lists has no single class per training"):
        hold_out(splits, 0.5, 0, "lists")


def test_evaluating_the_test_split_needs_a_holdout():
    cfg = compose_fit([*TINY])
    with pytest.raises(UserError, match=r"split=test: data.name=shapes has no test split apart from its validation"):
        build_data(cfg, seed=0, training=False, eval_split="test")
    cfg = compose_fit([*TINY, "data.holdout=0.25"])
    bundle = build_data(cfg, seed=0, training=False, eval_split="test")
    assert len(bundle.val_loader.dataset) == 32  # the shapes val split (num_val=32) is now the test split
    fit_data = build_data(cfg, seed=0)
    train, val = fit_data.train_loader.dataset.dataset, fit_data.val_loader.dataset.dataset
    assert isinstance(train, SubsetDataset) and isinstance(val, SubsetDataset)
    # Classes of 11 or 10 images: 2.75 and 2.5 both round up to 3.
    assert len(train) + len(val) == 64 and np.bincount(val.targets).tolist() == [3] * 6
    assert fit_data.class_counts.tolist() == np.bincount(train.targets).tolist()  # counted on what it trains on
