"""The arithmetic of training a model: each convolution's and linear layer's multiply-adds, counted from one
forward pass.

A training step computes, for every such layer, its forward, its input gradient and its weight gradient, each as
many multiply-adds as the forward; the first layer's input gradient is not computed (nothing needs it). Norms,
activations and pooling are left out (elementwise, memory-bound work, not multiply-adds), as the published
counts of airbench and of the ResNet papers leave them out. ``fit`` logs the
figure for its model and records the run's total in ``summary.json`` (``train/mflop_per_image``,
``train/pflop``); ``python -m comparisons step_profile`` divides it by a measured step time.
"""
from __future__ import annotations

import logging
from typing import Any

import numpy as np
import paddle

from paddletrain.engine.summary import TrainingArithmetic

__all__ = ["count_forward_flops", "training_arithmetic", "training_flops", "training_flops_per_image"]

log = logging.getLogger("paddletrain")


def count_forward_flops(model: paddle.nn.Layer, sample: paddle.Tensor) -> list[dict[str, Any]]:
    """Each convolution's and linear layer's forward shape and FLOPs (2 x multiply-adds) for ``sample``, in the
    order they ran."""
    layers: list[dict[str, Any]] = []

    def hook(layer: paddle.nn.Layer, inputs: Any, output: paddle.Tensor) -> None:
        x = inputs[0]
        if isinstance(layer, paddle.nn.Conv2D):
            n, c_out, h, w = output.shape
            k_h, k_w = layer._kernel_size
            c_in = x.shape[1] // layer._groups
            layers.append({"kind": "conv", "batch": n, "in_ch": x.shape[1], "out_ch": c_out, "kernel": (k_h, k_w),
                           "stride": layer._stride, "padding": layer._padding, "groups": layer._groups,
                           "in_hw": tuple(x.shape[2:]), "out_hw": (h, w),
                           "flops": 2 * n * h * w * c_out * c_in * k_h * k_w})
        elif isinstance(layer, paddle.nn.Linear):
            n = int(np.prod(x.shape[:-1]))
            layers.append({"kind": "linear", "flops": 2 * n * layer.weight.shape[0] * layer.weight.shape[1]})

    handles = [m.register_forward_post_hook(hook) for m in model.sublayers(include_self=True)
               if isinstance(m, (paddle.nn.Conv2D, paddle.nn.Linear))]
    try:
        with paddle.no_grad():
            model(sample)
    finally:
        for handle in handles:
            handle.remove()
    return layers


def training_flops(layers: list[dict[str, Any]]) -> int:
    """Forward, input gradient and weight gradient of every layer; the first layer needs no input gradient."""
    total = sum(3 * layer["flops"] for layer in layers)
    return total - (layers[0]["flops"] if layers else 0)


def training_flops_per_image(model: paddle.nn.Layer, in_chans: int, image_size: int) -> int:
    """FLOPs of one image's training step through ``model`` (a square NCHW input of ``image_size``).

    The model runs once in evaluation mode on zeros and is put back in the mode it was in, so no running
    statistic and no random state changes.
    """
    was_training = model.training
    model.eval()
    try:
        layers = count_forward_flops(model, paddle.zeros([1, in_chans, image_size, image_size]))
    finally:
        if was_training:
            model.train()
    return training_flops(layers)


def training_arithmetic(model: paddle.nn.Layer, in_chans: int, image_size: int, train_loader: Any, batch_size: int,
                        world_size: int, limit_train_batches: int | None) -> TrainingArithmetic | None:
    """A run's arithmetic, logged: the model's training FLOPs an image at ``image_size`` and the images an epoch
    of ``train_loader`` trains on all ranks (``limit_train_batches`` of ``batch_size`` a rank, if set); None (and
    a warning) for a model the count cannot run through."""
    try:
        per_image = training_flops_per_image(model, in_chans, image_size)
    except Exception as exc:  # noqa: BLE001 (a plugin's model may take other inputs: the count is only a report)
        log.warning("cannot count the model's arithmetic (%s: %s); summary.json will not have train/pflop",
                    type(exc).__name__, exc)
        return None
    try:
        images = len(train_loader.dataset)
    except TypeError:  # a stream: its length is unknown
        images = None
    if images is not None and limit_train_batches is not None:
        images = min(images, limit_train_batches * batch_size * world_size)
    log.info("Training arithmetic: %.1f MFLOP an image (convolutions and linear layers: forward, input and weight "
             "gradients)%s", per_image / 1e6,
             f", {per_image * images / 1e12:.2f} TFLOP an epoch of {images:,} images" if images else "")
    return TrainingArithmetic(per_image, images)
