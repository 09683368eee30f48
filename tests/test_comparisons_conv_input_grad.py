"""comparisons/conv_input_grad.py: the per-layer input gradients and the step's two arms, on a tiny shape."""
from __future__ import annotations

import paddle

from comparisons.conv_input_grad import ConvInputGradConfig, eligible_convolutions, run_conv_input_grad


def test_only_stride_one_same_convolutions_whose_input_needs_a_gradient_are_listed():
    model = paddle.nn.Sequential(paddle.nn.Conv2D(1, 4, 3, padding=1), paddle.nn.Conv2D(4, 4, 3, padding=1),
                                 paddle.nn.Conv2D(4, 4, 3, padding=1), paddle.nn.Conv2D(4, 8, 3, stride=2, padding=1))
    convs = eligible_convolutions(model, paddle.rand([2, 1, 8, 8]))
    # the first sees the images, which need no gradient; the strided one keeps Paddle's kernel
    assert [(c["input"], c["weight"], c["count"]) for c in convs] == [((2, 4, 8, 8), (4, 4, 3, 3), 2)]


def test_a_short_run_times_each_layer_and_both_arms():
    result = run_conv_input_grad(ConvInputGradConfig(image_size=8, batch_size=4, windows=2, steps=2, warmup=1,
                                                     repeats=1))
    assert [row["arm"] for row in result["rows"]] == ["paddle", "conv_input_grad"]
    assert all(row["ms_per_step"] > 0 for row in result["rows"])
    # resnet20: 19 3x3 convolutions, two of them strided (and two strided 1x1 projections); the stem's input
    # is the images
    assert result["summary"]["converted"] == 17
    assert sum(layer["layers"] for layer in result["layers"]) == 16
    assert all(layer["forward_ms"] > 0 and layer["as_convolution_ms"] > 0 for layer in result["layers"])
    assert result["summary"]["speedup"] > 0
