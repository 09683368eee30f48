"""model.conv_input_grad: the input gradient of a stride-1 "same" convolution computed as a convolution."""
from __future__ import annotations

import copy

import numpy as np
import paddle
import pytest

from paddletrain.models import create_model
from paddletrain.models.conv_backward import InputGradConv2D, takes_conv_input_grad, use_conv_input_grad

# float32 sums of up to in_ch x k x k terms, added in another order: a few units in the last place of the largest.
RTOL = 1e-5


def _close(actual: np.ndarray, expected: np.ndarray) -> None:
    scale = float(np.abs(expected).max())
    assert scale > 0
    np.testing.assert_allclose(actual, expected, rtol=0, atol=RTOL * scale)


def _grads(layer: paddle.nn.Layer, x: np.ndarray, grad_y: np.ndarray) -> tuple[np.ndarray, ...]:
    inp = paddle.to_tensor(x, stop_gradient=False)
    out = layer(inp)
    out.backward(paddle.to_tensor(grad_y))
    grads = (out.numpy(), inp.grad.numpy(), layer.weight.grad.numpy())
    if layer.bias is not None:
        grads += (layer.bias.grad.numpy(),)
    layer.clear_gradients()
    return grads


@pytest.mark.parametrize("in_ch,out_ch,kernel,bias,size", [
    (3, 8, 3, False, (9, 7)),   # non-square image
    (8, 8, 3, True, (6, 6)),
    (4, 6, 1, True, (5, 5)),    # 1x1, padding 0
    (5, 4, 5, False, (8, 8)),
    (4, 4, (3, 5), False, (7, 9)),  # odd, non-square kernel
])
def test_gradients_equal_paddles_to_float32_rounding(in_ch, out_ch, kernel, bias, size):
    paddle.seed(3)
    k_h, k_w = (kernel, kernel) if isinstance(kernel, int) else kernel
    reference = paddle.nn.Conv2D(in_ch, out_ch, kernel, padding=(k_h // 2, k_w // 2), bias_attr=None if bias else False)
    fast = copy.deepcopy(reference)
    assert use_conv_input_grad(fast) == 1 and type(fast) is InputGradConv2D
    rng = np.random.default_rng(0)
    x = rng.standard_normal((2, in_ch, *size)).astype("float32")
    grad_y = rng.standard_normal((2, out_ch, *size)).astype("float32")
    expected, actual = _grads(reference, x, grad_y), _grads(fast, x, grad_y)
    np.testing.assert_array_equal(actual[0], expected[0])  # the forward is Paddle's own kernel
    for got, want in zip(actual[1:], expected[1:], strict=True):
        _close(got, want)


@pytest.mark.parametrize("layer", [
    paddle.nn.Conv2D(4, 4, 3, stride=2, padding=1),
    paddle.nn.Conv2D(4, 4, 3, padding=0),            # not "same"
    paddle.nn.Conv2D(4, 4, 3, padding=2, dilation=2),
    paddle.nn.Conv2D(4, 4, 3, padding=1, groups=2),
    paddle.nn.Conv2D(4, 4, 2, padding=1),            # even kernel
    paddle.nn.Conv2D(4, 4, 3, padding=1, data_format="NHWC"),
    paddle.nn.Conv2D(4, 4, 3, padding="SAME"),
    paddle.nn.Conv2D(4, 4, 3, padding=1, padding_mode="reflect"),
    paddle.nn.Conv2DTranspose(4, 4, 3, padding=1),
], ids=["stride2", "valid", "dilated", "grouped", "even", "nhwc", "same_string", "reflect", "transpose"])
def test_other_convolutions_keep_paddles_kernel(layer):
    assert not takes_conv_input_grad(layer)
    assert use_conv_input_grad(layer) == 0 and type(layer) is not InputGradConv2D


def test_resnet_keeps_its_names_and_trains_alike():
    """The recipe's model: stride-1 3x3 convolutions converted, strided ones and the state dict left as they are;
    three SGD steps give the same losses and weights as Paddle's kernels, to float32 rounding."""
    paddle.seed(0)
    reference = create_model("resnet20", num_classes=10, in_chans=1, width=0.5)
    fast = copy.deepcopy(reference)
    convs = [layer for layer in reference.sublayers() if isinstance(layer, paddle.nn.Conv2D)]
    converted = use_conv_input_grad(fast)
    strided = sum(1 for layer in convs if list(layer._stride) != [1, 1])
    assert strided > 0 and converted == len(convs) - strided
    assert use_conv_input_grad(fast) == 0  # idempotent: converted layers are not converted again
    assert list(fast.state_dict()) == list(reference.state_dict())

    rng = np.random.default_rng(1)
    x = paddle.to_tensor(rng.standard_normal((8, 1, 12, 12)).astype("float32"))
    y = paddle.to_tensor(rng.integers(0, 10, 8))
    losses = {}
    for name, model in (("paddle", reference), ("conv", fast)):
        opt = paddle.optimizer.Momentum(0.1, momentum=0.9, parameters=model.parameters())
        losses[name] = []
        for _ in range(3):
            loss = paddle.nn.functional.cross_entropy(model(x), y)
            loss.backward()
            opt.step()
            opt.clear_grad()
            losses[name].append(float(loss))
    np.testing.assert_allclose(losses["conv"], losses["paddle"], rtol=1e-4)
    assert losses["paddle"][-1] < losses["paddle"][0]  # the steps did move the weights
    for (key, want), got in zip(reference.state_dict().items(), fast.state_dict().values(), strict=True):
        np.testing.assert_allclose(got.numpy(), want.numpy(), rtol=1e-3, atol=1e-5, err_msg=key)


def test_evaluation_and_inputs_without_gradient_run_paddles_path():
    layer = paddle.nn.Conv2D(3, 4, 3, padding=1)
    reference = copy.deepcopy(layer)
    use_conv_input_grad(layer)
    x = paddle.randn([2, 3, 6, 6])  # stop_gradient: the stem's input
    out = layer(x)
    np.testing.assert_array_equal(out.numpy(), reference(x).numpy())
    out.sum().backward()
    assert layer.weight.grad is not None  # the weight still learns from a constant input


def test_a_run_on_another_device_keeps_paddles_kernels_and_says_so(caplog):
    paddle.seed(0)
    layer = paddle.nn.Conv2D(3, 4, 3, padding=1)
    with caplog.at_level("INFO", logger="paddletrain"):
        assert use_conv_input_grad(layer, "gpu:0") == 0
    assert type(layer) is paddle.nn.Conv2D and "is for CPU training: gpu:0 keeps Paddle's kernels" in caplog.text
    with caplog.at_level("INFO", logger="paddletrain"):
        assert use_conv_input_grad(layer, "cpu") == 1
    assert type(layer) is InputGradConv2D and "1 convolutions compute their input gradient" in caplog.text
