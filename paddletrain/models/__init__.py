"""Model zoo: a name registry and the ResNet family, plus pretrained-weight loading.

>>> from paddletrain.models import create_model, list_models
>>> model = create_model("resnet20", num_classes=10)
"""
from . import resnet, vision  # noqa: F401  (register the ResNet builders and model="vision")
from .pretrained import LoadReport, PretrainedLoadError, load_pretrained
from .registry import (
    ModelOptionError,
    UnknownModelError,
    create_model,
    is_model,
    list_models,
    register_model,
)
from .resnet import BasicBlock, Bottleneck, ResNet

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
