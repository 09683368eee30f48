"""paddletrain: a reusable training library for image classification on PaddlePaddle.

>>> import paddletrain
>>> model = paddletrain.create_model("resnet20", num_classes=10)

The public names load on first use (PEP 562), so ``python -m paddletrain.fit`` can own SIGTERM/SIGINT before
Paddle is imported (about 1.5 s): a signal in that window would otherwise kill the process half-started.
"""
from __future__ import annotations

import importlib
from typing import Any

__version__ = "0.2.0"

# Release 0.1's module paths (paddletrain.trainer, paddletrain.inference, ...) keep importing, with a warning.
from paddletrain._moved import install as _install_moved_paths  # noqa: E402

_install_moved_paths()

# public name -> module that defines it
_PUBLIC = {
    "Callback": "paddletrain.engine.callback",
    "StepOutput": "paddletrain.engine.callback",
    "ConfigError": "paddletrain.errors",
    "ExitCode": "paddletrain.errors",
    "NonFiniteLossError": "paddletrain.errors",
    "TrainingInterrupted": "paddletrain.errors",
    "UserError": "paddletrain.errors",
    "Limits": "paddletrain.engine.limits",
    "Predictor": "paddletrain.deploy.predictor",
    "create_model": "paddletrain.models",
    "list_models": "paddletrain.models",
    "register_model": "paddletrain.models",
    "load_pretrained": "paddletrain.models.pretrained",
    "Precision": "paddletrain.engine.precision",
    "Trainer": "paddletrain.engine.trainer",
}

__all__ = sorted([*_PUBLIC, "__version__"])


def __getattr__(name: str) -> Any:
    module = _PUBLIC.get(name)
    if module is None:
        raise AttributeError(f"module 'paddletrain' has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted([*globals(), *_PUBLIC])
