"""Dataset contract, errors and the name -> builder registry behind ``build_datasets(cfg)``.

Every dataset returns ``(image, label)``: a uint8 HWC numpy array or a PIL image (before the transform) and an
int64 label, and exposes ``classes``, ``targets``, ``in_chans`` and ``describe(index)`` so loaders, samplers and
error messages can talk about samples without knowing where they come from.

Each dataset module registers its own builder next to its dataset class (``shapes``, ``imagefolder``,
``mnist``/``fashion_mnist``, ``cifar10``/``cifar100``); this module imports none of them, and importing
``paddletrain.data`` registers them all. Users add their own dataset with::

    @register_dataset("my_data")
    def build_my_data(cfg, train_transform, eval_transform) -> DatasetSplits: ...
"""
from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, fields
from pathlib import Path
from typing import Any

import numpy as np
import paddle
from paddle.dataset import common as paddle_dataset

from paddletrain.config import DataConfig
from paddletrain.data.errors import BadSampleError, DatasetError, UnknownDatasetError
from paddletrain.errors import ConfigError
from paddletrain.registry import DATASETS, UnknownNameError

# image -> model input, or None to keep the image as loaded.
Transform = Callable[[Any], Any] | None
# The data keys of the schema; a dataset builder's own options are the others.
_DECLARED = frozenset(f.name for f in fields(DataConfig))


class ImageDataset(paddle.io.Dataset):
    """Base of the built-in datasets: subclasses set ``classes``/``targets``/``in_chans`` and load one image.

    Subclasses implement ``load_image(index)`` and ``describe(index)``; this class applies the transform and
    returns the label as ``np.int64`` so Paddle's default collate yields an int64 label tensor.
    """

    classes: list[str]
    targets: list[int] | np.ndarray
    in_chans: int

    def __init__(self, transform: Transform = None) -> None:
        super().__init__()
        self.transform = transform

    def __len__(self) -> int:
        return len(self.targets)

    def load_image(self, index: int) -> Any:
        """The untransformed image at ``index``: uint8 HWC array or PIL image."""
        raise NotImplementedError

    def describe(self, index: int) -> str:
        """A human-readable name of the sample (its file path, or ``name[split][index]``)."""
        raise NotImplementedError

    @property
    def num_classes(self) -> int:
        return len(self.classes)

    def _check_index(self, index: int) -> int:
        n = len(self)
        index = int(index)
        if index < 0:
            index += n
        if not 0 <= index < n:
            raise IndexError(f"{type(self).__name__} index {index} out of range for {n} samples")
        return index

    def __getitem__(self, index: int):
        index = self._check_index(index)
        image = self.load_image(index)
        if self.transform is not None:
            image = self.transform(image)
        return image, np.int64(self.targets[index])

    def __repr__(self) -> str:
        return f"{type(self).__name__}(samples={len(self)}, classes={self.num_classes}, in_chans={self.in_chans})"


@dataclass
class DatasetSplits:
    """The train and validation datasets of one data config, with what the model needs to know of them.

    ``test`` is set when the validation split was held out of the training split (``data.holdout``,
    :mod:`paddletrain.data.sampling.holdout`): it is then the dataset's own validation split, read by ``evaluate
    split=test``.
    """

    train: paddle.io.Dataset
    val: paddle.io.Dataset
    classes: list[str]
    in_chans: int
    test: paddle.io.Dataset | None = None

    @property
    def num_classes(self) -> int:
        return len(self.classes)

    @classmethod
    def of(cls, train: ImageDataset, val: ImageDataset) -> DatasetSplits:
        """The two splits, with the classes and channel count of the training split."""
        return cls(train=train, val=val, classes=list(train.classes), in_chans=train.in_chans)


DatasetBuilder = Callable[[Any, Transform, Transform], DatasetSplits]


# Per dataset name: the keys that say where its training split comes from, each mapped to the key of its
# validation split. `evaluate` points the first at the second, so that it reads only the split it scores.
EVAL_SOURCES: dict[str, dict[str, str]] = {}


def register_dataset(name: str, eval_sources: Mapping[str, str] | None = None
                     ) -> Callable[[DatasetBuilder], DatasetBuilder]:
    """Decorator registering ``builder(cfg, train_transform, eval_transform) -> DatasetSplits`` as ``name``.

    ``eval_sources``: ``{training key: validation key}`` (``{"train_list": "val_list"}``) when the validation
    split can be read without the training one (:data:`EVAL_SOURCES`).

    Raises:
        ValueError: another builder is already registered under ``name``.
    """
    if eval_sources:
        EVAL_SOURCES[name] = dict(eval_sources)
    return DATASETS.register(name)


def split_builder(dataset_class: Callable[..., ImageDataset], kind: str, doc: str) -> DatasetBuilder:
    """The builder of a dataset that ships its own train and val splits, as ``data.name=<kind>``.

    It opens ``dataset_class(data.root, split, kind=kind, download=data.download, transform=...)`` for both splits;
    ``data.root`` None leaves the place to ``dataset_class`` (e.g. Paddle's download cache). ``doc`` is the builder's
    docstring.
    """

    def build(cfg: Any, train_transform: Transform, eval_transform: Transform) -> DatasetSplits:
        options = dict(kind=kind, download=cfg.download)
        return DatasetSplits.of(dataset_class(cfg.root, "train", transform=train_transform, **options),
                                dataset_class(cfg.root, "val", transform=eval_transform, **options))

    build.__name__ = build.__qualname__ = f"build_{kind}"
    build.__doc__ = doc
    return build


def paddle_cache_dir(name: str) -> Path:
    """Where Paddle's downloader stores a dataset (``~/.cache/paddle/dataset/<name>``), read when called so that
    a changed ``DATA_HOME`` is honoured."""
    return Path(paddle_dataset.DATA_HOME) / name


def list_datasets() -> list[str]:
    """Names accepted by ``data.name`` (an installed plugin's included), sorted."""
    from paddletrain.data import register_builtin_datasets  # its modules import this one

    register_builtin_datasets()
    return DATASETS.names()


def build_datasets(cfg: Any, train_transform: Transform = None, eval_transform: Transform = None,
                   options: Mapping[str, Any] | None = None) -> DatasetSplits:
    """Build the train/val datasets named by ``cfg.name`` (a ``DataConfig`` or a validated DictConfig with its
    keys); ``options`` are the builder's own keyword arguments (on the command line, the ``data`` keys the schema
    does not declare: :func:`paddletrain.config.factory_options`).

    ``cfg.holdout`` is not applied here: :func:`paddletrain.data.sampling.holdout.hold_out_by_config` does it on what
    this
    returns (``paddletrain.build.build_data`` calls both).

    Raises:
        UnknownDatasetError: nothing is registered under ``data.name``, not even by an installed plugin.
    """
    from paddletrain.data import register_builtin_datasets  # its modules import this one

    register_builtin_datasets()
    name = cfg.name
    try:
        builder = DATASETS.get(name)
    except UnknownNameError as exc:
        raise UnknownDatasetError(str(exc)) from None
    if options is None and isinstance(cfg, Mapping):
        # A composed node's own keys are not read from it here (build_data is handed them): refuse rather than
        # build the dataset without them.
        unread = [key for key in DATASETS.options_of(name) or () if key in cfg and key not in _DECLARED]
        if unread:
            raise ConfigError(f"data.{unread[0]} is an option of data.name={name}'s builder: pass the node's options, "
                              "build_datasets(cfg.data, options=paddletrain.config.factory_options(cfg)['data'])")
    splits = builder(cfg, train_transform, eval_transform, **(options or {}))
    if not isinstance(splits, DatasetSplits):
        raise TypeError(f"dataset builder {name!r} returned {type(splits).__name__}, expected DatasetSplits")
    return splits


def require_root(cfg: Any) -> str:
    """``data.root`` of a dataset that reads its files from there; unset is an error naming the key."""
    if not cfg.root:
        raise DatasetError(f"data.root must be set for data.name={cfg.name!r} (the directory holding the data)")
    return str(cfg.root)


__all__: Sequence[str] = [
    "BadSampleError",
    "DatasetError",
    "DatasetSplits",
    "ImageDataset",
    "UnknownDatasetError",
    "build_datasets",
    "list_datasets",
    "register_dataset",
    "require_root",
    "split_builder",
]
