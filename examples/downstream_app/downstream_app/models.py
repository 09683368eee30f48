"""This app's own model, registered under its builder's name."""
from __future__ import annotations

from paddletrain.models import BasicBlock, ResNet, register_model


@register_model
def tiny_resnet(**options) -> ResNet:
    """A 3-stage CIFAR-style ResNet with one BasicBlock per stage (this app's own model)."""
    return ResNet(BasicBlock, (1, 1, 1), stem_type="cifar", stem_width=16, stage_widths=(16, 32, 64), **options)
