"""Datasets, transform presets, deterministic resumable samplers and checked loaders.

Importing this package registers the built-in datasets: each dataset module registers its own builder, and the
registry (:mod:`paddletrain.data.datasets`) imports none of them.
"""
from __future__ import annotations

from paddletrain.data import cifar, labellist, mnist  # noqa: F401  (register cifar10/100, labellist, mnist)
from paddletrain.data.datasets import (
    BadSampleError,
    DatasetError,
    DatasetSplits,
    UnknownDatasetError,
    build_datasets,
    list_datasets,
    register_dataset,
)
from paddletrain.data.imagefolder import ImageFolderDataset
from paddletrain.data.index import SampleIndex
from paddletrain.data.labellist import LabelListDataset
from paddletrain.data.loaders import CheckedDataLoader, SeededDataset, build_loader
from paddletrain.data.sampler import ResumableBatchSampler, SampleKey
from paddletrain.data.shapes import ShapesDataset
from paddletrain.data.transforms import build_transform, preprocessing_info

__all__ = [
    "BadSampleError",
    "CheckedDataLoader",
    "DatasetError",
    "DatasetSplits",
    "ImageFolderDataset",
    "LabelListDataset",
    "ResumableBatchSampler",
    "SampleIndex",
    "SampleKey",
    "SeededDataset",
    "ShapesDataset",
    "UnknownDatasetError",
    "build_datasets",
    "build_loader",
    "build_transform",
    "list_datasets",
    "preprocessing_info",
    "register_dataset",
]
