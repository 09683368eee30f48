"""ResNet family: blocks, one configurable ``ResNet`` and the registered builders.

Three layouts share one class:

* ImageNet ResNet / ResNeXt / Wide ResNet (He et al. 2015; Xie et al. 2017; Zagoruyko & Komodakis 2016):
  7x7 stem + max-pool, parameter names identical to ``paddle.vision.models`` so its weights load as they are.
* ResNet-D, "vd" (He et al. 2019, "Bag of Tricks"), laid out as PaddleClas' legendary ResNet*_vd: a deep stem
  of three 3x3 convs (32, 32, 64), the stride on the bottleneck's 3x3 conv, and projection shortcuts that
  average-pool (2x2, stride 2) before a stride-1 1x1 conv. As in PaddleClas, the first block of the first
  stage always has a projection shortcut (without pooling), even when its shapes match.
* CIFAR ResNet-20/32/44/56/110 (He et al. 2015, section 4.2): one 3x3 stem conv with 16 channels, no max-pool,
  three stages of BasicBlocks (16, 32, 64) and 1x1 conv + norm projection shortcuts where shapes change.

Every model has the same contract: ``forward_features`` (unpooled map), ``forward_head``, ``forward``,
``get_classifier``, ``reset_classifier``, ``num_features``, ``num_classes`` and ``pretrained_cfg``.
"""
from __future__ import annotations

import inspect
import math
from collections.abc import Callable, Sequence
from typing import Any

import paddle
import paddle.nn as nn
import paddle.nn.functional as F

from ..errors import ConfigError
from ._registry import ModelOptionError, check_model_options, register_model
from .layers import DropPath, drop_path_rates

__all__ = ["BasicBlock", "Bottleneck", "ResNet"]

IMAGENET_MEAN = (0.485, 0.456, 0.406)
IMAGENET_STD = (0.229, 0.224, 0.225)
CIFAR10_MEAN = (0.4914, 0.4822, 0.4465)
CIFAR10_STD = (0.2470, 0.2435, 0.2616)

DATA_FORMATS = ("NCHW", "NHWC")
GLOBAL_POOLS = ("avg", "max", "avgmax")
STEM_TYPES = ("basic", "deep", "cifar")

LayerFactory = Callable[..., nn.Layer]
_NORM_LAYERS = (nn.BatchNorm, nn.BatchNorm2D, nn.SyncBatchNorm, nn.GroupNorm, nn.LayerNorm, nn.InstanceNorm2D)


def conv2d(
    in_chs: int, out_chs: int, kernel_size: int, stride: int = 1, groups: int = 1, data_format: str = "NCHW"
) -> nn.Conv2D:
    """Bias-free conv with 'same' padding (a norm layer always follows), born with its final initialisation.

    Kaiming normal in fan_out mode as torchvision; Paddle's initializer derives fan_in from the weight, so the
    fan_out is passed in its place. Initialising here rather than afterwards halves the build time of the
    large models.
    """
    fan_out = out_chs * kernel_size * kernel_size
    return nn.Conv2D(
        in_chs,
        out_chs,
        kernel_size,
        stride=stride,
        padding=kernel_size // 2,
        groups=groups,
        weight_attr=paddle.ParamAttr(initializer=nn.initializer.KaimingNormal(fan_in=fan_out)),
        bias_attr=False,
        data_format=data_format,
    )


def conv3x3(in_chs: int, out_chs: int, stride: int = 1, groups: int = 1, data_format: str = "NCHW") -> nn.Conv2D:
    """3x3 convolution, padding 1, no bias."""
    return conv2d(in_chs, out_chs, 3, stride, groups, data_format)


def conv1x1(in_chs: int, out_chs: int, stride: int = 1, data_format: str = "NCHW") -> nn.Conv2D:
    """1x1 convolution, no bias."""
    return conv2d(in_chs, out_chs, 1, stride, data_format=data_format)


def _drop_path_layer(rate: float) -> nn.Layer:
    # nn.Identity when unused: the forward stays paddle.vision's arithmetic; neither holds parameters, so
    # state_dict names never change.
    return DropPath(rate) if rate > 0 else nn.Identity()


class _ResidualBlock(nn.Layer):
    """What both blocks share: the arguments :class:`ResNet` builds them with, the ``downsample`` shortcut, and
    stochastic depth (``drop_path_rate``) on the residual branch before the addition.

    ``norm_layer`` is called as ``norm_layer(channels, data_format=...)``; ``act_layer`` as ``act_layer()``. A
    block builds its branch in ``_build_branch`` and adds it to the shortcut in ``forward``.
    """

    expansion: int = 1

    def __init__(
        self,
        inplanes: int,
        planes: int,
        stride: int = 1,
        downsample: nn.Layer | None = None,
        groups: int = 1,
        base_width: int = 64,
        norm_layer: LayerFactory = nn.BatchNorm2D,
        act_layer: LayerFactory = nn.ReLU,
        data_format: str = "NCHW",
        drop_path_rate: float = 0.0,
    ) -> None:
        super().__init__()
        self._build_branch(inplanes, planes, stride, groups, base_width, norm_layer, act_layer, data_format)
        self.drop_path = _drop_path_layer(drop_path_rate)
        self.downsample = downsample

    def _build_branch(self, inplanes: int, planes: int, stride: int, groups: int, base_width: int,
                      norm_layer: LayerFactory, act_layer: LayerFactory, data_format: str) -> None:
        raise NotImplementedError


class BasicBlock(_ResidualBlock):
    """Two 3x3 convs with a residual connection (ResNet-18/34, CIFAR ResNets)."""

    expansion: int = 1

    def _build_branch(self, inplanes: int, planes: int, stride: int, groups: int, base_width: int,
                      norm_layer: LayerFactory, act_layer: LayerFactory, data_format: str) -> None:
        if groups != 1 or base_width != 64:
            raise ConfigError(
                f"BasicBlock supports only groups=1 and base_width=64, got groups={groups}, "
                f"base_width={base_width}; use Bottleneck for ResNeXt / Wide ResNet."
            )
        self.conv1 = conv3x3(inplanes, planes, stride, data_format=data_format)
        self.bn1 = norm_layer(planes, data_format=data_format)
        self.act1 = act_layer()
        self.conv2 = conv3x3(planes, planes, data_format=data_format)
        self.bn2 = norm_layer(planes, data_format=data_format)
        self.act2 = act_layer()

    def zero_init_last(self) -> None:
        """Zero the last norm's scale so the block starts as an identity."""
        nn.initializer.Constant(0.0)(self.bn2.weight)

    def forward(self, x: paddle.Tensor) -> paddle.Tensor:
        shortcut = x if self.downsample is None else self.downsample(x)
        x = self.act1(self.bn1(self.conv1(x)))
        x = self.bn2(self.conv2(x))
        return self.act2(self.drop_path(x) + shortcut)


class Bottleneck(_ResidualBlock):
    """1x1 reduce, 3x3 (strided, grouped), 1x1 expand by ``expansion``; ResNet-50+, ResNeXt, Wide ResNet.

    The stride sits on the 3x3 conv (ResNet v1.5 / "vb"), as in paddle.vision, torchvision and PaddleClas.
    """

    expansion: int = 4

    def _build_branch(self, inplanes: int, planes: int, stride: int, groups: int, base_width: int,
                      norm_layer: LayerFactory, act_layer: LayerFactory, data_format: str) -> None:
        width = int(planes * (base_width / 64.0)) * groups
        outplanes = planes * self.expansion
        self.conv1 = conv1x1(inplanes, width, data_format=data_format)
        self.bn1 = norm_layer(width, data_format=data_format)
        self.act1 = act_layer()
        self.conv2 = conv3x3(width, width, stride, groups=groups, data_format=data_format)
        self.bn2 = norm_layer(width, data_format=data_format)
        self.act2 = act_layer()
        self.conv3 = conv1x1(width, outplanes, data_format=data_format)
        self.bn3 = norm_layer(outplanes, data_format=data_format)
        self.act3 = act_layer()

    def zero_init_last(self) -> None:
        """Zero the last norm's scale so the block starts as an identity."""
        nn.initializer.Constant(0.0)(self.bn3.weight)

    def forward(self, x: paddle.Tensor) -> paddle.Tensor:
        shortcut = x if self.downsample is None else self.downsample(x)
        x = self.act1(self.bn1(self.conv1(x)))
        x = self.act2(self.bn2(self.conv2(x)))
        x = self.bn3(self.conv3(x))
        return self.act3(self.drop_path(x) + shortcut)


Block = type[BasicBlock | Bottleneck]


class ResNet(nn.Layer):
    """A ResNet body (stem + stages) with a pooled linear head.

    Args:
        block: ``BasicBlock`` or ``Bottleneck``.
        layers: blocks per stage, e.g. ``(3, 4, 6, 3)``; one stage per entry (``layer1``, ``layer2``, ...).
        num_classes: classifier outputs; 0 makes ``fc`` an identity and the model a feature extractor.
        in_chans: input image channels.
        stem_type: ``"basic"`` (7x7/2 conv + max-pool), ``"deep"`` (3x3 convs 32/32/64 + max-pool, ResNet-D)
            or ``"cifar"`` (3x3/1 conv with ``stem_width`` channels, no max-pool).
        stem_width: output channels of the basic and CIFAR stems (the deep stem is fixed at 32/32/64).
        stage_widths: ``planes`` of each stage (a Bottleneck stage outputs ``planes * 4``).
        groups, base_width: ResNeXt cardinality and width per group; Wide ResNet sets ``base_width=128``.
        avg_down: projection shortcuts average-pool 2x2 before a stride-1 1x1 conv (ResNet-D).
        project_first_shortcut: give the first block of the first stage a projection shortcut even when its
            shapes match (PaddleClas' vd layout, so its weights can be mapped on).
        zero_init_residual: zero the last norm scale of every block, so each block starts as an identity.
        norm_layer: called as ``norm_layer(channels, data_format=...)``; default ``nn.BatchNorm2D``.
        act_layer: called as ``act_layer()``; default ``nn.ReLU``.
        data_format: ``"NCHW"`` or ``"NHWC"``: the layout of every conv/norm/pool (NHWC is faster for AMP on
            GPUs). The input is always NCHW.
        drop_rate: dropout probability on the pooled features, before the classifier.
        drop_path_rate: stochastic depth (Huang et al. 2016): each block's residual branch is dropped per sample
            with a probability rising linearly from 0 at the first block to ``drop_path_rate`` at the last
            (timm's rule), before the addition; identity in evaluation.
        global_pool: ``"avg"``, ``"max"`` or ``"avgmax"`` (mean of both).
    """

    def __init__(
        self,
        block: Block,
        layers: Sequence[int],
        num_classes: int = 1000,
        in_chans: int = 3,
        stem_type: str = "basic",
        stem_width: int = 64,
        stage_widths: Sequence[int] = (64, 128, 256, 512),
        groups: int = 1,
        base_width: int = 64,
        avg_down: bool = False,
        project_first_shortcut: bool = False,
        zero_init_residual: bool = False,
        norm_layer: LayerFactory | None = None,
        act_layer: LayerFactory | None = None,
        data_format: str = "NCHW",
        drop_rate: float = 0.0,
        drop_path_rate: float = 0.0,
        global_pool: str = "avg",
    ) -> None:
        super().__init__()
        _check_choice("data_format", data_format, DATA_FORMATS)
        _check_choice("stem_type", stem_type, STEM_TYPES)
        _check_choice("global_pool", global_pool, GLOBAL_POOLS)
        if len(layers) != len(stage_widths):
            raise ConfigError(f"layers {tuple(layers)} and stage_widths {tuple(stage_widths)} differ in length.")
        if num_classes < 0:
            raise ConfigError(f"num_classes must be >= 0 (0 = feature extractor), got {num_classes}.")
        if in_chans < 1:
            raise ConfigError(f"in_chans must be >= 1, got {in_chans}.")
        if not 0.0 <= drop_rate < 1.0:
            raise ConfigError(f"drop_rate must be in [0, 1), got {drop_rate}.")
        if not 0.0 <= drop_path_rate < 1.0:
            raise ConfigError(f"drop_path_rate must be in [0, 1), got {drop_path_rate}.")

        self.data_format = data_format
        self.drop_rate = drop_rate
        self.drop_path_rate = drop_path_rate
        self.groups = groups
        self.base_width = base_width
        self._norm_layer = norm_layer or nn.BatchNorm2D
        self._act_layer = act_layer or nn.ReLU

        self._build_stem(in_chans, stem_type, stem_width)
        self.inplanes = 64 if stem_type == "deep" else stem_width
        self.stage_names: list[str] = []
        rates = drop_path_rates(drop_path_rate, sum(layers))
        for i, (planes, depth) in enumerate(zip(stage_widths, layers, strict=True)):
            stride = 1 if i == 0 else 2
            first = sum(layers[:i])
            stage = self._make_layer(
                block, planes, depth, stride, avg_down, force_projection=project_first_shortcut and i == 0,
                block_drop_path_rates=rates[first:first + depth],
            )
            name = f"layer{i + 1}"
            setattr(self, name, stage)
            self.stage_names.append(name)

        self.num_features = self.inplanes
        self.num_classes = num_classes
        self.global_pool = global_pool
        self.fc: nn.Layer = self._make_head(num_classes)
        self.pretrained_cfg = self._default_pretrained_cfg(in_chans, stem_type)
        self._init_weights(zero_init_residual)

    def _build_stem(self, in_chans: int, stem_type: str, stem_width: int) -> None:
        # Names follow paddle.vision (conv1/bn1) and, for the deep stem, timm: conv1 is the stack of stem convs
        # and bn1 the norm after the last one, so the stem's output is always act1(bn1(conv1(x))).
        fmt, norm = self.data_format, self._norm_layer
        if stem_type == "basic":
            self.conv1 = conv2d(in_chans, stem_width, 7, stride=2, data_format=fmt)
            out = stem_width
        elif stem_type == "deep":
            self.conv1 = nn.Sequential(
                conv3x3(in_chans, 32, stride=2, data_format=fmt),
                norm(32, data_format=fmt),
                self._act_layer(),
                conv3x3(32, 32, data_format=fmt),
                norm(32, data_format=fmt),
                self._act_layer(),
                conv3x3(32, 64, data_format=fmt),
            )
            out = 64
        else:
            self.conv1 = conv3x3(in_chans, stem_width, data_format=fmt)
            out = stem_width
        self.bn1 = norm(out, data_format=fmt)
        self.act1 = self._act_layer()
        if stem_type == "cifar":
            self.maxpool: nn.Layer = nn.Identity()
        else:
            self.maxpool = nn.MaxPool2D(kernel_size=3, stride=2, padding=1, data_format=fmt)

    def _make_layer(
        self,
        block: Block,
        planes: int,
        blocks: int,
        stride: int,
        avg_down: bool,
        force_projection: bool = False,
        block_drop_path_rates: Sequence[float] | None = None,
    ) -> nn.Sequential:
        """One stage: ``blocks`` blocks, the first one strided and with a projection shortcut if needed."""
        rates = list(block_drop_path_rates) if block_drop_path_rates is not None else [0.0] * blocks
        outplanes = planes * block.expansion
        downsample = None
        if stride != 1 or self.inplanes != outplanes or force_projection:
            downsample = self._make_shortcut(self.inplanes, outplanes, stride, avg_down)
        options = dict(
            groups=self.groups,
            base_width=self.base_width,
            norm_layer=self._norm_layer,
            act_layer=self._act_layer,
            data_format=self.data_format,
        )
        stage = [block(self.inplanes, planes, stride, downsample, drop_path_rate=rates[0], **options)]
        self.inplanes = outplanes
        stage += [block(self.inplanes, planes, drop_path_rate=rates[i], **options) for i in range(1, blocks)]
        return nn.Sequential(*stage)

    def _make_shortcut(self, in_chs: int, out_chs: int, stride: int, avg_down: bool) -> nn.Sequential:
        fmt = self.data_format
        norm = self._norm_layer(out_chs, data_format=fmt)
        if not avg_down:
            # downsample.0 = conv, downsample.1 = norm: paddle.vision's names.
            return nn.Sequential(conv1x1(in_chs, out_chs, stride, data_format=fmt), norm)
        # Pooling instead of a strided 1x1 conv keeps all input pixels in the shortcut (ResNet-D). The pool
        # slot stays (as an identity) at stride 1 so conv/norm keep indices 1/2 in every stage.
        pool = (
            nn.AvgPool2D(kernel_size=2, stride=stride, ceil_mode=True, data_format=fmt)
            if stride != 1
            else nn.Identity()
        )
        return nn.Sequential(pool, conv1x1(in_chs, out_chs, data_format=fmt), norm)

    def _make_head(self, num_classes: int) -> nn.Layer:
        if num_classes == 0:
            return nn.Identity()
        fc = nn.Linear(self.num_features, num_classes)
        # U(-1/sqrt(fan_in), 1/sqrt(fan_in)) for weight and bias, as torchvision and PaddleClas initialise it.
        bound = 1.0 / math.sqrt(self.num_features)
        nn.initializer.Uniform(-bound, bound)(fc.weight)
        nn.initializer.Uniform(-bound, bound)(fc.bias)
        return fc

    def _init_weights(self, zero_init_residual: bool) -> None:
        # Convs are initialised as they are built (see conv2d); norms get scale 1 and shift 0 whatever the
        # norm_layer's own defaults are.
        for layer in self.sublayers():
            if isinstance(layer, _NORM_LAYERS):
                if getattr(layer, "weight", None) is not None:
                    nn.initializer.Constant(1.0)(layer.weight)
                if getattr(layer, "bias", None) is not None:
                    nn.initializer.Constant(0.0)(layer.bias)
        if zero_init_residual:
            for layer in self.sublayers():
                if isinstance(layer, (BasicBlock, Bottleneck)):
                    layer.zero_init_last()

    def _default_pretrained_cfg(self, in_chans: int, stem_type: str) -> dict[str, Any]:
        cifar = stem_type == "cifar"
        mean, std = (CIFAR10_MEAN, CIFAR10_STD) if cifar else (IMAGENET_MEAN, IMAGENET_STD)
        if in_chans != 3:
            # Statistics of an RGB set do not apply per channel; their average is a sane start for grey/multi-band.
            mean = (sum(mean) / 3,) * in_chans
            std = (sum(std) / 3,) * in_chans
        size = 32 if cifar else 224
        return {
            "input_size": (in_chans, size, size),
            "mean": mean,
            "std": std,
            "interpolation": "bilinear",
            "crop_pct": 1.0 if cifar else 0.875,
            "num_classes": self.num_classes,
            "classifier": "fc",
            "first_conv": "conv1.0" if stem_type == "deep" else "conv1",
        }

    def get_classifier(self) -> nn.Layer:
        """The classifier head (``fc``): a ``nn.Linear``, or ``nn.Identity`` when ``num_classes == 0``."""
        return self.fc

    def reset_classifier(self, num_classes: int, global_pool: str | None = None) -> None:
        """Replace the head with a freshly initialised one for ``num_classes`` (0 = identity)."""
        if num_classes < 0:
            raise ConfigError(f"num_classes must be >= 0 (0 = feature extractor), got {num_classes}.")
        if global_pool is not None:
            _check_choice("global_pool", global_pool, GLOBAL_POOLS)
            self.global_pool = global_pool
        self.num_classes = num_classes
        self.fc = self._make_head(num_classes)
        self.pretrained_cfg = {**self.pretrained_cfg, "num_classes": num_classes}

    def forward_features(self, x: paddle.Tensor) -> paddle.Tensor:
        """Stem and stages: the unpooled feature map (``num_features`` channels, stride 32; 4 for CIFAR).

        The input is NCHW in both layouts; an NHWC model transposes it once here, so data pipelines, exported
        input specs and predictors stay the same, and returns a channels-last feature map.
        """
        if self.data_format == "NHWC":
            x = paddle.transpose(x, [0, 2, 3, 1])
        x = self.maxpool(self.act1(self.bn1(self.conv1(x))))
        for name in self.stage_names:
            x = getattr(self, name)(x)
        return x

    def forward_head(self, x: paddle.Tensor, pre_logits: bool = False) -> paddle.Tensor:
        """Global pool, dropout and classifier; ``pre_logits=True`` stops before the classifier."""
        x = self._pool(x)
        if self.drop_rate > 0.0:
            x = F.dropout(x, p=self.drop_rate, training=self.training)
        return x if pre_logits else self.fc(x)

    def forward(self, x: paddle.Tensor) -> paddle.Tensor:
        return self.forward_head(self.forward_features(x))

    def _pool(self, x: paddle.Tensor) -> paddle.Tensor:
        fmt = self.data_format
        if self.global_pool == "avg":
            x = F.adaptive_avg_pool2d(x, 1, data_format=fmt)
        elif self.global_pool == "max":
            x = F.adaptive_max_pool2d(x, 1) if fmt == "NCHW" else _nhwc_max_pool(x)
        else:
            avg = F.adaptive_avg_pool2d(x, 1, data_format=fmt)
            mx = F.adaptive_max_pool2d(x, 1) if fmt == "NCHW" else _nhwc_max_pool(x)
            x = 0.5 * (avg + mx)
        return paddle.flatten(x, 1)


def _nhwc_max_pool(x: paddle.Tensor) -> paddle.Tensor:
    # paddle's adaptive_max_pool2d has no data_format argument; a max over H and W is the same thing.
    return paddle.amax(x, axis=[1, 2], keepdim=True)


def _check_choice(key: str, value: Any, choices: Sequence[Any]) -> None:
    if value not in choices:
        raise ConfigError(f"{key} must be one of {', '.join(map(repr, choices))}; got {value!r}.")


def _create_resnet(
    name: str, block: Block, layers: Sequence[int], options: dict[str, Any], **arch: Any
) -> ResNet:
    """Build a ResNet from a builder's fixed ``arch`` settings and the user's ``options``.

    Options are checked first, so a typo or an attempt to override what defines the architecture (e.g.
    ``groups`` of a ResNeXt) names the option and the model instead of failing deep inside ``__init__``.
    """
    options = dict(options)
    width = options.pop("width", 1.0)
    check_model_options(name, options, ResNet.__init__)
    fixed = sorted(set(options) & (set(arch) | {"block", "layers"}))
    if fixed:
        raise ModelOptionError(
            f"Model {name!r} fixes {', '.join(map(repr, fixed))} as part of its architecture; "
            f"build ResNet(...) directly for another layout."
        )
    if width != 1.0:
        arch = widened(arch, width)
    model = ResNet(block, layers, **arch, **options)
    model.pretrained_cfg["architecture"] = name
    return model


def widened(arch: dict[str, Any], width: float) -> dict[str, Any]:
    """``arch`` with its stem and stage widths times ``width`` (rounded): the "k" of Wide ResNets (Zagoruyko &
    Komodakis 2016), e.g. ``create_model("resnet20", width=2)`` has stages of 32, 64 and 128 channels."""
    if not (isinstance(width, (int, float)) and width > 0):
        raise ModelOptionError(f"width must be a number > 0 (a multiplier of every stage's channels), got {width!r}")
    stem = arch.get("stem_width", 64)
    stages = arch.get("stage_widths", (64, 128, 256, 512))
    return {**arch, "stem_width": max(1, round(stem * width)),
            "stage_widths": tuple(max(1, round(c * width)) for c in stages)}


_VD = dict(stem_type="deep", avg_down=True, project_first_shortcut=True)
_CIFAR = dict(stem_type="cifar", stem_width=16, stage_widths=(16, 32, 64))

# The registered architectures: name -> (what it is, block, blocks per stage, settings that define it).
_ARCHITECTURES: dict[str, tuple[str, Block, tuple[int, ...], dict[str, Any]]] = {
    # ImageNet ResNet / ResNeXt / Wide ResNet (paddle.vision parameter names).
    "resnet18": ("ResNet-18.", BasicBlock, (2, 2, 2, 2), {}),
    "resnet34": ("ResNet-34.", BasicBlock, (3, 4, 6, 3), {}),
    "resnet50": ("ResNet-50.", Bottleneck, (3, 4, 6, 3), {}),
    "resnet101": ("ResNet-101.", Bottleneck, (3, 4, 23, 3), {}),
    "resnet152": ("ResNet-152.", Bottleneck, (3, 8, 36, 3), {}),
    "resnext50_32x4d": ("ResNeXt-50 32x4d: 32 groups of width 4.", Bottleneck, (3, 4, 6, 3),
                        dict(groups=32, base_width=4)),
    "resnext101_32x4d": ("ResNeXt-101 32x4d.", Bottleneck, (3, 4, 23, 3), dict(groups=32, base_width=4)),
    "resnext101_64x4d": ("ResNeXt-101 64x4d.", Bottleneck, (3, 4, 23, 3), dict(groups=64, base_width=4)),
    "wide_resnet50_2": ("Wide ResNet-50-2: bottleneck width doubled.", Bottleneck, (3, 4, 6, 3),
                        dict(base_width=128)),
    "wide_resnet101_2": ("Wide ResNet-101-2.", Bottleneck, (3, 4, 23, 3), dict(base_width=128)),
    # ResNet-D in PaddleClas' "vd" layout.
    "resnet18_vd": ("ResNet-18-vd: deep stem, average-pool shortcuts.", BasicBlock, (2, 2, 2, 2), _VD),
    "resnet34_vd": ("ResNet-34-vd.", BasicBlock, (3, 4, 6, 3), _VD),
    "resnet50_vd": ("ResNet-50-vd.", Bottleneck, (3, 4, 6, 3), _VD),
    "resnet101_vd": ("ResNet-101-vd.", Bottleneck, (3, 4, 23, 3), _VD),
    "resnet152_vd": ("ResNet-152-vd.", Bottleneck, (3, 8, 36, 3), _VD),
    # CIFAR ResNets (6n+2 layers, 32x32 inputs).
    "resnet20": ("CIFAR ResNet-20 (n=3).", BasicBlock, (3, 3, 3), _CIFAR),
    "resnet32": ("CIFAR ResNet-32 (n=5).", BasicBlock, (5, 5, 5), _CIFAR),
    "resnet44": ("CIFAR ResNet-44 (n=7).", BasicBlock, (7, 7, 7), _CIFAR),
    "resnet56": ("CIFAR ResNet-56 (n=9).", BasicBlock, (9, 9, 9), _CIFAR),
    "resnet110": ("CIFAR ResNet-110 (n=18).", BasicBlock, (18, 18, 18), _CIFAR),
}


def _builder(name: str, doc: str, block: Block, layers: tuple[int, ...], arch: dict[str, Any]) -> Callable[..., ResNet]:
    """The registered builder of one architecture: ``create_model(name, **options)`` calls it with the options."""

    def build(**kwargs: Any) -> ResNet:
        return _create_resnet(name, block, layers, kwargs, **arch)

    build.__name__ = build.__qualname__ = name
    build.__doc__ = doc
    # What it takes, for the config's check of model.<option> keys: ResNet's keywords but what the name fixes.
    fixed = {"self", "block", "layers", *arch}
    options = [p.replace(kind=inspect.Parameter.KEYWORD_ONLY) for n, p in
               inspect.signature(ResNet.__init__).parameters.items() if n not in fixed]
    width = inspect.Parameter("width", inspect.Parameter.KEYWORD_ONLY, default=1.0)
    build.__signature__ = inspect.Signature([*options, width])  # type: ignore[attr-defined]
    return build


for _name, _spec in _ARCHITECTURES.items():
    globals()[_name] = register_model(_builder(_name, *_spec))
