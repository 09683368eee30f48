"""paddletrain.models.flops: the training arithmetic counted from each layer's shapes."""
from __future__ import annotations

import paddle

from paddletrain.models import create_model
from paddletrain.models.flops import count_forward_flops, training_flops, training_flops_per_image


def test_flops_are_counted_from_each_layers_shapes():
    model = paddle.nn.Sequential(paddle.nn.Conv2D(1, 4, 3, padding=1), paddle.nn.Conv2D(4, 8, 3, stride=2, padding=1),
                                 paddle.nn.Flatten(), paddle.nn.Linear(8 * 4 * 4, 10))
    layers = count_forward_flops(model, paddle.rand([2, 1, 8, 8]))
    assert [layer["flops"] for layer in layers] == [2 * 2 * 8 * 8 * 4 * 1 * 9, 2 * 2 * 4 * 4 * 8 * 4 * 9,
                                                    2 * 2 * 128 * 10]
    # Forward, input gradient and weight gradient of each, but no input gradient for the first layer.
    assert training_flops(layers) == 3 * sum(layer["flops"] for layer in layers) - layers[0]["flops"]


def test_a_models_count_per_image_leaves_it_as_it_was():
    model = create_model("resnet20", num_classes=10, in_chans=1, width=2)
    model.train()
    before = {name: value.numpy().copy() for name, value in model.state_dict().items()}
    # The figure the Fashion-MNIST recipe's step profile reports (docs/results/fashion_mnist_949/step_profile.md).
    assert round(training_flops_per_image(model, 1, 28) / 1e6, 1) == 742.7
    assert model.training
    assert all((value.numpy() == before[name]).all() for name, value in model.state_dict().items())
    assert not any(layer._forward_post_hooks for layer in model.sublayers())
