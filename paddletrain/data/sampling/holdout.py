"""A validation split held out of the training split, so that the dataset's own split stays a test set.

Datasets such as Fashion-MNIST, MNIST and CIFAR ship a training and a test split, and nothing else. Choosing a
recipe (epochs, learning rate, augmentation, the checkpoint to keep) on the test split would make its test
figure an optimistic one. ``data.holdout=0.1`` keeps a tenth of each class of the training split apart as the
validation split that ``fit`` validates on and picks its best checkpoint by; the dataset's own validation split
becomes the test split, which ``python -m paddletrain.evaluate checkpoint=<run>:best split=test`` reads.

The split is a pure function of the training split's labels, the fraction and ``data.holdout_seed``, which is
not ``trainer.seed``: runs of the same recipe with different seeds train and validate on the same images. Each
class keeps its share (``round(n * fraction)``, halves rounded up, as ``python -m paddletrain.data split`` does),
and which images of a class are held out is a permutation seeded by ``(holdout_seed, class index)``.
"""
from __future__ import annotations

from typing import Any

import numpy as np
import paddle

from paddletrain.data.datasets import DatasetError, DatasetSplits
from paddletrain.data.sampling.balance import dataset_targets
from paddletrain.data.tools.split import val_count

__all__ = ["SubsetDataset", "hold_out", "hold_out_by_config", "holdout_indices", "train_subset"]

# The subset's permutation is seeded apart from the held-out one's (same data.holdout_seed), so that the two draws
# are independent.
SUBSET_SEED_OFFSET = 1_000_003


class SubsetDataset(paddle.io.Dataset):
    """The samples ``indices`` of ``dataset``, which keeps its classes, channel count and sample names."""

    def __init__(self, dataset: Any, indices: np.ndarray) -> None:
        super().__init__()
        self.dataset = dataset
        self.indices = np.asarray(indices, dtype=np.int64)
        self.classes = list(dataset.classes)
        self.in_chans = dataset.in_chans
        self.multilabel = bool(getattr(dataset, "multilabel", False))
        targets = getattr(dataset, "targets", None)
        self.targets = None if targets is None else np.asarray(targets)[self.indices]

    def __len__(self) -> int:
        return len(self.indices)

    def __getitem__(self, index: int) -> Any:
        return self.dataset[int(self.indices[index])]

    def describe(self, index: int) -> str:
        inner = int(self.indices[index])
        describe = getattr(self.dataset, "describe", None)
        return str(describe(inner)) if describe is not None else f"{type(self.dataset).__name__}[{inner}]"

    def __repr__(self) -> str:
        return f"SubsetDataset({len(self)} of {self.dataset!r})"


def holdout_indices(targets: np.ndarray, fraction: float, seed: int) -> tuple[np.ndarray, np.ndarray]:
    """(kept, held out): sorted sample indices of ``targets`` (class indices), stratified by class."""
    targets = np.asarray(targets, dtype=np.int64).reshape(-1)
    held: list[np.ndarray] = []
    for label in np.unique(targets):
        members = np.flatnonzero(targets == label)
        order = np.random.default_rng([seed, int(label)]).permutation(len(members))
        held.append(members[order[: val_count(len(members), fraction)]])
    held_out = np.sort(np.concatenate(held)) if held else np.zeros(0, dtype=np.int64)
    kept = np.setdiff1d(np.arange(len(targets)), held_out, assume_unique=True)
    return kept, held_out


def hold_out_by_config(splits: DatasetSplits, cfg: Any) -> DatasetSplits:
    """``splits`` as the data config ``cfg`` asks: held out by ``cfg.holdout`` (seeded by ``cfg.holdout_seed``;
    unchanged when it is 0), then the training split cut to ``cfg.train_subset`` of each class."""
    fraction = getattr(cfg, "holdout", 0) or 0
    share = getattr(cfg, "train_subset", 1.0)
    if not fraction and share >= 1:
        return splits
    # The training split's labels, read once: the held-out and the subset's draws both stratify by them.
    targets = dataset_targets(splits.train)
    if fraction:
        splits, targets = _held_out(splits, targets, fraction, cfg.holdout_seed, cfg.name)
    return _subset(splits, targets, share, cfg.holdout_seed, cfg.name) if share < 1 else splits


def train_subset(splits: DatasetSplits, share: float, seed: int, dataset_name: str = "") -> DatasetSplits:
    """``splits`` with a seeded ``share`` of each training class (the rule of :func:`holdout_indices`, seeded apart
    from the held-out images), the other splits unchanged."""
    return _subset(splits, dataset_targets(splits.train), share, seed, dataset_name)


def _subset(splits: DatasetSplits, targets: np.ndarray | None, share: float, seed: int,
            dataset_name: str) -> DatasetSplits:
    if targets is None:
        raise DatasetError(f"data.train_subset={share}: data.name={dataset_name} has no single class per training "
                           "sample to stratify by; leave data.train_subset at 1")
    _, chosen = holdout_indices(targets, share, seed + SUBSET_SEED_OFFSET)
    if len(chosen) == 0:
        raise DatasetError(f"data.train_subset={share} keeps no image of the {len(targets)} training images of "
                           f"data.name={dataset_name}: raise it")
    return DatasetSplits(train=SubsetDataset(splits.train, chosen), val=splits.val, classes=splits.classes,
                         in_chans=splits.in_chans, test=splits.test)


def hold_out(splits: DatasetSplits, fraction: float, seed: int, dataset_name: str = "") -> DatasetSplits:
    """``splits`` with ``fraction`` of each training class as the validation split, its validation split as test.

    The held-out images are the training dataset's own samples, so the datasets must not apply a transform
    themselves (``build_datasets(cfg)`` without transforms; the loaders apply them, as ``build_data`` does):
    otherwise the validation images would be augmented.

    Raises:
        DatasetError: the training split has no single class per sample (multi-hot labels, or none at all).
    """
    return _held_out(splits, dataset_targets(splits.train), fraction, seed, dataset_name)[0]


def _held_out(splits: DatasetSplits, targets: np.ndarray | None, fraction: float, seed: int,
              dataset_name: str) -> tuple[DatasetSplits, np.ndarray]:
    """:func:`hold_out`, and the kept training samples' labels."""
    if targets is None:
        raise DatasetError(
            f"data.holdout={fraction}: data.name={dataset_name} has no single class per training sample "
            "(multi-label lists, or a dataset without targets) to stratify by; give a validation split of its own "
            "(e.g. data.val_list) and leave data.holdout at 0")
    kept, held_out = holdout_indices(targets, fraction, seed)
    if len(held_out) == 0:
        raise DatasetError(f"data.holdout={fraction} holds out no image of the {len(targets)} training images of "
                           f"data.name={dataset_name}: raise it")
    splits = DatasetSplits(train=SubsetDataset(splits.train, kept), val=SubsetDataset(splits.train, held_out),
                           classes=splits.classes, in_chans=splits.in_chans, test=splits.val)
    return splits, targets[kept]
