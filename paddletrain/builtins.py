"""Import every built-in module that registers into :mod:`paddletrain.registries` (and the model and dataset
registries), so their names are known. Importing this module is all it takes."""
from __future__ import annotations

import paddletrain.callbacks  # noqa: F401  (callbacks)
import paddletrain.data  # noqa: F401  (datasets, augmentations)
import paddletrain.data.augment  # noqa: F401
import paddletrain.losses  # noqa: F401  (losses)
import paddletrain.models  # noqa: F401  (models)
import paddletrain.optim  # noqa: F401  (optimizers, schedulers)
