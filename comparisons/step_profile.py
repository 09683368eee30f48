"""Where a training step's time goes, and how close its arithmetic runs to this machine's measured peak.

One process with the thread count of one rank of a recipe (``cpu_threads``) trains the recipe's model on synthetic
batches of its shape, timing each step's forward (model and loss), backward and optimizer update (step and clearing
the gradients) apart: Paddle's CPU kernels run synchronously, so the clock between the calls is the kernels' time;
with ``conv_input_grad=true`` the model's eligible convolutions compute their input gradient as a convolution, as
the Fashion-MNIST recipe's do (:mod:`paddletrain.models.conv_backward`). The step's arithmetic is counted from the
model's convolutions and linear layers (multiply-adds of the forward pass, times 3 for training: the forward, the
input gradient and the weight gradient, less the input gradient of the first layer, which nothing needs), and
divided by the step time: the achieved GFLOP/s.

The peak it is held against is measured in the same run, for the same convolutions: each distinct convolution of
the model at the recipe's batch, run alone (``paddle.nn.functional.conv2d``), and the matrix product it amounts to
(``[batch x out_h x out_w, in_ch x k x k] @ [in_ch x k x k, out_ch]``) through ``paddle.matmul`` (Paddle's MKL)
and NumPy (its OpenBLAS); and a 2048 x 2048 product through both, the machine's dense-arithmetic ceiling.
"""
from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np
import paddle
import paddle.nn.functional as F

from paddletrain.bench.common import check_options, environment, finished
from paddletrain.config import allowed
from paddletrain.models import create_model
from paddletrain.models.conv_backward import use_conv_input_grad
from paddletrain.models.flops import count_forward_flops, training_flops


@dataclass
class StepShapeConfig:
    """The recipe's step as one rank runs it: its model, batch, threads and loss."""

    model: str = "resnet20"
    # model.width: the channels of every stage times this (the Fashion-MNIST recipe: 2).
    width: float = allowed(1.0, gt=0)
    in_chans: int = allowed(1, ge=1)
    num_classes: int = allowed(10, ge=1)
    image_size: int = allowed(28, ge=1)
    # Per process: one rank's share of the recipe's global batch.
    batch_size: int = allowed(64, ge=1)
    # One rank's compute threads (a rank per core).
    cpu_threads: int = allowed(1, ge=1)
    label_smoothing: float = allowed(0.1, ge=0, lt=1)


@dataclass
class StepProfileConfig(StepShapeConfig):
    steps: int = allowed(200, ge=1)
    warmup: int = allowed(10, ge=0)
    # Repeats of each micro-benchmark (the median is kept).
    repeats: int = allowed(20, ge=1)
    # model.conv_input_grad: profile the step with the input gradients computed as convolutions.
    conv_input_grad: bool = False


def median_seconds(run: Callable[[], Any], repeats: int) -> float:
    run()
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        run()
        times.append(time.perf_counter() - start)
    return float(np.median(times))


def _conv_micro(layer: dict[str, Any], repeats: int) -> dict[str, Any]:
    """One convolution alone, and the matrix product it amounts to, through Paddle and NumPy."""
    c_in, c_out, (k_h, k_w) = layer["in_ch"], layer["out_ch"], layer["kernel"]
    x = paddle.rand([layer["batch"], c_in, *layer["in_hw"]])
    w = paddle.rand([c_out, c_in // layer["groups"], k_h, k_w])
    conv = median_seconds(lambda: F.conv2d(x, w, stride=layer["stride"], padding=layer["padding"],
                                            groups=layer["groups"]).numpy(), repeats)
    m = layer["batch"] * layer["out_hw"][0] * layer["out_hw"][1]
    k = c_in // layer["groups"] * k_h * k_w
    a, b = np.random.rand(m, k).astype(np.float32), np.random.rand(k, c_out).astype(np.float32)
    pa, pb = paddle.to_tensor(a), paddle.to_tensor(b)
    paddle_gemm = median_seconds(lambda: paddle.matmul(pa, pb).numpy(), repeats)
    numpy_gemm = median_seconds(lambda: a @ b, repeats)
    return {"conv": conv, "paddle_gemm": paddle_gemm, "numpy_gemm": numpy_gemm, "gemm_shape": (m, k, c_out)}


def _square_gemm(n: int, repeats: int) -> dict[str, float]:
    a, b = np.random.rand(n, n).astype(np.float32), np.random.rand(n, n).astype(np.float32)
    pa, pb = paddle.to_tensor(a), paddle.to_tensor(b)
    flops = 2 * n ** 3
    return {"paddle": flops / median_seconds(lambda: paddle.matmul(pa, pb).numpy(), repeats) / 1e9,
            "numpy": flops / median_seconds(lambda: a @ b, repeats) / 1e9}


def run_step_profile(cfg: StepProfileConfig) -> dict[str, Any]:
    check_options(cfg, "step_profile")
    paddle.set_device("cpu")
    paddle.base.core.set_num_threads(cfg.cpu_threads)
    env = environment()
    paddle.seed(0)
    model = create_model(cfg.model, num_classes=cfg.num_classes, in_chans=cfg.in_chans, width=cfg.width)
    converted = use_conv_input_grad(model) if cfg.conv_input_grad else 0
    optimizer = paddle.optimizer.Momentum(learning_rate=0.1, momentum=0.9, use_nesterov=True, weight_decay=5e-4,
                                          parameters=model.parameters())
    shape = [cfg.batch_size, cfg.in_chans, cfg.image_size, cfg.image_size]
    images, labels = paddle.randn(shape), paddle.randint(0, cfg.num_classes, [cfg.batch_size])
    layers = count_forward_flops(model, images)
    flops = training_flops(layers)

    spent = {"forward": 0.0, "backward": 0.0, "optimizer": 0.0}
    for step in range(cfg.warmup + cfg.steps):
        t0 = time.perf_counter()
        loss = F.cross_entropy(model(images), labels, label_smoothing=cfg.label_smoothing or None)
        float(loss)
        t1 = time.perf_counter()
        loss.backward()
        t2 = time.perf_counter()
        optimizer.step()
        optimizer.clear_grad()
        t3 = time.perf_counter()
        if step >= cfg.warmup:
            spent["forward"] += t1 - t0
            spent["backward"] += t2 - t1
            spent["optimizer"] += t3 - t2
    step_seconds = sum(spent.values()) / cfg.steps
    achieved = flops / step_seconds / 1e9

    convs = [layer for layer in layers if layer["kind"] == "conv"]
    distinct: dict[tuple, dict[str, Any]] = {}
    for layer in convs:
        key = (layer["in_ch"], layer["out_ch"], tuple(layer["kernel"]), str(layer["stride"]), layer["in_hw"])
        distinct.setdefault(key, {**layer, "count": 0})["count"] += 1
    totals = {"conv": 0.0, "paddle_gemm": 0.0, "numpy_gemm": 0.0}
    conv_flops = 0
    for layer in distinct.values():
        timing = _conv_micro(layer, cfg.repeats)
        conv_flops += layer["flops"] * layer["count"]
        for key in totals:
            totals[key] += timing[key] * layer["count"]
    square = _square_gemm(2048, max(3, cfg.repeats // 4))
    model_forward_gflops = {key: conv_flops / seconds / 1e9 for key, seconds in totals.items()}

    rows = [{"part of a step": name, "ms": round(1000 * seconds / cfg.steps, 2),
             "share": f"{seconds / sum(spent.values()):.1%}"} for name, seconds in spent.items()]
    peak_rows = [
        {"what": "training step, achieved", "GFLOP/s": round(achieved, 1)},
        {"what": "the model's convolutions alone, forward (paddle conv2d)",
         "GFLOP/s": round(model_forward_gflops["conv"], 1)},
        {"what": "the same convolutions as matrix products, paddle.matmul (MKL)",
         "GFLOP/s": round(model_forward_gflops["paddle_gemm"], 1)},
        {"what": "the same convolutions as matrix products, NumPy (OpenBLAS)",
         "GFLOP/s": round(model_forward_gflops["numpy_gemm"], 1)},
        {"what": "2048 x 2048 matrix product, paddle.matmul", "GFLOP/s": round(square["paddle"], 1)},
        {"what": "2048 x 2048 matrix product, NumPy", "GFLOP/s": round(square["numpy"], 1)},
    ]
    notes = [f"{cfg.model} (width {cfg.width:g}) at batch {cfg.batch_size}, {cfg.image_size} px, "
             f"{cfg.cpu_threads} thread(s), {converted} convolutions with model.conv_input_grad: "
             f"{flops / 1e9:.2f} GFLOP a training step ({flops / cfg.batch_size / 1e6:.1f} MFLOP an image), "
             f"{1000 * step_seconds:.1f} ms a step, {cfg.batch_size / step_seconds:.1f} images/s",
             "achieved = counted training FLOPs / measured step time; the peaks are measured in this run"]
    return {"benchmark": "step_profile", "config": vars(cfg), "environment": finished(env),
            "rows": rows, "peaks": peak_rows, "notes": notes,
            "flops_per_step": flops, "step_seconds": step_seconds, "achieved_gflops": achieved,
            "converted": converted}
