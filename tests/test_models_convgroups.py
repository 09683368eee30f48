"""model=airbench: airbench94's network of conv groups, with the models' contract."""
from __future__ import annotations

import numpy as np
import paddle
import pytest

from paddletrain.errors import ConfigError
from paddletrain.models import create_model, list_models
from paddletrain.models.convgroups import ConvGroupNet
from paddletrain.models.flops import training_flops_per_image


def test_it_is_registered_and_classifies_small_grey_and_colour_images():
    assert "airbench" in list_models()
    for in_chans, side in ((1, 28), (3, 32)):
        model = create_model("airbench", num_classes=10, in_chans=in_chans)
        model.eval()
        assert model(paddle.rand([2, in_chans, side, side])).shape == [2, 10]
        # Three halvings of the stem's side (27 or 31): a 3x3 map of 256 channels.
        assert model.forward_features(paddle.rand([1, in_chans, side, side])).shape == [1, 256, 3, 3]


def test_its_size_and_arithmetic_at_the_fashion_mnist_shape():
    model = create_model("airbench", num_classes=10, in_chans=1)
    assert sum(int(np.prod(p.shape)) for p in model.parameters()) == 1_974_904
    assert round(training_flops_per_image(model, 1, 28) / 1e6, 1) == 534.3
    # width multiplies the stem and every group.
    narrow = create_model("airbench", num_classes=10, in_chans=1, width=0.5)
    assert narrow.stem.weight.shape[0] == 12 and narrow.num_features == 128


def test_the_logits_are_the_heads_output_times_logit_scale():
    paddle.seed(0)
    plain = create_model("airbench", num_classes=5, in_chans=1)
    scaled = create_model("airbench", num_classes=5, in_chans=1, logit_scale=1 / 9)
    scaled.set_state_dict(plain.state_dict())
    plain.eval()
    scaled.eval()
    x = paddle.rand([3, 1, 28, 28])
    np.testing.assert_allclose(scaled(x).numpy(), plain(x).numpy() / 9, rtol=1e-5, atol=1e-7)


def test_head_reset_and_feature_extractor():
    model = create_model("airbench", num_classes=10, in_chans=1)
    model.reset_classifier(3)
    assert model.get_classifier().weight.shape == [256, 3] and model.pretrained_cfg["num_classes"] == 3
    features = create_model("airbench", num_classes=0, in_chans=1)
    features.eval()
    assert features(paddle.rand([2, 1, 28, 28])).shape == [2, 256]


@pytest.mark.parametrize(("options", "key"), [({"global_pool": "mean"}, "global_pool"),
                                              ({"logit_scale": 0.0}, "logit_scale"),
                                              ({"stage_widths": ()}, "stage_widths"),
                                              ({"drop_rate": 1.0}, "drop_rate")])
def test_bad_options_name_the_key(options, key):
    with pytest.raises(ConfigError, match=key):
        ConvGroupNet(num_classes=10, **options)


def test_the_norm_keys_reach_its_norms():
    from paddletrain.models.factory import FROZEN, set_norms

    model = create_model("airbench", num_classes=10, in_chans=1)
    assert set_norms(model, momentum=0.6, frozen_scale=True) == 6
    norms = [layer for layer in model.sublayers() if isinstance(layer, paddle.nn.BatchNorm2D)]
    assert all(layer._momentum == 0.6 and getattr(layer.weight, FROZEN, False) for layer in norms)
