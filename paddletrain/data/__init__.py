"""Data: datasets as users keep them (:mod:`.formats`, :mod:`.shards`), transforms and augmentation
(:mod:`.transforms`), deterministic resumable sampling (:mod:`.sampling`), checked loaders (:mod:`.loading`) and
the dataset tools (:mod:`.tools`); the dataset registry is :mod:`.datasets`.

The public names load on first use (PEP 562), together with the built-in datasets (each dataset module registers
its own builder; the registry, :mod:`paddletrain.data.datasets`, imports none of them). So the dataset tools
(``python -m paddletrain.data check|split``) start without loading Paddle: they need no framework.
"""
from __future__ import annotations

import importlib
from typing import Any

# Modules that register the built-in datasets.
BUILTIN_DATASET_MODULES = ("formats.cifar", "formats.imagefolder", "formats.label_list", "formats.mnist",
                           "formats.shapes", "shards.dataset")

# public name -> module that defines it
_PUBLIC = {
    "BadSampleError": "paddletrain.data.datasets",
    "CheckedDataLoader": "paddletrain.data.loading.loaders",
    "DatasetError": "paddletrain.data.datasets",
    "DatasetSplits": "paddletrain.data.datasets",
    "ImageFolderDataset": "paddletrain.data.formats.imagefolder",
    "LabelListDataset": "paddletrain.data.formats.label_list",
    "ResumableBatchSampler": "paddletrain.data.sampling.sampler",
    "SampleIndex": "paddletrain.data.formats.sample_index",
    "SampleKey": "paddletrain.data.sampling.sampler",
    "SeededDataset": "paddletrain.data.loading.loaders",
    "ShapesDataset": "paddletrain.data.formats.shapes",
    "UnknownDatasetError": "paddletrain.data.datasets",
    "build_datasets": "paddletrain.data.datasets",
    "build_loader": "paddletrain.data.loading.loaders",
    "build_transform": "paddletrain.data.transforms.presets",
    "list_datasets": "paddletrain.data.datasets",
    "preprocessing_info": "paddletrain.data.transforms.presets",
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
