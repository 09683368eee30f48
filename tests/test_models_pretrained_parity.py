"""Conversions verified against third-party code: identical logits (max abs diff <= 1e-5) in eval mode.

* paddle.vision ``resnet18``/``resnet50`` -> paddletrain (same names);
* PaddleClas' real legendary ``ResNet50_vd`` and ``ResNet18`` (the ``paddleclas`` package, an optional test
  dependency: ``pip install paddleclas --no-deps``) -> ``resnet50_vd`` / ``resnet18``;
* PaddleHub's ``resnet50_vd_imagenet_ssld`` naming -> ``resnet50_vd``, under both its dygraph structured names
  and its static parameter names. ``paddlehub`` cannot be installed here (its module code is not in the pip
  package either), so :class:`HubResNetVd` below re-implements that module's layer and parameter naming: the
  layers ``conv1_1.._conv/_batch_norm``, ``bb_<stage>_<i>.conv0..2``, ``short``, ``out`` and the ParamAttr
  names ``conv1_1_weights``, ``bnv1_1_scale``, ``res2a_branch2a_weights``, ``bn2a_branch1_mean``, ``fc_0.w_0``.
"""
from __future__ import annotations

import importlib
import importlib.util
import os
import sys
import types

import numpy as np
import paddle
import paddle.nn as nn
import paddle.nn.functional as F
import pytest

from paddletrain.models import create_model
from paddletrain.models.pretrained import load_state
from paddletrain.models.weights import WeightsInfo
from paddletrain.models.weights.mapping import ResNetLayout, source_key


def _randomise_norm_stats(model: nn.Layer) -> nn.Layer:
    """Non-trivial BatchNorm statistics, so a norm loaded into the wrong place changes the logits."""
    for layer in model.sublayers():
        if isinstance(layer, (nn.BatchNorm, nn.BatchNorm2D)):
            layer._mean.set_value(paddle.rand(layer._mean.shape) - 0.5)
            layer._variance.set_value(paddle.rand(layer._variance.shape) + 0.5)
            layer.weight.set_value(paddle.rand(layer.weight.shape) + 0.5)
            layer.bias.set_value(paddle.rand(layer.bias.shape) - 0.5)
    return model.eval()


def _load(name: str, state: dict, **options) -> nn.Layer:
    model = create_model(name, **options)
    report = load_state(model, {k: np.asarray(v) for k, v in state.items()}, WeightsInfo("test", "file"))
    assert not (report.missing or report.unexpected or report.shape_mismatched)
    return model.eval(), report


def _max_diff(a: nn.Layer, b: nn.Layer) -> float:
    x = paddle.rand([2, 3, 64, 64]) * 2 - 1
    out_b = b(x)
    out_b = out_b[0] if isinstance(out_b, tuple) else out_b
    return float((a(x) - out_b).abs().max())


# ---------------------------------------------------------------------------------------------- paddle.vision
@pytest.mark.parametrize("arch", ["resnet18", "resnet50"])
def test_paddle_vision_resnets_load_unchanged(arch):
    paddle.seed(1)
    reference = _randomise_norm_stats(getattr(paddle.vision.models, arch)())
    model, report = _load(arch, {k: v.numpy() for k, v in reference.state_dict().items()})
    assert report.scheme == "paddletrain"
    assert _max_diff(model, reference) <= 1e-5


# ---------------------------------------------------------------------------------------------- PaddleClas
def _paddleclas_resnet_module():
    """PaddleClas' own ``legendary_models/resnet.py``, imported without the package ``__init__`` files.

    Those pull in opencv, scikit-learn and faiss for PaddleClas' inference CLI; the backbone module and its
    relative imports (logger, TheseusLayer, custom layers) need only paddle.
    """
    spec = importlib.util.find_spec("paddleclas")
    if spec is None:
        pytest.skip("paddleclas is not installed (pip install paddleclas --no-deps)")
    root = os.path.dirname(spec.origin)
    for name, sub in [("paddleclas", ""), ("paddleclas.ppcls", "ppcls"), ("paddleclas.ppcls.arch", "ppcls/arch"),
                      ("paddleclas.ppcls.arch.backbone", "ppcls/arch/backbone"),
                      ("paddleclas.ppcls.utils", "ppcls/utils")]:
        if name not in sys.modules:
            package = types.ModuleType(name)
            package.__path__ = [os.path.join(root, sub)]
            sys.modules[name] = package
    importlib.import_module("paddleclas.ppcls.utils.logger").init_logger()
    return importlib.import_module("paddleclas.ppcls.arch.backbone.legendary_models.resnet")


@pytest.fixture(scope="module")
def paddleclas_resnet():
    saved = {k: v for k, v in sys.modules.items() if k == "paddleclas" or k.startswith("paddleclas.")}
    module = _paddleclas_resnet_module()
    yield module
    for name in [k for k in sys.modules if k == "paddleclas" or k.startswith("paddleclas.")]:
        del sys.modules[name]
    sys.modules.update(saved)


@pytest.mark.parametrize("paddleclas_name, ours, options", [
    ("ResNet50_vd", "resnet50_vd", {}),
    # PaddleClas' ResNet18 has a 1x1 projection shortcut in its first block; paddle.vision's has none.
    ("ResNet18", "resnet18", {"project_first_shortcut": True}),
])
def test_paddleclas_legendary_resnets_convert_exactly(paddleclas_resnet, paddleclas_name, ours, options):
    paddle.seed(2)
    reference = _randomise_norm_stats(getattr(paddleclas_resnet, paddleclas_name)())
    model, report = _load(ours, {k: v.numpy() for k, v in reference.state_dict().items()}, **options)
    assert report.scheme == "paddleclas"
    assert _max_diff(model, reference) <= 1e-5


# ---------------------------------------------------------------------------------------------- PaddleHub
class HubConvBN(nn.Layer):
    """PaddleHub's ResNet_vd ConvBNLayer: ``_conv`` + ``_batch_norm``, parameters named after ``name``."""

    def __init__(self, cin, cout, k, stride=1, act=None, pool_first=False, name=""):
        super().__init__()
        self.pool_first = pool_first
        self._conv = nn.Conv2D(cin, cout, k, stride=stride, padding=(k - 1) // 2,
                               weight_attr=paddle.ParamAttr(name=name + "_weights"), bias_attr=False)
        bn = "bn_" + name if name == "conv1" else "bn" + name[3:]
        self._batch_norm = nn.BatchNorm(cout, act=act, param_attr=paddle.ParamAttr(name=bn + "_scale"),
                                        bias_attr=paddle.ParamAttr(bn + "_offset"),
                                        moving_mean_name=bn + "_mean", moving_variance_name=bn + "_variance")

    def forward(self, x):
        if self.pool_first:
            x = F.avg_pool2d(x, 2, 2, ceil_mode=True)
        return self._batch_norm(self._conv(x))


class HubBottleneck(nn.Layer):
    def __init__(self, cin, planes, stride, shortcut, if_first, name):
        super().__init__()
        self.conv0 = HubConvBN(cin, planes, 1, act="relu", name=name + "_branch2a")
        self.conv1 = HubConvBN(planes, planes, 3, stride, act="relu", name=name + "_branch2b")
        self.conv2 = HubConvBN(planes, planes * 4, 1, name=name + "_branch2c")
        self.shortcut = shortcut
        if not shortcut:
            self.short = HubConvBN(cin, planes * 4, 1, pool_first=not if_first, name=name + "_branch1")

    def forward(self, x):
        y = self.conv2(self.conv1(self.conv0(x)))
        return F.relu(y + (x if self.shortcut else self.short(x)))


class HubResNetVd(nn.Layer):
    """ResNet50_vd as PaddleHub's ``resnet50_vd_imagenet_ssld`` module builds it (test-only re-implementation)."""

    def __init__(self, num_classes=1000):
        super().__init__()
        self.conv1_1 = HubConvBN(3, 32, 3, 2, act="relu", name="conv1_1")
        self.conv1_2 = HubConvBN(32, 32, 3, 1, act="relu", name="conv1_2")
        self.conv1_3 = HubConvBN(32, 64, 3, 1, act="relu", name="conv1_3")
        self.blocks = []
        cin = 64
        for stage, (depth, planes) in enumerate(zip((3, 4, 6, 3), (64, 128, 256, 512), strict=True)):
            for i in range(depth):
                block = HubBottleneck(cin, planes, 2 if i == 0 and stage else 1, shortcut=i > 0,
                                      if_first=stage == i == 0, name=f"res{stage + 2}{chr(97 + i)}")
                self.blocks.append(self.add_sublayer(f"bb_{stage}_{i}", block))
                cin = planes * 4
        self.out = nn.Linear(2048, num_classes, weight_attr=paddle.ParamAttr(name="fc_0.w_0"),
                             bias_attr=paddle.ParamAttr(name="fc_0.b_0"))

    def forward(self, x):
        x = F.max_pool2d(self.conv1_3(self.conv1_2(self.conv1_1(x))), 3, 2, 1)
        for block in self.blocks:
            x = block(x)
        return self.out(paddle.flatten(F.adaptive_avg_pool2d(x, 1), 1))


@pytest.fixture(scope="module")
def hub_resnet50_vd():
    paddle.seed(3)
    return _randomise_norm_stats(HubResNetVd())


def test_paddlehub_structured_names_convert_exactly(hub_resnet50_vd):
    state = {k: v.numpy() for k, v in hub_resnet50_vd.state_dict().items()}
    assert "conv1_1._conv.weight" in state and "bb_0_0.short._batch_norm._mean" in state and "out.weight" in state
    model, report = _load("resnet50_vd", state)
    assert report.scheme == "paddlehub"
    assert _max_diff(model, hub_resnet50_vd) <= 1e-5


def test_static_graph_parameter_names_convert_exactly(hub_resnet50_vd):
    # The names the parameters and BatchNorm buffers were created with (their ParamAttr / moving_*_name).
    tensors = [t for _, t in hub_resnet50_vd.named_parameters()] + [t for _, t in hub_resnet50_vd.named_buffers()]
    state = {t.name: t.numpy() for t in tensors}
    assert {"conv1_1_weights", "bnv1_1_scale", "res2a_branch2a_weights", "bn2a_branch1_variance",
            "fc_0.w_0", "fc_0.b_0"} <= set(state)
    model, report = _load("resnet50_vd", state)
    assert report.scheme == "static"
    assert _max_diff(model, hub_resnet50_vd) <= 1e-5


def test_static_names_of_resnet101_number_the_long_third_stage():
    layout = ResNetLayout(depths=(3, 4, 23, 3), deep_stem=False, shortcut_conv_index=0)
    assert source_key("layer3.0.conv1.weight", "static", layout, numbered=True) == "res4a_branch2a_weights"
    assert source_key("layer3.5.bn2._mean", "static", layout, numbered=True) == "bn4b5_branch2b_mean"
    assert source_key("layer4.0.downsample.1.bias", "static", layout, numbered=True) == "bn5a_branch1_offset"
    assert source_key("bn1.weight", "static", layout) == "bn_conv1_scale"
    assert source_key("conv1.weight", "paddlehub", layout) == "conv._conv.weight"
