"""Import paths that moved (release 0.1's into the wings engine/, deploy/, metrics/; release 0.2's into the data
wing's sub-wings and to names with one meaning): they keep working for one release, each with a
``DeprecationWarning`` naming the new path.

``import paddletrain.trainer`` (or ``from paddletrain.inference import Predictor``) gets a module object that hands
every name on from its new home; nothing is copied, so ``paddletrain.trainer.Trainer is
paddletrain.engine.trainer.Trainer``. Set an attribute on the new module (e.g. in a test's monkeypatch), not on
the old name: the old one only reads. The commands ``paddletrain.export``, ``predict`` and ``ship`` stayed where
they are; their library halves moved to ``paddletrain.deploy`` and are handed on by :func:`forward_names`.
"""
from __future__ import annotations

import importlib
import importlib.abc
import importlib.machinery
import sys
import types
import warnings
from collections.abc import Callable
from typing import Any

# old module -> new module: deprecated in 0.2.0, removed in 0.3.0.
MOVED_MODULES = {
    "paddletrain.trainer": "paddletrain.engine.trainer",
    "paddletrain.limits": "paddletrain.engine.limits",
    "paddletrain.hooks": "paddletrain.engine.hooks",
    "paddletrain.precision": "paddletrain.engine.precision",
    "paddletrain.summary": "paddletrain.engine.summary",
    "paddletrain.restore": "paddletrain.engine.state",
    "paddletrain.state_checks": "paddletrain.engine.state_checks",
    "paddletrain.resume": "paddletrain.engine.resume",
    "paddletrain.callbacks.base": "paddletrain.engine.callback",
    "paddletrain.inference": "paddletrain.deploy.predictor",
    "paddletrain.quantize": "paddletrain.deploy.quantize",
    "paddletrain.bias_correction": "paddletrain.deploy.bias_correction",
    "paddletrain.divergence": "paddletrain.deploy.divergence",
    "paddletrain.decoding": "paddletrain.deploy.decoding",
    "paddletrain.inputs": "paddletrain.deploy.inputs",
    "paddletrain.native_output": "paddletrain.deploy.native_output",
    "paddletrain.tta": "paddletrain.models.tta",
    "paddletrain.metrics_multilabel": "paddletrain.metrics.multilabel",
    "paddletrain.class_names": "paddletrain.data.formats.class_names",
    # Release 0.2: the data wing in sub-wings, and one meaning per module name.
    "paddletrain.data.imagefolder": "paddletrain.data.formats.imagefolder",
    "paddletrain.data.folder_scan": "paddletrain.data.formats.folder_scan",
    "paddletrain.data.scancache": "paddletrain.data.formats.scancache",
    "paddletrain.data.labellist": "paddletrain.data.formats.label_list",
    "paddletrain.data.label_lists": "paddletrain.data.formats.label_list_file",
    "paddletrain.data.mnist": "paddletrain.data.formats.mnist",
    "paddletrain.data.cifar": "paddletrain.data.formats.cifar",
    "paddletrain.data.shapes": "paddletrain.data.formats.shapes",
    "paddletrain.data.unlabeled": "paddletrain.data.formats.unlabeled",
    "paddletrain.data.images": "paddletrain.data.formats.images",
    "paddletrain.data.class_names": "paddletrain.data.formats.class_names",
    "paddletrain.data.index": "paddletrain.data.formats.sample_index",
    "paddletrain.data.augment": "paddletrain.data.transforms.augment",
    "paddletrain.data.mixup": "paddletrain.data.transforms.mixup",
    "paddletrain.data.sampler": "paddletrain.data.sampling.sampler",
    "paddletrain.data.balance": "paddletrain.data.sampling.balance",
    "paddletrain.data.holdout": "paddletrain.data.sampling.holdout",
    "paddletrain.data.loaders": "paddletrain.data.loading.loaders",
    "paddletrain.data.bundle": "paddletrain.data.loading.bundle",
    "paddletrain.data.check": "paddletrain.data.tools.check",
    "paddletrain.data.split": "paddletrain.data.tools.split",
    "paddletrain.deploy.export": "paddletrain.deploy.exporter",
    "paddletrain.deploy.predict": "paddletrain.deploy.batch_prediction",
    "paddletrain.deploy.ship": "paddletrain.deploy.shipping",
    "paddletrain.bench.precision": "paddletrain.bench.precision_cost",
    "paddletrain.bench.index": "paddletrain.bench.million_files",
    "paddletrain.models.registry": "paddletrain.models._registry",
    # After 0.2.0: the built-in names are registered by the config's checks.
    "paddletrain.builtin_components": "paddletrain.validation",
}


def _warn(old: str, new: str) -> None:
    warnings.warn(f"{old} moved to {new}; the old path is deprecated and goes in 0.3.0", DeprecationWarning,
                  stacklevel=3)


class _MovedModule(types.ModuleType):
    """Stands at an old path and reads every name from the module that now holds it."""

    def __init__(self, old: str, new: str) -> None:
        super().__init__(old, f"Moved to {new}.")
        self.__dict__["_new"] = new

    def __getattr__(self, name: str) -> Any:
        return getattr(importlib.import_module(self.__dict__["_new"]), name)

    def __dir__(self) -> list[str]:
        return dir(importlib.import_module(self.__dict__["_new"]))


class _MovedFinder(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    """Finds the old paths of :data:`MOVED_MODULES` (and nothing else) for the import system."""

    def find_spec(self, fullname: str, path: Any = None, target: Any = None) -> importlib.machinery.ModuleSpec | None:
        if fullname not in MOVED_MODULES:
            return None
        return importlib.machinery.ModuleSpec(fullname, self)

    def create_module(self, spec: importlib.machinery.ModuleSpec) -> types.ModuleType:
        new = MOVED_MODULES[spec.name]
        _warn(spec.name, new)
        importlib.import_module(new)
        return _MovedModule(spec.name, new)

    def exec_module(self, module: types.ModuleType) -> None:
        """Nothing to run: the module reads its names from the new one."""


def install() -> None:
    """Let the old paths import (once per process; :mod:`paddletrain` calls it)."""
    if not any(isinstance(finder, _MovedFinder) for finder in sys.meta_path):
        sys.meta_path.append(_MovedFinder())


def forward_names(old: str, new: str) -> Callable[[str], Any]:
    """A module ``__getattr__`` for a command module ``old`` whose library half moved to ``new``: a name the
    command does not define itself is read from ``new``, with a ``DeprecationWarning``."""

    def __getattr__(name: str) -> Any:
        if name.startswith("__"):
            raise AttributeError(f"module {old!r} has no attribute {name!r}")
        value = getattr(importlib.import_module(new), name)
        _warn(f"{old}.{name}", f"{new}.{name}")
        return value

    return __getattr__
