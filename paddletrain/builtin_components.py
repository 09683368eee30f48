"""Import every built-in module that registers a name, so that every built-in name is known.

Registries (:mod:`paddletrain.registry`, and the model and dataset registries on top of them) import nothing
that registers into them; the packages below register their own entries when imported. A composition root
imports this module once; a plugin's names come from :func:`paddletrain.plugins.prepare` and entry points.
"""
from __future__ import annotations

import paddletrain.callbacks  # noqa: F401  (callbacks)
import paddletrain.data.transforms.augment  # noqa: F401  (augmentations)
import paddletrain.losses  # noqa: F401  (losses)
import paddletrain.models  # noqa: F401  (models)
import paddletrain.optim  # noqa: F401  (optimizers, schedulers)
from paddletrain.data import register_builtin_datasets

register_builtin_datasets()  # (datasets)
