"""paddletrain.models.factory: the model config becomes a builder call, each option typed as the builder takes it."""
from __future__ import annotations

import paddle
import pytest
from omegaconf import OmegaConf

from paddletrain.config import ModelConfig, OptimConfig
from paddletrain.models import _registry as registry
from paddletrain.models._registry import ModelOptionError
from paddletrain.models.factory import FROZEN, build_model
from paddletrain.optim import build_optimizer
from tests.test_models_registry import isolated_registry  # noqa: F401  (fixture)

seen: dict = {}


class TinyNet(paddle.nn.Layer):
    """docs/extending.md's plugin model: its ``width`` counts channels (an int), not paddletrain's multiplier."""

    def __init__(self, num_classes: int = 1000, in_chans: int = 3, width: int = 16) -> None:
        super().__init__()
        seen["width"] = width
        self.conv = paddle.nn.Conv2D(in_chans, width, 3)
        self.fc = paddle.nn.Linear(width, num_classes)


def model_config(name: str, **keys) -> OmegaConf:
    return OmegaConf.create({"model": OmegaConf.structured(ModelConfig(name=name, **keys))})


def test_a_plugins_whole_number_option_reaches_it_as_an_int_through_any_builder_signature(isolated_registry):  # noqa: F811
    def tiny_kwargs(**options) -> TinyNet:  # as docs/extending.md writes its builder
        return TinyNet(**options)

    registry.register_model(tiny_kwargs)

    @registry.register_model
    def tiny_declared(num_classes: int = 1000, in_chans: int = 3, width: int = 16) -> TinyNet:
        return TinyNet(num_classes, in_chans, width)

    for name in ("tiny_kwargs", "tiny_declared"):
        cfg = model_config(name, width=4)  # the schema's float: 4.0
        assert cfg.model.width == 4.0 and isinstance(cfg.model.width, float)
        build_model(cfg, num_classes=3, in_chans=3)
        assert seen["width"] == 4 and isinstance(seen["width"], int)
    with pytest.raises(ModelOptionError, match=r"model\.width=4\.5: the tiny_declared builder takes a whole number "
                                               r"for width \(its default is 16\)"):
        build_model(model_config("tiny_declared", width=4.5), num_classes=3, in_chans=3)


def test_a_builder_that_declares_a_float_keeps_the_float(isolated_registry):  # noqa: F811
    @registry.register_model
    def scaled(num_classes: int = 1000, in_chans: int = 3, width: float = 1.0) -> paddle.nn.Layer:
        seen["scaled"] = width
        return paddle.nn.Linear(in_chans, num_classes)

    build_model(model_config("scaled", width=2), num_classes=3, in_chans=3)
    assert isinstance(seen["scaled"], float) and seen["scaled"] == 2.0
    assert build_model(model_config("resnet20", width=1.5), 3, 3).conv1.weight.shape[0] == 24  # 16 x 1.5


def test_norm_momentum_and_a_frozen_scale_reach_every_batch_norm_and_the_scale_stays_put():
    model = build_model(model_config("resnet20", norm_momentum=0.6, norm_frozen_scale=True), num_classes=3, in_chans=3)
    norms = [layer for layer in model.sublayers() if isinstance(layer, paddle.nn.BatchNorm2D)]
    # 19 in the blocks and stem, 2 in the projection shortcuts
    assert len(norms) == 21 and all(layer._momentum == 0.6 and getattr(layer.weight, FROZEN) for layer in norms)
    scales = [layer.weight.numpy().copy() for layer in norms]
    optimizer = build_optimizer(model, OptimConfig(name="sgd", lr=0.1, weight_decay=0.01), 0.1)
    model(paddle.rand([2, 3, 8, 8])).square().mean().backward()
    optimizer.step()
    assert all((layer.weight.numpy() == scale).all() for layer, scale in zip(norms, scales, strict=True))
    assert any((layer.bias.numpy() != 0).any() for layer in norms)  # the shifts train
    default = build_model(model_config("resnet20"), num_classes=3, in_chans=3)
    assert all(layer._momentum == 0.9 and not getattr(layer.weight, FROZEN, False) for layer in default.sublayers()
               if isinstance(layer, paddle.nn.BatchNorm2D))
