"""A network of conv groups for small images: few, wide layers that pool early (``model=airbench``).

The layout of the network in airbench94 (Jordan 2024, "94% on CIFAR-10 in 3.29 seconds on a single GPU",
arXiv 2404.00498): a small stem (a 2x2 convolution without padding, then GELU), three groups of
conv 3x3 -> max-pool 2 -> norm -> GELU -> conv 3x3 -> norm -> GELU, a global max-pool and a linear head
(airbench scales its logits by 1/9: ``logit_scale``). No residual connections: each group halves the side
before its second conv, so most of the arithmetic runs on small maps. At 28 px with the default widths (stem 24;
groups 64, 256, 256) a training step costs 534 MFLOP an image, against 743 for ``resnet20`` at ``width=2``.

It keeps the models' contract (``forward_features``, ``forward_head``, ``get_classifier``, ``reset_classifier``,
``num_features``, ``num_classes``, ``pretrained_cfg``), so fine-tuning, TTA, export and the norm keys
(``model.norm_momentum``, ``model.norm_frozen_scale``) work on it as on a ResNet.
"""
from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import paddle
import paddle.nn as nn
import paddle.nn.functional as F

from ..errors import ConfigError
from ._registry import register_model
from .resnet import GLOBAL_POOLS, conv3x3, widened

__all__ = ["ConvGroup", "ConvGroupNet"]


class GELU(nn.Layer):
    """GELU (exact, erf form) from elementary operations: ``nn.GELU`` fails to export to some of ``ship``'s targets
    ("expected Value, but got Variable" in Paddle 3.3's static graph)."""

    def forward(self, x: paddle.Tensor) -> paddle.Tensor:
        return 0.5 * x * (1.0 + paddle.erf(x * 0.7071067811865476))


class ConvGroup(nn.Layer):
    """conv 3x3 -> max-pool 2 -> norm -> GELU -> conv 3x3 -> norm -> GELU: ``in_chs`` to ``out_chs`` channels at
    half the side (floor)."""

    def __init__(self, in_chs: int, out_chs: int) -> None:
        super().__init__()
        self.conv1 = conv3x3(in_chs, out_chs)
        self.pool = nn.MaxPool2D(kernel_size=2, stride=2)
        self.bn1 = nn.BatchNorm2D(out_chs)
        self.conv2 = conv3x3(out_chs, out_chs)
        self.bn2 = nn.BatchNorm2D(out_chs)
        self.act = GELU()

    def forward(self, x: paddle.Tensor) -> paddle.Tensor:
        x = self.act(self.bn1(self.pool(self.conv1(x))))
        return self.act(self.bn2(self.conv2(x)))


class ConvGroupNet(nn.Layer):
    """Stem, conv groups, global pool, scaled linear head.

    Args:
        num_classes: classifier outputs; 0 gives a feature extractor (the head is an identity).
        in_chans: input image channels.
        stem_width: output channels of the 2x2 stem convolution (with a bias, no norm: it sees raw pixels).
        stage_widths: output channels of each conv group; each group halves the side.
        drop_rate: dropout probability on the pooled features, before the classifier.
        global_pool: ``"max"`` (airbench's), ``"avg"`` or ``"avgmax"``.
        logit_scale: the logits are the head's output times this. airbench uses 1/9 together with a learning
            rate tens of times the usual one; 1 suits the usual SGD learning rates (0.1-0.4).
    """

    def __init__(
        self,
        num_classes: int = 1000,
        in_chans: int = 3,
        stem_width: int = 24,
        stage_widths: Sequence[int] = (64, 256, 256),
        drop_rate: float = 0.0,
        global_pool: str = "max",
        logit_scale: float = 1.0,
    ) -> None:
        super().__init__()
        if global_pool not in GLOBAL_POOLS:
            raise ConfigError(f"global_pool must be one of {', '.join(GLOBAL_POOLS)}, got {global_pool!r}.")
        if num_classes < 0:
            raise ConfigError(f"num_classes must be >= 0 (0 = feature extractor), got {num_classes}.")
        if in_chans < 1:
            raise ConfigError(f"in_chans must be >= 1, got {in_chans}.")
        if not stage_widths:
            raise ConfigError("stage_widths must name at least one conv group's channels.")
        if not 0.0 <= drop_rate < 1.0:
            raise ConfigError(f"drop_rate must be in [0, 1), got {drop_rate}.")
        if not logit_scale > 0:
            raise ConfigError(f"logit_scale must be > 0, got {logit_scale}.")
        self.stem = nn.Conv2D(in_chans, stem_width, kernel_size=2, padding=0)
        self.stem_act = GELU()
        widths = [stem_width, *stage_widths]
        self.groups = nn.Sequential(*(ConvGroup(a, b) for a, b in zip(widths[:-1], widths[1:], strict=True)))
        self.num_features = int(stage_widths[-1])
        self.num_classes = num_classes
        self.global_pool = global_pool
        self.drop_rate = drop_rate
        self.logit_scale = float(logit_scale)
        self.fc: nn.Layer = self._make_head(num_classes)
        self.pretrained_cfg: dict[str, Any] = {
            "input_size": (in_chans, 32, 32),
            "mean": (0.5,) * in_chans,
            "std": (0.5,) * in_chans,
            "interpolation": "bilinear",
            "crop_pct": 1.0,
            "num_classes": num_classes,
            "classifier": "fc",
            "first_conv": "stem",
        }

    def _make_head(self, num_classes: int) -> nn.Layer:
        if num_classes == 0:
            return nn.Identity()
        fc = nn.Linear(self.num_features, num_classes, bias_attr=False)
        bound = 1.0 / math.sqrt(self.num_features)
        nn.initializer.Uniform(-bound, bound)(fc.weight)
        return fc

    def get_classifier(self) -> nn.Layer:
        """The classifier head (``fc``): a bias-free ``nn.Linear``, or ``nn.Identity`` when ``num_classes == 0``."""
        return self.fc

    def reset_classifier(self, num_classes: int, global_pool: str | None = None) -> None:
        """Replace the head with a freshly initialised one for ``num_classes`` (0 = identity)."""
        if num_classes < 0:
            raise ConfigError(f"num_classes must be >= 0 (0 = feature extractor), got {num_classes}.")
        if global_pool is not None:
            if global_pool not in GLOBAL_POOLS:
                raise ConfigError(f"global_pool must be one of {', '.join(GLOBAL_POOLS)}, got {global_pool!r}.")
            self.global_pool = global_pool
        self.num_classes = num_classes
        self.fc = self._make_head(num_classes)
        self.pretrained_cfg = {**self.pretrained_cfg, "num_classes": num_classes}

    def forward_features(self, x: paddle.Tensor) -> paddle.Tensor:
        """Stem and conv groups: the unpooled feature map (``num_features`` channels)."""
        return self.groups(self.stem_act(self.stem(x)))

    def forward_head(self, x: paddle.Tensor, pre_logits: bool = False) -> paddle.Tensor:
        """Global pool, dropout and the scaled classifier; ``pre_logits=True`` stops before the classifier."""
        if self.global_pool == "avg":
            x = F.adaptive_avg_pool2d(x, 1)
        elif self.global_pool == "max":
            x = F.adaptive_max_pool2d(x, 1)
        else:
            x = 0.5 * (F.adaptive_avg_pool2d(x, 1) + F.adaptive_max_pool2d(x, 1))
        x = paddle.flatten(x, 1)
        if self.drop_rate > 0.0:
            x = F.dropout(x, p=self.drop_rate, training=self.training)
        if pre_logits or self.num_classes == 0:
            return x
        return self.fc(x) * self.logit_scale

    def forward(self, x: paddle.Tensor) -> paddle.Tensor:
        return self.forward_head(self.forward_features(x))


@register_model
def airbench(*, num_classes: int = 1000, in_chans: int = 3, width: float = 1.0, drop_rate: float = 0.0,
             global_pool: str = "max", logit_scale: float = 1.0) -> ConvGroupNet:
    """airbench94's network (Jordan 2024): a 2x2 stem of 24 channels, conv groups of 64, 256, 256; ``width``
    multiplies every one of them."""
    arch = widened({"stem_width": 24, "stage_widths": (64, 256, 256)}, width)
    model = ConvGroupNet(num_classes=num_classes, in_chans=in_chans, drop_rate=drop_rate, global_pool=global_pool,
                         logit_scale=logit_scale, **arch)
    model.pretrained_cfg["architecture"] = "airbench"
    return model
