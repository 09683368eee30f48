"""What is done to an image before the model sees it: the transform presets (:mod:`.presets`), per-image
augmentation policies (:mod:`.augment`) and batch-level Mixup/CutMix (:mod:`.mixup`).

The presets' public names are read from here too (``from paddletrain.data.transforms import build_transform``,
the path of release 0.1); they load on first use, so importing a sibling module loads nothing else.
"""
from __future__ import annotations

import importlib
from typing import Any

_PRESETS = ("PRESETS", "ToNormalizedArray", "build_transform", "eval_image_size", "preprocessing_info")


def __getattr__(name: str) -> Any:
    if name not in _PRESETS:
        raise AttributeError(f"module 'paddletrain.data.transforms' has no attribute {name!r}")
    return getattr(importlib.import_module("paddletrain.data.transforms.presets"), name)


__all__ = list(_PRESETS)
