"""Datasets, transform presets, deterministic resumable samplers and checked loaders."""
from paddletrain.data.datasets import (BadSampleError, DatasetError, DatasetSplits, build_datasets, list_datasets,
                                       register_dataset)
from paddletrain.data.imagefolder import ImageFolderDataset
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
    "ResumableBatchSampler",
    "SampleKey",
    "SeededDataset",
    "ShapesDataset",
    "build_datasets",
    "build_loader",
    "build_transform",
    "list_datasets",
    "preprocessing_info",
    "register_dataset",
]
