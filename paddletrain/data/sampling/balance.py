"""Class counts of a training split and what imbalanced-class training derives from them.

:func:`class_counts` is the one place the samples per class are counted (``build.build_data`` does it once per
run); ``loss.class_weights=balanced`` (:func:`paddletrain.losses.balanced_class_weights`) and
``data.sampler=class_balanced`` (:func:`class_balanced_weights`) both start from those counts.
"""
from __future__ import annotations

from typing import Any

import numpy as np

from paddletrain.data.datasets import DatasetError
from paddletrain.data.formats.unlabeled import UNLABELED


def dataset_targets(dataset: Any) -> np.ndarray | None:
    """The dataset's class indices (its ``targets``) as int64, or None when it exposes none (or multi-hot rows)."""
    targets = getattr(dataset, "targets", None)
    if targets is None:
        return None
    targets = np.asarray(targets, dtype=np.int64)
    if targets.ndim == 2:  # multi-hot rows (multi-label): no one class per sample to count or balance
        return None
    targets = targets.reshape(-1)
    if len(targets) != len(dataset):
        raise DatasetError(f"{type(dataset).__name__} has {len(targets)} targets for {len(dataset)} samples")
    return targets


def class_counts(targets: np.ndarray, num_classes: int) -> np.ndarray:
    """Samples per class (int64 ``[num_classes]``); images without a label (distillation's extra images) are
    not counted.

    Raises:
        DatasetError: a label outside ``[0, num_classes)``.
    """
    labeled = targets[targets != UNLABELED]
    bad = labeled[(labeled < 0) | (labeled >= num_classes)]
    if len(bad):
        raise DatasetError(f"label {int(bad[0])} is outside [0, {num_classes}) for a dataset of {num_classes} "
                           "classes")
    return np.bincount(labeled, minlength=num_classes).astype(np.int64)


def class_balanced_weights(targets: np.ndarray, counts: np.ndarray | None = None) -> np.ndarray:
    """Each sample's draw weight ``1 / count`` of its class: every class is then drawn equally often in expectation
    (the weights PyTorch users hand ``WeightedRandomSampler`` for this). ``counts``: :func:`class_counts` of
    ``targets`` (counted here when not given).

    Raises:
        DatasetError: a sample without a label, which no class weight can be given to.
    """
    if np.any(targets == UNLABELED):
        raise DatasetError("data.sampler=class_balanced needs a label for every training image; "
                           f"{int(np.sum(targets == UNLABELED))} have none")
    if counts is None:
        counts = class_counts(targets, int(targets.max()) + 1 if len(targets) else 0)
    return 1.0 / counts[targets].astype(np.float64)
