"""A convolution's input gradient: Paddle's CPU kernel against a forward convolution (``model.conv_input_grad``).

Two parts, in one process with the thread count of one rank of a recipe:

- each distinct stride-1 "same" convolution of the model at the recipe's batch, alone: its forward pass, Paddle's
  input gradient (the backward with the input needing a gradient, less the backward without), and the same
  gradient as a forward convolution of the output gradient with the transposed, flipped kernel
  (:mod:`paddletrain.models.conv_backward`);
- the whole training step (forward, backward, Momentum update) of two copies of the model from the same
  initial weights, one converted by :func:`~paddletrain.models.conv_backward.use_conv_input_grad`, on the same
  synthetic batches, their windows interleaved; the speed-up is the median of the window-by-window ratios.
"""
from __future__ import annotations

import copy
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import paddle
import paddle.nn.functional as F

from comparisons.step_profile import StepShapeConfig, median_seconds
from paddletrain.bench.common import check_options, environment, finished, interleave, paired_ratio, summarize
from paddletrain.config import allowed
from paddletrain.models import create_model
from paddletrain.models.conv_backward import input_grad, takes_conv_input_grad, use_conv_input_grad


@dataclass
class ConvInputGradConfig(StepShapeConfig):
    """The recipe's step (as the step profile's); ``steps`` a window."""

    steps: int = allowed(10, ge=1)
    warmup: int = allowed(3, ge=0)
    windows: int = allowed(5, ge=1)
    repeats: int = allowed(10, ge=1)


def _median_ms(run: Callable[[], Any], repeats: int) -> float:
    return 1000 * median_seconds(run, repeats)


def eligible_convolutions(model: paddle.nn.Layer, sample: paddle.Tensor) -> list[dict[str, Any]]:
    """The distinct input shapes of the model's convolutions that take the faster input gradient in training, with
    counts: eligible layers whose input needs a gradient (not the stem, which sees the images)."""
    seen: dict[tuple, dict[str, Any]] = {}

    def hook(layer: paddle.nn.Layer, inputs: Any, output: paddle.Tensor) -> None:
        if inputs[0].stop_gradient:
            return
        key = (tuple(inputs[0].shape), tuple(layer.weight.shape))
        seen.setdefault(key, {"input": key[0], "weight": key[1], "padding": list(layer._updated_padding),
                              "count": 0})["count"] += 1

    handles = [layer.register_forward_post_hook(hook) for layer in model.sublayers() if takes_conv_input_grad(layer)]
    model(sample)  # with gradients on: which inputs need one is what decides
    for handle in handles:
        handle.remove()
    return list(seen.values())


def time_input_grads(conv: dict[str, Any], repeats: int) -> dict[str, Any]:
    """Forward, Paddle's input gradient and the input gradient as a convolution of one shape, in ms."""
    x, weight = paddle.randn(conv["input"]), paddle.randn(conv["weight"])
    weight.stop_gradient = False
    padding = conv["padding"]
    grad_y = paddle.randn(F.conv2d(x, weight, padding=padding).shape)
    x_needing_grad = x.clone()
    x_needing_grad.stop_gradient = False
    forward = _median_ms(lambda: F.conv2d(x, weight, padding=padding), repeats)
    weight_only = _median_ms(lambda: F.conv2d(x, weight, padding=padding).backward(grad_y), repeats)
    both = _median_ms(lambda: F.conv2d(x_needing_grad, weight, padding=padding).backward(grad_y), repeats)
    detached = weight.detach()
    as_conv = _median_ms(lambda: input_grad(grad_y, detached, padding), repeats)
    return {"input": "x".join(map(str, conv["input"])), "kernel": "x".join(map(str, conv["weight"])),
            "layers": conv["count"], "forward_ms": round(forward, 2),
            "paddle_input_grad_ms": round(both - weight_only, 2), "as_convolution_ms": round(as_conv, 2)}


def _step_window(model: paddle.nn.Layer, batches: list[tuple[paddle.Tensor, paddle.Tensor]],
                 label_smoothing: float) -> Callable[[int], float]:
    optimizer = paddle.optimizer.Momentum(0.1, momentum=0.9, use_nesterov=True, weight_decay=5e-4,
                                          parameters=model.parameters())

    def window(steps: int) -> float:
        start = time.perf_counter()
        loss = None
        for step in range(steps):
            images, labels = batches[step % len(batches)]
            loss = F.cross_entropy(model(images), labels, label_smoothing=label_smoothing or None)
            loss.backward()
            optimizer.step()
            optimizer.clear_grad()
        float(loss)
        return time.perf_counter() - start

    return window


def run_conv_input_grad(cfg: ConvInputGradConfig) -> dict[str, Any]:
    check_options(cfg, "conv_input_grad")
    paddle.set_device("cpu")
    paddle.base.core.set_num_threads(cfg.cpu_threads)
    env = environment()
    paddle.seed(0)
    reference = create_model(cfg.model, num_classes=cfg.num_classes, in_chans=cfg.in_chans, width=cfg.width)
    converted = copy.deepcopy(reference)
    count = use_conv_input_grad(converted)
    shape = [cfg.batch_size, cfg.in_chans, cfg.image_size, cfg.image_size]
    batches = [(paddle.randn(shape), paddle.randint(0, cfg.num_classes, [cfg.batch_size])) for _ in range(4)]

    layers = [time_input_grads(conv, cfg.repeats) for conv in eligible_convolutions(reference, batches[0][0])]
    arms = {"paddle": _step_window(reference, batches, cfg.label_smoothing),
            "conv_input_grad": _step_window(converted, batches, cfg.label_smoothing)}
    per_step = interleave(arms, cfg.windows, cfg.steps, cfg.warmup)
    rows = [{"arm": arm, **summarize(times, cfg.batch_size)} for arm, times in per_step.items()]
    speedup = paired_ratio(per_step["paddle"], per_step["conv_input_grad"])
    saved = sum((layer["paddle_input_grad_ms"] - layer["as_convolution_ms"]) * layer["layers"] for layer in layers)
    notes = [f"{cfg.model} (width {cfg.width:g}) at batch {cfg.batch_size}, {cfg.image_size} px, "
             f"{cfg.cpu_threads} thread(s): {count} convolutions converted",
             f"training step speed-up (median of paired windows): {speedup:.3f}x; the layers' input gradients "
             f"add up to {saved:.1f} ms a step less"]
    return {"benchmark": "conv_input_grad", "config": vars(cfg), "environment": finished(env),
            "layers": layers, "rows": rows, "summary": {"speedup": speedup, "converted": count}, "notes": notes}
