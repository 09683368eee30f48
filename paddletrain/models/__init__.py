"""Model zoo: a name registry and the ResNet family, plus pretrained-weight loading.

>>> from paddletrain.models import create_model, list_models
>>> model = create_model("resnet20", num_classes=10)

Importing this package registers the built-in builders (:mod:`.resnet`, :mod:`.vision`); the registry itself
(:mod:`.registry`) imports none of them.
"""
from __future__ import annotations

from paddletrain.models import convgroups, resnet, vision  # noqa: F401  (register the built-in builders)
from paddletrain.models._registry import (
    ModelOptionError,
    UnknownModelError,
    is_model,
    list_models,
    register_model,
)
from paddletrain.models.factory import create_model
from paddletrain.models.pretrained import LoadReport, PretrainedLoadError, load_pretrained
from paddletrain.models.resnet import BasicBlock, Bottleneck, ResNet

__all__ = [
    "BasicBlock",
    "Bottleneck",
    "LoadReport",
    "ModelOptionError",
    "PretrainedLoadError",
    "ResNet",
    "UnknownModelError",
    "create_model",
    "is_model",
    "list_models",
    "load_pretrained",
    "register_model",
]
