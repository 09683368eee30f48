"""Datasets, transform presets, deterministic resumable samplers and checked loaders.

The public names load on first use (PEP 562), together with the built-in datasets (each dataset module registers
its own builder; the registry, :mod:`paddletrain.data.datasets`, imports none of them). So the dataset tools
(``python -m paddletrain.data check|split``) start without loading Paddle: they need no framework.
"""
from __future__ import annotations

import importlib
from typing import Any

# Modules that register the built-in datasets.
BUILTIN_DATASET_MODULES = ("cifar", "imagefolder", "labellist", "mnist", "shapes", "shards.dataset")

# public name -> module that defines it
_PUBLIC = {
    "BadSampleError": "paddletrain.data.datasets",
    "CheckedDataLoader": "paddletrain.data.loaders",
    "DatasetError": "paddletrain.data.datasets",
    "DatasetSplits": "paddletrain.data.datasets",
    "ImageFolderDataset": "paddletrain.data.imagefolder",
    "LabelListDataset": "paddletrain.data.labellist",
    "ResumableBatchSampler": "paddletrain.data.sampler",
    "SampleIndex": "paddletrain.data.index",
    "SampleKey": "paddletrain.data.sampler",
    "SeededDataset": "paddletrain.data.loaders",
    "ShapesDataset": "paddletrain.data.shapes",
    "UnknownDatasetError": "paddletrain.data.datasets",
    "build_datasets": "paddletrain.data.datasets",
    "build_loader": "paddletrain.data.loaders",
    "build_transform": "paddletrain.data.transforms",
    "list_datasets": "paddletrain.data.datasets",
    "preprocessing_info": "paddletrain.data.transforms",
    "register_dataset": "paddletrain.data.datasets",
}


def register_builtin_datasets() -> None:
    """Import the modules of the built-in datasets, which register them."""
    for module in BUILTIN_DATASET_MODULES:
        importlib.import_module(f"paddletrain.data.{module}")


def __getattr__(name: str) -> Any:
    module = _PUBLIC.get(name)
    if module is None:
        raise AttributeError(f"module 'paddletrain.data' has no attribute {name!r}")
    register_builtin_datasets()
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted([*globals(), *_PUBLIC])


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
