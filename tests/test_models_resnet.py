"""ResNet family: structure, parameter counts, the model contract, layouts and paddle.vision parity."""
from __future__ import annotations

import numpy as np
import paddle
import paddle.nn as nn
import pytest

from paddletrain.errors import ConfigError
from paddletrain.models import BasicBlock, Bottleneck, ModelOptionError, ResNet, create_model, list_models
from paddletrain.models.layers import DropPath

IMAGENET = [
    "resnet18", "resnet34", "resnet50", "resnet101", "resnet152",
    "resnext50_32x4d", "resnext101_32x4d", "resnext101_64x4d", "wide_resnet50_2", "wide_resnet101_2",
]
VD = ["resnet18_vd", "resnet34_vd", "resnet50_vd", "resnet101_vd", "resnet152_vd"]
CIFAR = ["resnet20", "resnet32", "resnet44", "resnet56", "resnet110"]


def trainable_params(model: nn.Layer) -> int:
    """Parameters an optimizer updates: BatchNorm running statistics excluded."""
    return sum(int(p.numel()) for p in model.parameters() if not p.stop_gradient)


def max_abs_diff(a: paddle.Tensor, b: paddle.Tensor) -> float:
    return float(np.abs(a.numpy() - b.numpy()).max())


def test_registry_holds_the_whole_family():
    assert set(list_models()) >= set(IMAGENET + VD + CIFAR)
    assert list_models("resnet*_vd") == sorted(VD)


# Trainable parameters with the 1000-class head: torchvision / paddle.vision reference counts, and the
# PaddleClas model zoo's "Params(M)" for the vd variants (published to two decimals).
EXACT_PARAMS = {"resnet18": 11_689_512, "resnet34": 21_797_672, "resnet50": 25_557_032}
PADDLECLAS_MILLIONS = {"resnet34_vd": 21.82, "resnet50_vd": 25.58, "resnet101_vd": 44.57, "resnet152_vd": 60.21}


@pytest.mark.parametrize("name", IMAGENET + VD + CIFAR)
def test_every_model_classifies_and_exposes_features(name):
    # One build per model (the large ones dominate this file's run time), checked for everything at once.
    model = create_model(name)
    model.eval()
    cifar = name in CIFAR
    size = 32 if cifar else 64
    x = paddle.rand([1, 3, size, size])
    with paddle.no_grad():
        feats = model.forward_features(x)
        logits = model(x)
    stride = 4 if cifar else 32
    assert tuple(feats.shape) == (1, model.num_features, size // stride, size // stride)
    assert tuple(logits.shape) == (1, 1000) and model.num_classes == 1000
    basic = cifar or name in ("resnet18", "resnet34", "resnet18_vd", "resnet34_vd")
    assert model.num_features == (64 if cifar else 512 if basic else 2048)
    cfg = model.pretrained_cfg
    assert cfg["input_size"] == ((3, 32, 32) if cifar else (3, 224, 224))
    assert cfg["classifier"] == "fc" and cfg["architecture"] == name
    # first_conv names a real conv whose input is the image.
    first = dict(model.named_sublayers())[cfg["first_conv"]]
    assert isinstance(first, nn.Conv2D) and first.weight.shape[1] == 3
    if name in EXACT_PARAMS:
        assert trainable_params(model) == EXACT_PARAMS[name]
    if name in PADDLECLAS_MILLIONS:
        assert round(trainable_params(model) / 1e6, 2) == PADDLECLAS_MILLIONS[name]


def test_cifar_resnet20_parameter_count():
    # The paper's ResNet-20 (option A shortcuts, 10 classes) has 269,722 parameters ("0.27M"); option B's two
    # 1x1 conv + BN projections add 16*32 + 2*32 + 32*64 + 2*64 = 2,752.
    assert trainable_params(create_model("resnet20", num_classes=10)) == 269_722 + 2_752


def test_vd_follows_paddleclas_layout():
    model = create_model("resnet50_vd", num_classes=10)
    stem_convs = [m for m in model.conv1 if isinstance(m, nn.Conv2D)]
    assert [c.weight.shape[0] for c in stem_convs] == [32, 32, 64]
    assert stem_convs[0]._stride == [2, 2] and model.pretrained_cfg["first_conv"] == "conv1.0"
    block = model.layer2[0]
    assert block.conv2._stride == [2, 2] and block.conv1._stride == [1, 1]  # stride on the 3x3 conv
    pool, conv, norm = block.downsample
    assert isinstance(pool, nn.AvgPool2D) and conv._stride == [1, 1] and isinstance(norm, nn.BatchNorm2D)
    # First stage: stride 1, so its projection has no pooling.
    assert isinstance(model.layer1[0].downsample[0], nn.Identity)
    # PaddleClas projects the first BasicBlock shortcut even though 64 -> 64 channels match.
    assert create_model("resnet18_vd").layer1[0].downsample is not None
    assert create_model("resnet18").layer1[0].downsample is None


def test_vd_handles_odd_feature_maps():
    # ceil_mode average pooling must keep shortcut and residual the same size on odd inputs.
    model = create_model("resnet18_vd", num_classes=3)
    model.eval()
    assert tuple(model(paddle.rand([1, 3, 50, 50])).shape) == (1, 3)


def test_cifar_layout():
    model = create_model("resnet20", num_classes=10)
    assert isinstance(model.maxpool, nn.Identity)
    assert model.conv1.weight.shape == [16, 3, 3, 3] and model.conv1._stride == [1, 1]
    assert [getattr(model, n)[0].conv1.weight.shape[0] for n in model.stage_names] == [16, 32, 64]
    assert all(isinstance(b, BasicBlock) for n in model.stage_names for b in getattr(model, n))
    assert model.layer1[0].downsample is None
    assert isinstance(model.layer2[0].downsample[0], nn.Conv2D)  # option B: 1x1 conv + norm
    assert model.pretrained_cfg["input_size"] == (3, 32, 32)


@pytest.mark.parametrize("name", ["resnet18", "resnet50", "resnext50_32x4d", "wide_resnet50_2"])
def test_paddle_vision_weights_load_without_mapping(name):
    paddle.seed(1)
    reference = getattr(paddle.vision.models, name)()
    ours = create_model(name)
    ref_state, our_state = reference.state_dict(), ours.state_dict()
    assert set(our_state) == set(ref_state)
    assert all(list(our_state[k].shape) == list(ref_state[k].shape) for k in ref_state)
    # Non-trivial BN statistics, so a mixed-up norm would show in the logits.
    for layer in reference.sublayers():
        if isinstance(layer, nn.BatchNorm2D):
            layer._mean.set_value(paddle.rand(layer._mean.shape) * 0.1)
            layer._variance.set_value(paddle.rand(layer._variance.shape) + 0.5)
    ours.set_state_dict(reference.state_dict())
    reference.eval()
    ours.eval()
    x = paddle.rand([1, 3, 64, 64])
    with paddle.no_grad():
        assert max_abs_diff(ours(x), reference(x)) <= 1e-5


def test_feature_extractor_when_num_classes_is_zero():
    model = create_model("resnet20", num_classes=0)
    model.eval()
    assert isinstance(model.get_classifier(), nn.Identity)
    x = paddle.rand([2, 3, 32, 32])
    out = model(x)
    assert tuple(out.shape) == (2, 64)
    np.testing.assert_allclose(out.numpy(), model.forward_head(model.forward_features(x), pre_logits=True).numpy())


def test_single_channel_input():
    for name in ("resnet20", "resnet18_vd"):
        model = create_model(name, num_classes=4, in_chans=1)
        model.eval()
        size = model.pretrained_cfg["input_size"][1]
        assert model.pretrained_cfg["input_size"][0] == 1
        assert len(model.pretrained_cfg["mean"]) == 1 and len(model.pretrained_cfg["std"]) == 1
        assert tuple(model(paddle.rand([2, 1, size, size])).shape) == (2, 4)


def _tiny_resnext_d(**options):
    # Bottleneck + grouped conv + deep stem + average-pool shortcuts: every layer type, at a tiny size.
    return ResNet(Bottleneck, (1, 1, 1, 1), groups=2, base_width=32, stem_type="deep", avg_down=True, **options)


@pytest.mark.parametrize(
    "build, pool",
    [
        (lambda **o: create_model("resnet20", **o), "avg"),
        (lambda **o: create_model("resnet18_vd", **o), "max"),
        (_tiny_resnext_d, "avgmax"),
    ],
)
def test_nhwc_matches_nchw_for_same_weights(build, pool):
    nchw = build(num_classes=5, global_pool=pool)
    nhwc = build(num_classes=5, global_pool=pool, data_format="NHWC")
    nhwc.set_state_dict(nchw.state_dict())
    nchw.eval()
    nhwc.eval()
    x = paddle.rand([2, 3, 35, 35])  # odd size exercises ceil-mode pooling in both layouts
    with paddle.no_grad():
        ref = nchw(x)
        out = nhwc(x)  # the input stays NCHW; the model transposes once
        feats = nhwc.forward_features(x)
    assert max_abs_diff(ref, out) <= 1e-5
    assert feats.shape[-1] == nhwc.num_features  # channels last all the way through
    layers = [m for m in nhwc.sublayers() if isinstance(m, (nn.Conv2D, nn.BatchNorm2D, nn.AvgPool2D, nn.MaxPool2D))]
    # Paddle keeps the layout in `_data_format` on convs/norms and `data_format` on pools.
    assert layers and all((getattr(m, "_data_format", None) or m.data_format) == "NHWC" for m in layers)


def test_reset_classifier():
    model = create_model("resnet20", num_classes=10)
    model.reset_classifier(3)
    assert model.num_classes == 3 and model.pretrained_cfg["num_classes"] == 3
    assert tuple(model(paddle.rand([2, 3, 32, 32])).shape) == (2, 3)
    assert model.get_classifier().weight.shape == [64, 3]
    model.reset_classifier(0, global_pool="max")
    assert isinstance(model.get_classifier(), nn.Identity) and model.global_pool == "max"
    assert tuple(model(paddle.rand([2, 3, 32, 32])).shape) == (2, 64)
    with pytest.raises(ConfigError, match="global_pool"):
        model.reset_classifier(3, global_pool="median")


def test_zero_init_residual_makes_blocks_start_as_identity():
    model = create_model("resnet20", num_classes=10, zero_init_residual=True)
    model.eval()
    blocks = [b for n in model.stage_names for b in getattr(model, n)]
    assert all(float(b.bn2.weight.abs().sum()) == 0.0 for b in blocks)
    x = paddle.rand([2, 16, 8, 8]) - 0.5
    np.testing.assert_allclose(model.layer1[1](x).numpy(), nn.functional.relu(x).numpy(), atol=1e-6)
    bottleneck = create_model("resnet50", num_classes=10, zero_init_residual=True).layer1[1]
    assert isinstance(bottleneck, Bottleneck) and float(bottleneck.bn3.weight.abs().sum()) == 0.0
    default = create_model("resnet20", num_classes=10)
    assert all(float(b.bn2.weight.min()) == 1.0 for n in default.stage_names for b in getattr(default, n))


def test_weight_init_follows_torchvision():
    paddle.seed(0)
    model = create_model("resnet18", num_classes=10)
    conv = model.layer4[1].conv2  # 512 x 512 x 3 x 3: large enough for a tight std estimate
    fan_out = conv.weight.shape[0] * 9
    assert float(conv.weight.std()) == pytest.approx((2.0 / fan_out) ** 0.5, rel=0.02)
    assert float(model.bn1.weight.min()) == 1.0 and float(model.bn1.bias.abs().max()) == 0.0
    bound = 1.0 / model.num_features**0.5
    assert float(model.fc.weight.abs().max()) <= bound and float(model.fc.bias.abs().max()) <= bound


def test_drop_rate_applies_before_the_classifier_only_in_training():
    model = create_model("resnet20", num_classes=10, drop_rate=0.5)
    feats = model.forward_features(paddle.rand([4, 3, 32, 32]))
    model.train()
    dropped = model.forward_head(feats, pre_logits=True)
    assert float((dropped == 0).astype("float32").mean()) > 0.2
    model.eval()
    np.testing.assert_allclose(
        model.forward_head(feats, pre_logits=True).numpy(), model.forward_head(feats, pre_logits=True).numpy()
    )


def test_custom_norm_and_activation_layers():
    model = create_model("resnet20", num_classes=10, norm_layer=lambda c, data_format: nn.GroupNorm(4, c,
                         data_format=data_format), act_layer=nn.Silu)
    assert isinstance(model.layer1[0].bn1, nn.GroupNorm) and isinstance(model.layer1[0].act1, nn.Silu)
    assert tuple(model(paddle.rand([1, 3, 32, 32])).shape) == (1, 10)


def test_resnet_class_builds_custom_layouts():
    model = ResNet(BasicBlock, (1, 1), stem_type="cifar", stem_width=8, stage_widths=(8, 16), num_classes=2)
    assert model.num_features == 16 and model.stage_names == ["layer1", "layer2"]
    assert tuple(model(paddle.rand([1, 3, 16, 16])).shape) == (1, 2)


@pytest.mark.parametrize(
    "options, key",
    [
        (dict(data_format="NWHC"), "data_format"),
        (dict(global_pool="median"), "global_pool"),
        (dict(drop_rate=1.5), "drop_rate"),
        (dict(drop_path_rate=1.0), "drop_path_rate"),
        (dict(num_classes=-1), "num_classes"),
    ],
)
def test_bad_options_name_the_key(options, key):
    with pytest.raises(ConfigError, match=key):
        create_model("resnet20", **options)


def test_architecture_options_cannot_be_overridden():
    with pytest.raises(ModelOptionError, match="'groups'.*resnext50_32x4d|resnext50_32x4d.*'groups'"):
        create_model("resnext50_32x4d", groups=8)
    with pytest.raises(ConfigError, match="BasicBlock"):
        ResNet(BasicBlock, (1, 1, 1, 1), groups=2)


# ---------------------------------------------------------------------------------------------- stochastic depth
def _blocks(model: ResNet) -> list:
    return [block for name in model.stage_names for block in getattr(model, name)]


def test_drop_path_drops_whole_samples_and_keeps_the_expected_value():
    paddle.seed(0)
    layer, p, n = DropPath(0.3), 0.3, 20000
    layer.train()
    x = paddle.rand([n, 2, 3, 3]) + 0.5
    out = (layer(x) / x).numpy().reshape(n, -1)
    # Per sample: all zeros or all 1 / keep_prob, never a mix.
    per_sample = out[:, 0]
    np.testing.assert_allclose(out, np.repeat(per_sample[:, None], out.shape[1], axis=1), rtol=1e-6)
    kept = per_sample != 0
    np.testing.assert_allclose(per_sample[kept], 1 / (1 - p), rtol=1e-6)
    # E[out] = x: the sample mean of the per-sample factor is 1 within 5 standard errors.
    standard_error = (p / (1 - p)) ** 0.5 / n**0.5
    assert abs(per_sample.mean() - 1.0) < 5 * standard_error
    assert abs((~kept).mean() - p) < 5 * (p * (1 - p) / n) ** 0.5


def test_drop_path_is_the_identity_in_eval_and_at_rate_zero():
    x = paddle.rand([8, 4, 2, 2])
    layer = DropPath(0.5)
    layer.eval()
    np.testing.assert_array_equal(layer(x).numpy(), x.numpy())
    zero = DropPath(0.0)
    zero.train()
    np.testing.assert_array_equal(zero(x).numpy(), x.numpy())


def test_drop_path_draws_from_paddles_generator_so_a_seed_replays_it():
    layer = DropPath(0.5)
    layer.train()
    x = paddle.ones([64, 1])
    paddle.seed(5)
    first = layer(x).numpy()
    paddle.seed(5)
    np.testing.assert_array_equal(layer(x).numpy(), first)


def test_drop_path_rate_rises_linearly_over_all_blocks():
    rate = 0.05
    model = create_model("resnet50", num_classes=10, drop_path_rate=rate)
    blocks = _blocks(model)
    assert len(blocks) == 16
    rates = [block.drop_path.drop_prob if isinstance(block.drop_path, DropPath) else 0.0 for block in blocks]
    np.testing.assert_allclose(rates, np.linspace(0.0, rate, 16), rtol=1e-12, atol=1e-15)
    assert isinstance(blocks[0].drop_path, nn.Identity)  # the first block never drops
    assert model.drop_path_rate == rate


def test_drop_path_zeroes_the_residual_branch_before_the_addition():
    class DropAll(nn.Layer):
        def forward(self, x):
            return x * 0

    paddle.seed(2)
    for block in (BasicBlock(8, 8), Bottleneck(32, 8)):
        block.eval()
        block.drop_path = DropAll()
        x = paddle.randn([2, block.conv1.weight.shape[1], 5, 5])
        # Identity shortcut, branch dropped: the block is its final activation of the input.
        np.testing.assert_allclose(block(x).numpy(), np.maximum(x.numpy(), 0), rtol=1e-6)


@pytest.mark.parametrize("name", ["resnet20", "resnet50_vd"])
def test_drop_path_keeps_parameter_names_and_eval_logits(name):
    paddle.seed(3)
    plain = create_model(name, num_classes=4)
    stochastic = create_model(name, num_classes=4, drop_path_rate=0.3)
    assert list(stochastic.state_dict()) == list(plain.state_dict())
    stochastic.set_state_dict(plain.state_dict())
    x = paddle.rand([4, 3, 32, 32])
    plain.eval()
    stochastic.eval()
    with paddle.no_grad():
        np.testing.assert_array_equal(stochastic(x).numpy(), plain(x).numpy())
        plain.train()
        stochastic.train()
        paddle.seed(4)
        assert max_abs_diff(stochastic(x), plain(x)) > 1e-3  # training drops blocks for some samples


def test_width_multiplies_the_stem_and_every_stage():
    wide = create_model("resnet20", width=2, num_classes=10, in_chans=1)
    assert [tuple(wide.conv1.weight.shape), tuple(wide.layer1[0].conv1.weight.shape),
            tuple(wide.layer3[0].conv1.weight.shape), tuple(wide.fc.weight.shape)] == [
        (32, 1, 3, 3), (32, 32, 3, 3), (128, 64, 3, 3), (128, 10)]
    narrow = create_model("resnet18", width=0.5)
    assert tuple(narrow.conv1.weight.shape) == (32, 3, 7, 7) and tuple(narrow.fc.weight.shape) == (256, 1000)
    assert create_model("resnet20", width=1).layer3[0].conv1.weight.shape == [64, 32, 3, 3]
    with pytest.raises(ModelOptionError, match="width must be a number > 0"):
        create_model("resnet20", width=0)
