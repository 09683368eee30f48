"""``model=vision model.arch=<builder>``: any ``paddle.vision.models`` classifier behind paddletrain's contract.

The network is paddle.vision's own, with its own parameter names, so ``vision:<arch>`` weights load as they
are. Its class is extended in place with ``get_classifier``, ``reset_classifier``, ``num_classes``,
``num_features`` and ``pretrained_cfg`` (it stays an instance of the paddle.vision class). The head is found
as the last ``Linear`` (or, for SqueezeNet, the last 1x1 ``Conv2D`` producing the classes); ``in_chans`` other
than 3 replaces the first conv. ``forward_features``/``forward_head`` are not provided: paddle.vision
architectures do not share a feature/head split.

>>> model = create_model("vision", arch="shufflenet_v2_x0_25", num_classes=2, pretrained="vision:shufflenet_v2_x0_25")
"""
from __future__ import annotations

import inspect
from typing import Any

import paddle.nn as nn
import paddle.vision.models as vision_models

from ..errors import ConfigError
from ._registry import register_model

__all__ = ["VisionModel", "list_vision_archs", "vision"]

IMAGENET_MEAN = (0.485, 0.456, 0.406)
IMAGENET_STD = (0.229, 0.224, 0.225)
# Architectures whose forward does not return one logits tensor in training mode.
_MULTI_OUTPUT = ("googlenet",)


def list_vision_archs() -> list[str]:
    """The builder functions of ``paddle.vision.models`` (``resnet18``, ``shufflenet_v2_x0_25``, ...)."""
    return sorted(n for n in dir(vision_models)
                  if not n.startswith("_") and inspect.isfunction(getattr(vision_models, n)))


def _sublayer(model: nn.Layer, name: str) -> nn.Layer:
    layer = model
    for part in name.split("."):
        layer = getattr(layer, part) if not part.isdigit() else layer[int(part)]
    return layer


def _replace_sublayer(model: nn.Layer, name: str, new: nn.Layer) -> None:
    parent_name, _, child = name.rpartition(".")
    parent = _sublayer(model, parent_name) if parent_name else model
    if child.isdigit():
        parent._sub_layers[child] = new  # nn.Sequential keeps its items by string index
    else:
        setattr(parent, child, new)


def _find_head(model: nn.Layer, num_classes: int) -> str:
    named = list(model.named_sublayers())
    linears = [name for name, layer in named if isinstance(layer, nn.Linear)]
    if linears:
        return linears[-1]
    convs = [name for name, layer in named if isinstance(layer, nn.Conv2D) and layer._out_channels == num_classes]
    return convs[-1] if convs else ""


def _first_conv(model: nn.Layer) -> str:
    return next((name for name, layer in model.named_sublayers() if isinstance(layer, nn.Conv2D)), "")


class VisionModel:
    """The paddletrain model contract, mixed into a paddle.vision network's class by :func:`vision`."""

    pretrained_cfg: dict[str, Any]
    num_classes: int

    @property
    def num_features(self) -> int:
        head = self.get_classifier()
        return int(head.weight.shape[0] if isinstance(head, nn.Linear) else head._in_channels)

    def get_classifier(self) -> nn.Layer:
        """The classifier layer (a ``Linear``, or SqueezeNet's 1x1 ``Conv2D``)."""
        return _sublayer(self, self.pretrained_cfg["classifier"])

    def reset_classifier(self, num_classes: int) -> None:
        """Replace the classifier with a freshly initialised one for ``num_classes`` (>= 1)."""
        if num_classes < 1:
            raise ConfigError(f"model=vision needs num_classes >= 1, got {num_classes}")
        head = self.get_classifier()
        if isinstance(head, nn.Linear):
            new: nn.Layer = nn.Linear(head.weight.shape[0], num_classes)
        else:
            new = nn.Conv2D(head._in_channels, num_classes, head._kernel_size, data_format=head._data_format)
        _replace_sublayer(self, self.pretrained_cfg["classifier"], new)
        self.pretrained_cfg = {**self.pretrained_cfg, "num_classes": num_classes}
        self.num_classes = num_classes


_CLASSES: dict[type, type] = {}


def _with_contract(net: nn.Layer) -> nn.Layer:
    base = type(net)
    if base not in _CLASSES:
        _CLASSES[base] = type(base.__name__, (VisionModel, base), {"__module__": base.__module__})
    net.__class__ = _CLASSES[base]
    return net


def _adapt_first_conv(net: nn.Layer, name: str, in_chans: int) -> None:
    conv = _sublayer(net, name)
    if conv._groups != 1:
        raise ConfigError(f"in_chans={in_chans}: the first conv {name!r} is grouped; only 3-channel input works")
    new = nn.Conv2D(in_chans, conv._out_channels, conv._kernel_size, stride=conv._stride, padding=conv._padding,
                    dilation=conv._dilation, bias_attr=None if conv.bias is not None else False,
                    data_format=conv._data_format)
    _replace_sublayer(net, name, new)


@register_model
def vision(
    arch: str | None = None,
    num_classes: int = 1000,
    in_chans: int = 3,
    drop_rate: float = 0.0,
    zero_init_residual: bool = False,
    data_format: str = "NCHW",
    **kwargs: Any,
) -> nn.Layer:
    """Build ``paddle.vision.models.<arch>(num_classes=..., **kwargs)`` with the paddletrain contract.

    Args:
        arch: a paddle.vision builder name (see :func:`list_vision_archs`); config ``model.arch``.
        num_classes: classifier outputs (>= 1).
        in_chans: input channels; other than 3 replaces the first conv (pretrained weights adapt it).
        drop_rate, zero_init_residual, data_format: accepted for a uniform config, but only at their defaults.
        **kwargs: passed to the builder (e.g. ``scale=0.5`` for ``mobilenet_v2``).
    """
    archs = list_vision_archs()
    if not arch:
        raise ConfigError(f"model=vision needs model.arch, one of: {', '.join(archs)}")
    if arch not in archs:
        raise ConfigError(f"model.arch={arch!r} is not a paddle.vision.models builder; choose one of: "
                          f"{', '.join(archs)}")
    if arch in _MULTI_OUTPUT:
        raise ConfigError(f"model.arch={arch!r} returns several outputs (auxiliary heads); paddletrain trains "
                          f"single-output classifiers")
    unsupported = {"model.drop_rate": drop_rate != 0.0, "model.zero_init_residual": zero_init_residual,
                   "model.data_format": data_format != "NCHW"}
    for key, is_set in unsupported.items():
        if is_set:
            raise ConfigError(f"{key} is not supported with model=vision (paddle.vision builds {arch} itself)")
    if num_classes < 1:
        raise ConfigError(f"model=vision needs num_classes >= 1, got {num_classes}")
    if in_chans < 1:
        raise ConfigError(f"in_chans must be >= 1, got {in_chans}")
    try:
        net = getattr(vision_models, arch)(num_classes=num_classes, **kwargs)
    except TypeError as err:
        raise ConfigError(f"model=vision arch={arch}: {err}") from err
    head = _find_head(net, num_classes)
    first_conv = _first_conv(net)
    if not head:
        raise ConfigError(f"model.arch={arch!r}: no classifier layer found")
    if in_chans != 3:
        _adapt_first_conv(net, first_conv, in_chans)
    size = 299 if arch.startswith("inception") else 224
    mean, std = IMAGENET_MEAN, IMAGENET_STD
    if in_chans != 3:
        mean, std = (sum(mean) / 3,) * in_chans, (sum(std) / 3,) * in_chans
    net = _with_contract(net)
    net.num_classes = num_classes
    net.pretrained_cfg = {
        "input_size": (in_chans, size, size),
        "mean": mean,
        "std": std,
        "interpolation": "bilinear",
        "crop_pct": 0.875,
        "num_classes": num_classes,
        "classifier": head,
        "first_conv": first_conv,
        "architecture": arch,
    }
    return net
