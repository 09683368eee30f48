"""The data a run trains and validates on, from the ``data`` config: datasets, transforms and loaders, plus what
the model must know about them (classes, channels, samples per class); and the data paths a checkpoint saves,
anchored where the run started (:func:`anchored_paths`)."""
from __future__ import annotations

import logging
import os
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np
from omegaconf import DictConfig

from paddletrain.data.datasets import build_datasets
from paddletrain.data.formats.label_list_file import resolve_list_path
from paddletrain.data.formats.unlabeled import with_unlabeled
from paddletrain.data.loading.loaders import build_loader
from paddletrain.data.sampling.balance import class_balanced_weights, class_counts, dataset_targets
from paddletrain.data.sampling.holdout import hold_out_by_config
from paddletrain.data.transforms.presets import build_transform
from paddletrain.errors import UserError

log = logging.getLogger("paddletrain")


@dataclass
class DataBundle:
    """What the data config builds: loaders plus what the model must know about the data.

    ``class_counts``: training samples per class of the model (None when the dataset has no ``targets``), counted
    once here for ``data.sampler=class_balanced`` and ``loss.class_weights=balanced``.
    """

    train_loader: Any
    val_loader: Any
    classes: list[str]
    in_chans: int
    class_counts: np.ndarray | None = None


def build_data(cfg: DictConfig, seed: int, rank: int = 0, world_size: int = 1, eval_crop: bool = True,
               training: bool = True, eval_split: str = "val", options: Mapping[str, Any] | None = None) -> DataBundle:
    """Datasets, transforms and loaders from the ``data`` config.

    ``eval_crop=False``: evaluation images keep the ``eval_resize`` square (multi-crop test-time augmentation).
    ``training=False``: only evaluation is coming, so ``trainer.distill.unlabeled_root`` is not read and the
    training split's size is not checked against the batch.
    ``eval_split="test"``: the evaluation loader reads the test split, which exists when ``data.holdout`` held
    the validation split out of the training split. ``options``: the dataset builder's own keyword arguments
    (:func:`paddletrain.config.factory_options`).
    """
    # Transforms need the channel count the dataset reports, so the loaders apply them (per seeded sample).
    splits = hold_out_by_config(build_datasets(cfg.data, options=options), cfg.data)
    if eval_split == "test":
        if splits.test is None:
            raise UserError(f"split=test: data.name={cfg.data.name} has no test split apart from its validation "
                            "split, because data.holdout is 0 (the run validated on the dataset's own validation "
                            "split); evaluate split=val")
        splits.val = splits.test
    elif splits.test is not None and training:
        log.info("data.holdout=%g: %d training images, %d validation images held out of them (data.holdout_seed=%d), "
                 "%d test images (evaluate split=test)", cfg.data.holdout, len(splits.train), len(splits.val),
                 cfg.data.holdout_seed, len(splits.test))
    unlabeled = (cfg.trainer.get("distill") or {}).get("unlabeled_root")
    if unlabeled and training:  # label-free distillation (SSLD) learns from these too
        splits.train = with_unlabeled(splits.train, unlabeled, splits.in_chans)
    train_tf = build_transform(cfg.data, train=True, in_chans=splits.in_chans)
    eval_tf = build_transform(cfg.data, train=False, in_chans=splits.in_chans, crop=eval_crop)
    if len(splits.train) == 0:
        raise UserError(f"data.name={cfg.data.name}: the training split is empty")
    num_classes = cfg.model.num_classes
    if num_classes is not None and num_classes < len(splits.classes):
        raise UserError(f"model.num_classes={num_classes} is smaller than the {len(splits.classes)} classes "
                        f"of data.name={cfg.data.name}")
    if num_classes is not None and cfg.data.multilabel and num_classes != len(splits.classes):
        raise UserError(f"model.num_classes={num_classes} differs from the {len(splits.classes)} classes of the "
                        "multi-label lists (data.multilabel=true: one logit per multi-hot column); leave it null")
    per_rank = -(-len(splits.train) // world_size)
    if training and cfg.data.drop_last and per_rank < cfg.data.batch_size:
        raise UserError(f"data.batch_size={cfg.data.batch_size} is larger than the {per_rank} training samples each "
                        f"of the {world_size} process(es) gets from data.name={cfg.data.name}: with "
                        "data.drop_last=true no training step would run. Lower data.batch_size.")
    targets = dataset_targets(splits.train)
    counts = class_counts(targets, num_classes or len(splits.classes)) if targets is not None else None
    weights = None
    if cfg.data.get("sampler") == "class_balanced" and targets is not None:
        weights = class_balanced_weights(targets, counts)
        if training:
            log.info("data.sampler=class_balanced: %d classes with %d to %d training samples, each drawn about "
                     "%.1f times per epoch", len(counts), counts.min(), counts.max(), len(targets) / len(counts))
    train_loader = build_loader(splits.train, cfg.data, train=True, seed=seed, num_replicas=world_size, rank=rank,
                                transform=train_tf, sample_weights=weights)
    val_loader = build_loader(splits.val, cfg.data, train=False, seed=seed, num_replicas=world_size, rank=rank,
                              transform=eval_tf)
    return DataBundle(train_loader, val_loader, list(splits.classes), splits.in_chans, counts)


# Data keys that name local files or folders (the shards builder's own among them; URLs are left as they are).
_PATH_KEYS = ("root", "urls", "val_urls", "index", "val_index", "cache_dir")
_LIST_KEYS = ("train_list", "val_list", "class_names")  # looked up from the working directory, then data.root


def anchored_paths(resolved: dict[str, Any]) -> dict[str, Any]:
    """A resolved config with its relative data paths made absolute where ``fit`` runs, so that the config saved
    in a checkpoint names the same files from any directory (``evaluate``, ``export`` and ``ship`` read it)."""
    def absolute(value: Any) -> Any:
        if isinstance(value, list):
            return [absolute(item) for item in value]
        if not isinstance(value, str) or not value or "://" in value or value.startswith("~"):
            return value
        return os.path.abspath(value)

    data = resolved.get("data") or {}
    root = data.get("root")
    for key in _LIST_KEYS:  # first: they may be found under the root as given
        if isinstance(data.get(key), str) and data[key]:
            data[key] = os.path.abspath(resolve_list_path(data[key], root or "."))
    for key in _PATH_KEYS:
        if key in data:
            data[key] = absolute(data[key])
    distill = (resolved.get("trainer") or {}).get("distill") or {}
    if distill.get("unlabeled_root"):
        distill["unlabeled_root"] = absolute(distill["unlabeled_root"])
    return resolved
