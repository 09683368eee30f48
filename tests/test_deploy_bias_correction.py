"""Bias correction for int8 weight rounding: the rounding grid, the output shift, and the corrected model."""
from __future__ import annotations

import copy
import logging

import numpy as np
import paddle
import pytest

from paddletrain.deploy.bias_correction import (
    output_shift,
    quant_axis,
    rounded_weights,
    weight_rounding_corrected,
    weights_rounded,
)


def _rng(seed: int = 0) -> np.random.Generator:
    return np.random.default_rng(seed)


def test_rounded_weights_lie_on_each_slices_int8_grid_and_keep_its_largest_magnitude():
    weight = _rng().normal(size=(6, 4, 3, 3)).astype(np.float32)
    weight[2] = 0.0
    rounded = rounded_weights(weight, axis=0)
    for channel in (0, 1, 3, 4, 5):
        step = np.abs(weight[channel]).max() / 127
        codes = rounded[channel] / step
        np.testing.assert_allclose(codes, np.round(codes), atol=1e-3)
        assert np.abs(codes).max() == pytest.approx(127, abs=1e-3)
        assert np.abs(rounded[channel] - weight[channel]).max() <= step / 2 * (1 + 1e-5)
    assert not rounded[2].any()
    # A Linear's [in, out] weight is rounded per output column, as Paddle's quantization does (quant_axis=1).
    linear = _rng(1).normal(size=(5, 3)).astype(np.float32)
    np.testing.assert_allclose(rounded_weights(linear, axis=1), rounded_weights(linear.T, axis=0).T)


def _measured_shift(layer: paddle.nn.Layer, inputs: np.ndarray, axes: tuple[int, ...]) -> np.ndarray:
    """The mean change of each output channel of ``layer`` on ``inputs`` when its weights are rounded, computed
    in float64 on a copy (float32 outputs would leave ~1e-6 of summation rounding, which differs between CPUs)."""
    wide = copy.deepcopy(layer)
    wide.to(dtype="float64")
    x = paddle.to_tensor(inputs.astype(np.float64))
    before = wide(x).numpy()
    rounded = rounded_weights(layer.weight.numpy(), quant_axis(layer))
    wide.weight.set_value(rounded.astype(np.float64))
    return (wide(x).numpy() - before).mean(axis=axes)


@pytest.mark.parametrize("groups", [1, 2, 4])
def test_the_output_shift_of_a_1x1_convolution_is_the_measured_mean_change(groups):
    paddle.seed(0)
    conv = paddle.nn.Conv2D(8, 16, 1, groups=groups, bias_attr=False)
    inputs = (_rng().normal(size=(4, 8, 9, 9)) + np.linspace(-2, 3, 8)[None, :, None, None]).astype(np.float32)
    shift = output_shift(conv, inputs.astype(np.float64).mean(axis=(0, 2, 3)))
    measured = _measured_shift(conv, inputs, (0, 2, 3))
    assert np.abs(measured).max() > 1e-4  # there is a shift to find
    np.testing.assert_allclose(shift, measured, rtol=1e-6, atol=1e-9)  # output_shift returns float32


@pytest.mark.parametrize("groups", [1, 8])
def test_a_wider_kernel_adds_the_shift_of_every_tap(groups):
    # Exact where every window sees the channel means: inputs constant per channel, no padding. (Elsewhere the
    # windows' means differ a little from the channel's, as the zero padding at the borders does.)
    paddle.seed(0)
    conv = paddle.nn.Conv2D(8, 16, 3, groups=groups, bias_attr=False)
    means = np.linspace(-2, 3, 8)
    inputs = np.broadcast_to(means[None, :, None, None], (2, 8, 7, 7)).astype(np.float32)
    np.testing.assert_allclose(output_shift(conv, means), _measured_shift(conv, inputs, (0, 2, 3)), rtol=1e-6,
                               atol=1e-9)


def test_the_output_shift_of_a_linear_layer_is_the_measured_mean_change():
    paddle.seed(0)
    linear = paddle.nn.Linear(12, 5)
    inputs = (_rng().normal(size=(32, 12)) + 1.5).astype(np.float32)
    np.testing.assert_allclose(output_shift(linear, inputs.astype(np.float64).mean(axis=0)),
                               _measured_shift(linear, inputs, (0,)), rtol=1e-6, atol=1e-9)


class _Net(paddle.nn.Layer):
    """stem conv + BN, depthwise conv + BN, 1x1 conv + BN, a biased conv with no BN, a bias-free conv with no BN,
    classifier: every place a correction can go, or not go."""

    def __init__(self) -> None:
        super().__init__()
        self.stem, self.stem_bn = paddle.nn.Conv2D(3, 8, 3, padding=1, bias_attr=False), paddle.nn.BatchNorm2D(8)
        self.dw, self.dw_bn = paddle.nn.Conv2D(8, 8, 3, padding=1, groups=8, bias_attr=False), paddle.nn.BatchNorm2D(8)
        self.pw, self.pw_bn = paddle.nn.Conv2D(8, 16, 1, bias_attr=False), paddle.nn.BatchNorm2D(16)
        self.biased = paddle.nn.Conv2D(16, 16, 1)
        self.bare = paddle.nn.Conv2D(16, 16, 1, bias_attr=False)
        self.fc = paddle.nn.Linear(16, 4)

    def forward(self, x):
        x = paddle.nn.functional.relu(self.stem_bn(self.stem(x)))
        x = self.dw_bn(self.dw(x))
        x = paddle.nn.functional.relu(self.pw_bn(self.pw(x)))
        x = paddle.nn.functional.relu(self.bare(self.biased(x)))
        return self.fc(x.mean(axis=[2, 3]))


def _net_and_inputs() -> tuple[_Net, np.ndarray]:
    paddle.seed(3)
    net = _Net()
    net.eval()
    for norm in (net.stem_bn, net.dw_bn, net.pw_bn):  # trained-looking statistics, not the identity
        channels = norm._mean.shape[0]
        norm._mean.set_value(_rng(channels).normal(size=channels).astype(np.float32))
        norm._variance.set_value(_rng(channels + 1).uniform(0.5, 2.0, size=channels).astype(np.float32))
    return net, (_rng(7).normal(size=(24, 3, 12, 12)) + 0.5).astype(np.float32)


def _state(net: paddle.nn.Layer) -> dict[str, np.ndarray]:
    return {name: value.numpy().copy() for name, value in net.state_dict().items()}


def test_each_shift_goes_to_the_norm_after_its_layer_or_its_bias_and_the_model_is_restored_after(caplog):
    net, inputs = _net_and_inputs()
    before = _state(net)
    caplog.set_level(logging.INFO, logger="paddletrain")
    with weight_rounding_corrected(net, inputs, keep_ends=True) as corrected:
        inside = _state(net)
    assert corrected == 3  # dw and pw into their norms, biased into its bias; stem and fc are the kept ends
    changed = {name for name in before if not np.array_equal(before[name], inside[name])}
    assert changed == {"dw_bn._mean", "pw_bn._mean", "biased.bias"}
    assert "neither a batch norm" in caplog.text and caplog.text.rstrip().endswith(": bare")
    # The norm's running mean moved by the shift its layer's rounding causes, from the layer's real input mean.
    captured = {}
    hook = net.pw.register_forward_pre_hook(lambda layer, args: captured.update(x=args[0].numpy()))
    net(paddle.to_tensor(inputs))
    hook.remove()
    expected = output_shift(net.pw, captured["x"].astype(np.float64).mean(axis=(0, 2, 3)))
    np.testing.assert_allclose(inside["pw_bn._mean"] - before["pw_bn._mean"], expected, rtol=1e-4, atol=1e-6)
    after = _state(net)
    assert all(np.array_equal(before[name], after[name]) for name in before)


def test_a_channels_last_model_is_measured_per_channel():
    paddle.seed(0)
    net = paddle.nn.Sequential(
        paddle.nn.Conv2D(3, 8, 3, data_format="NHWC"), paddle.nn.BatchNorm2D(8, data_format="NHWC"),
        paddle.nn.Conv2D(8, 16, 1, data_format="NHWC", bias_attr=False), paddle.nn.BatchNorm2D(16, data_format="NHWC"),
        paddle.nn.Conv2D(16, 4, 1, data_format="NHWC"))
    net.eval()
    inputs = (_rng().normal(size=(4, 9, 11, 3)) + 0.5).astype(np.float32)  # height, width and channels all differ
    captured = {}
    hook = net[2].register_forward_pre_hook(lambda layer, args: captured.update(x=args[0].numpy()))
    net(paddle.to_tensor(inputs))
    hook.remove()
    before = net[3]._mean.numpy().copy()
    with weight_rounding_corrected(net, inputs, keep_ends=True) as corrected:
        moved = net[3]._mean.numpy() - before
    assert corrected == 1
    expected = output_shift(net[2], captured["x"].astype(np.float64).mean(axis=(0, 1, 2)))
    np.testing.assert_allclose(moved, expected, rtol=1e-4, atol=1e-6)


def test_every_layer_is_corrected_when_the_ends_are_quantized_too():
    net, inputs = _net_and_inputs()
    before = _state(net)
    with weight_rounding_corrected(net, inputs, keep_ends=False) as corrected:
        inside = _state(net)
    assert corrected == 5
    assert not np.array_equal(before["stem_bn._mean"], inside["stem_bn._mean"])
    assert not np.array_equal(before["fc.bias"], inside["fc.bias"])


def _rounded_outputs_of_biased(net: _Net, inputs: np.ndarray) -> np.ndarray:
    """The output of ``net.biased`` (the last corrected layer) on ``inputs``, with the weights of every layer up to
    it but the stem rounded to int8 (the model restored after)."""
    layers = [net.dw, net.pw, net.biased]
    originals = [layer.weight.numpy() for layer in layers]
    captured = {}
    hook = net.biased.register_forward_post_hook(lambda layer, args, output: captured.update(y=output.numpy()))
    for layer in layers:
        layer.weight.set_value(rounded_weights(layer.weight.numpy(), 0))
    try:
        net(paddle.to_tensor(inputs))
        return captured["y"].astype(np.float64)
    finally:
        hook.remove()
        for layer, original in zip(layers, originals, strict=True):
            layer.weight.set_value(original)


def test_the_correction_brings_the_rounded_models_mean_outputs_back_to_fp32():
    net, inputs = _net_and_inputs()
    captured = {}
    hook = net.biased.register_forward_post_hook(lambda layer, args, output: captured.update(y=output.numpy()))
    net(paddle.to_tensor(inputs))
    hook.remove()
    reference = captured["y"].astype(np.float64)
    plain = _rounded_outputs_of_biased(net, inputs)
    with weight_rounding_corrected(net, inputs, keep_ends=True):
        corrected = _rounded_outputs_of_biased(net, inputs)
    plain_bias = np.abs((plain - reference).mean(axis=(0, 2, 3))).mean()
    corrected_bias = np.abs((corrected - reference).mean(axis=(0, 2, 3))).mean()
    assert plain_bias > 1e-4
    # What remains comes from the depthwise conv's zero padding and the ReLU between the layers (deterministic
    # inputs and weights: the factor is fixed, not a matter of this CPU's rounding).
    assert corrected_bias < plain_bias / 3


def test_a_model_traced_before_is_still_measured_in_dygraph():
    net, inputs = _net_and_inputs()
    paddle.jit.to_static(net, input_spec=[paddle.static.InputSpec([None, 3, 12, 12], "float32")], full_graph=True)
    net(paddle.to_tensor(inputs[:2]))  # traced: sublayer hooks no longer run on this path
    with weight_rounding_corrected(net, inputs, keep_ends=True) as corrected:
        assert corrected == 3
    assert paddle.jit.dy2static.program_translator.ProgramTranslator().enable_to_static


def test_weights_rounded_rounds_what_the_quantization_rounds_and_restores_the_model():
    net, inputs = _net_and_inputs()
    before = _state(net)
    with weights_rounded(net, inputs, keep_ends=True) as count:
        inside = _state(net)
    assert count == 4  # dw, pw, biased, bare; the stem and the classifier are the ends kept fp32
    for name in ("dw.weight", "pw.weight", "biased.weight", "bare.weight"):
        np.testing.assert_array_equal(inside[name], rounded_weights(before[name], 0))
    assert all(np.array_equal(before[name], inside[name]) for name in before
               if name not in ("dw.weight", "pw.weight", "biased.weight", "bare.weight"))
    after = _state(net)
    assert all(np.array_equal(before[name], after[name]) for name in before)
    with weights_rounded(net, inputs, keep_ends=False) as count:
        np.testing.assert_array_equal(net.fc.weight.numpy(), rounded_weights(before["fc.weight"], 1))
    assert count == 6


class _StandardisedConv(paddle.nn.Conv2D):
    """A Conv2D subclass, as model code writes them: quantization rounds its weight like any Conv2D's."""


def test_a_subclass_of_conv2d_is_corrected_like_conv2d():
    net, inputs = _net_and_inputs()
    conv = _StandardisedConv(8, 16, 1, bias_attr=False)
    conv.weight.set_value(net.pw.weight.numpy())
    net.pw = conv
    assert quant_axis(conv) == 0 and quant_axis(net.pw_bn) is None
    before = net.pw_bn._mean.numpy()
    with weight_rounding_corrected(net, inputs, keep_ends=True) as corrected:
        assert corrected == 3 and not np.array_equal(net.pw_bn._mean.numpy(), before)
