"""Dataset contract, errors and the name -> builder registry behind ``build_datasets(cfg)``.

Every dataset returns ``(image, label)``: a uint8 HWC numpy array or a PIL image (before the transform) and an
int64 label, and exposes ``classes``, ``targets``, ``in_chans`` and ``describe(index)`` so loaders, samplers and
error messages can talk about samples without knowing where they come from.

Users add their own dataset with::

    @register_dataset("my_data")
    def build_my_data(cfg, train_transform, eval_transform) -> DatasetSplits: ...
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable, Dict, List, Optional, Sequence, Union

import numpy as np
import paddle

from paddletrain.errors import UserError

Transform = Optional[Callable[[Any], Any]]


class DatasetError(UserError):
    """The data on disk or the data config is wrong; the message names the path or key at fault."""


class BadSampleError(DatasetError):
    """One sample could not be read or decoded; ``describe`` names it (loaders may skip it by policy)."""

    def __init__(self, message: str, index: int, describe: str) -> None:
        super().__init__(message)
        self.index = index
        self.describe = describe


class ImageDataset(paddle.io.Dataset):
    """Base of the built-in datasets: subclasses set ``classes``/``targets``/``in_chans`` and load one image.

    Subclasses implement ``load_image(index)`` and ``describe(index)``; this class applies the transform and
    returns the label as ``np.int64`` so Paddle's default collate yields an int64 label tensor.
    """

    classes: List[str]
    targets: Union[List[int], np.ndarray]
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
    """The train and validation datasets of one data config, with what the model needs to know of them."""

    train: paddle.io.Dataset
    val: paddle.io.Dataset
    classes: List[str]
    in_chans: int

    @property
    def num_classes(self) -> int:
        return len(self.classes)


DatasetBuilder = Callable[[Any, Transform, Transform], DatasetSplits]
_REGISTRY: Dict[str, DatasetBuilder] = {}


def register_dataset(name: str) -> Callable[[DatasetBuilder], DatasetBuilder]:
    """Decorator registering ``builder(cfg, train_transform, eval_transform) -> DatasetSplits`` as ``name``."""

    def decorator(builder: DatasetBuilder) -> DatasetBuilder:
        if name in _REGISTRY and _REGISTRY[name] is not builder:
            raise ValueError(f"dataset {name!r} is already registered (by {_REGISTRY[name].__module__})")
        _REGISTRY[name] = builder
        return builder

    return decorator


def list_datasets() -> List[str]:
    """Names accepted by ``data.name``, sorted."""
    return sorted(_REGISTRY)


def build_datasets(cfg: Any, train_transform: Transform = None, eval_transform: Transform = None) -> DatasetSplits:
    """Build the train/val datasets named by ``cfg.name`` (a ``DataConfig`` or a DictConfig with its keys)."""
    name = cfg.name
    if name not in _REGISTRY:
        raise DatasetError(f"unknown dataset data.name={name!r}; valid names: {', '.join(list_datasets())}")
    splits = _REGISTRY[name](cfg, train_transform, eval_transform)
    if not isinstance(splits, DatasetSplits):
        raise TypeError(f"dataset builder {name!r} returned {type(splits).__name__}, expected DatasetSplits")
    return splits


def _splits(train: ImageDataset, val: ImageDataset) -> DatasetSplits:
    return DatasetSplits(train=train, val=val, classes=list(train.classes), in_chans=train.in_chans)


def _require_root(cfg: Any) -> str:
    if not cfg.root:
        raise DatasetError(f"data.root must be set for data.name={cfg.name!r} (the directory holding the data)")
    return str(cfg.root)


# Built-in datasets. Their modules are imported on use so that importing the factory stays cheap and the
# dataset modules can import this one for the base class and errors.


@register_dataset("shapes")
def _build_shapes(cfg: Any, train_transform: Transform, eval_transform: Transform) -> DatasetSplits:
    from paddletrain.data.shapes import ShapesDataset

    shapes = cfg.shapes
    kwargs = dict(image_size=cfg.image_size, seed=shapes.seed)
    return _splits(
        ShapesDataset("train", shapes.num_train, transform=train_transform, **kwargs),
        ShapesDataset("val", shapes.num_val, transform=eval_transform, **kwargs),
    )


@register_dataset("imagefolder")
def _build_imagefolder(cfg: Any, train_transform: Transform, eval_transform: Transform) -> DatasetSplits:
    from paddletrain.data.imagefolder import ImageFolderDataset

    root = _require_root(cfg)
    train = ImageFolderDataset(root, "train", transform=train_transform, class_names=cfg.class_names)
    val = ImageFolderDataset(root, "val", transform=eval_transform, class_names=cfg.class_names)
    return _splits(train, val)


def _idx_builder(kind: str) -> DatasetBuilder:
    def build(cfg: Any, train_transform: Transform, eval_transform: Transform) -> DatasetSplits:
        from paddletrain.data.mnist import IDXDataset

        root = cfg.root  # None: Paddle's download cache, or Debian's fashion-mnist package
        kwargs = dict(kind=kind, download=cfg.download)
        return _splits(
            IDXDataset(root, "train", transform=train_transform, **kwargs),
            IDXDataset(root, "val", transform=eval_transform, **kwargs),
        )

    return build


def _cifar_builder(kind: str) -> DatasetBuilder:
    def build(cfg: Any, train_transform: Transform, eval_transform: Transform) -> DatasetSplits:
        from paddletrain.data.cifar import CifarDataset

        root = cfg.root  # None: Paddle's download cache
        kwargs = dict(kind=kind, download=cfg.download)
        return _splits(
            CifarDataset(root, "train", transform=train_transform, **kwargs),
            CifarDataset(root, "val", transform=eval_transform, **kwargs),
        )

    return build


for _kind in ("mnist", "fashion_mnist"):
    register_dataset(_kind)(_idx_builder(_kind))
for _kind in ("cifar10", "cifar100"):
    register_dataset(_kind)(_cifar_builder(_kind))

__all__: Sequence[str] = [
    "BadSampleError",
    "DatasetError",
    "DatasetSplits",
    "ImageDataset",
    "build_datasets",
    "list_datasets",
    "register_dataset",
]
