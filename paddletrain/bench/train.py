"""Training throughput on synthetic on-device data, and the CPU thread count that trains fastest.

``train``: images/s, ms/step and peak memory of the library's training step (forward under
``Precision.autocast``, ``Precision.backward``, ``Precision.step`` with its finite check) for one model /
batch / precision / data format. ``threads``: the same step with each CPU thread count, interleaved.
"""
from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import paddle
from omegaconf import OmegaConf

from paddletrain.bench.common import (
    bench_model,
    check_options,
    cycle,
    environment,
    finished,
    interleave,
    peak_memory_mb,
    reset_peak_memory,
    summarize,
    synthetic_batches,
    timed,
)
from paddletrain.config import AmpConfig, allowed
from paddletrain.engine.precision import Precision
from paddletrain.errors import ConfigError
from paddletrain.job.runtime import DEVICES
from paddletrain.models.conv_backward import use_conv_input_grad

PRECISIONS = ("fp32", "amp_o1", "amp_o2")


@dataclass
class TrainBenchConfig:
    model: str = "resnet20"
    # model.width: the channels of every stage times this.
    width: float = allowed(1.0, gt=0)
    batch_size: int = allowed(64, ge=1)
    image_size: int = allowed(32, ge=1)
    num_classes: int = allowed(10, ge=1)
    precision: str = allowed("fp32", choices=PRECISIONS)
    amp_dtype: str = allowed("float16", choices=("float16", "bfloat16"))
    data_format: str = allowed("NCHW", choices=("NCHW", "NHWC"))
    # Compile the model's forward to a static graph (paddle.jit.to_static, full graph); the backward then runs
    # as its static program too.
    to_static: bool = False
    # model.conv_input_grad: stride-1 convolutions' input gradient as a convolution (paddletrain.models.conv_backward).
    conv_input_grad: bool = False
    windows: int = allowed(5, ge=1)
    steps: int = allowed(10, ge=1)
    warmup: int = allowed(3, ge=0)
    # None: paddletrain.job.runtime.default_cpu_threads().
    cpu_threads: int | None = allowed(None, ge=1)
    device: str = allowed("auto", choices=DEVICES)


@dataclass
class ThreadsBenchConfig(TrainBenchConfig):
    threads: list[int] = allowed(factory=lambda: [1, 2], ge=1)


def bench_precision(name: str, dtype: str, device: str) -> Precision:
    """fp32, or AMP at the level ``name`` ends with (``amp_o1``/``amp_o2``), built as ``fit`` builds it
    (:meth:`~paddletrain.engine.precision.Precision.from_config` on a ``trainer.amp`` config)."""
    amp = AmpConfig(enabled=True, level=name[-2:].upper(), dtype=dtype) if name != "fp32" else AmpConfig()
    return Precision.from_config(OmegaConf.structured(amp), device=device)


def make_step_window(cfg: TrainBenchConfig, seed: int = 0) -> Callable[[int], float]:
    """A fresh model + Momentum optimizer and ``run(steps) -> seconds`` over synthetic batches."""
    device = paddle.device.get_device()
    precision = bench_precision(cfg.precision, cfg.amp_dtype, device)
    model = bench_model(cfg.model, cfg.num_classes, cfg.data_format, seed=seed, width=cfg.width)
    if cfg.conv_input_grad:
        use_conv_input_grad(model)
    if cfg.to_static:
        model = paddle.jit.to_static(model, full_graph=True)
    optimizer = paddle.optimizer.Momentum(0.01, momentum=0.9, parameters=model.parameters())
    model, optimizer = precision.setup(model, optimizer)
    model.train()
    params = list(model.parameters())
    loss_fn = paddle.nn.CrossEntropyLoss()
    batches = synthetic_batches(4, cfg.batch_size, cfg.image_size, cfg.num_classes, seed=seed)

    def window(steps: int) -> float:
        def work() -> None:
            loss = None
            for images, labels in cycle(batches, steps):
                with precision.autocast(training=True):
                    loss = loss_fn(model(images), labels)
                precision.backward(loss)
                precision.step(optimizer, params)
            float(loss)  # the window ends when its last step's results are on the host

        return timed(work)

    window.amp_active = precision.amp_active  # type: ignore[attr-defined]
    return window


def run_train(cfg: TrainBenchConfig) -> dict[str, Any]:
    """Median images/s and ms/step over ``cfg.windows`` windows of ``cfg.steps`` steps, after warm-up."""
    from paddletrain.job.runtime import setup_runtime

    check_options(cfg, "train")
    runtime = setup_runtime(cfg.device, cfg.cpu_threads)
    env = environment(runtime.cpu_threads)
    reset_peak_memory()
    window = make_step_window(cfg)
    per_step = interleave({"train": window}, cfg.windows, cfg.steps, cfg.warmup)["train"]
    row = {"model": cfg.model, "batch_size": cfg.batch_size, "image_size": cfg.image_size,
           "precision": cfg.precision, "amp_active": window.amp_active, "data_format": cfg.data_format,
           "to_static": cfg.to_static, "conv_input_grad": cfg.conv_input_grad,
           **summarize(per_step, cfg.batch_size), **peak_memory_mb()}
    notes = [] if window.amp_active or cfg.precision == "fp32" else [
        "AMP is inert on CPU: this row trained in float32."]
    return {"benchmark": "train", "config": vars(cfg), "environment": finished(env),
            "rows": [row], "notes": notes}


def run_threads(cfg: ThreadsBenchConfig) -> dict[str, Any]:
    """The training step with each thread count in ``cfg.threads``, windows interleaved across counts."""
    from paddletrain.job.runtime import set_cpu_threads, setup_runtime

    check_options(cfg, "threads")
    if not cfg.threads:
        raise ConfigError("bench threads: threads=[] names no thread count; e.g. threads=[1,2]")
    setup_runtime(cfg.device, cfg.threads[0])
    env = environment(None)
    window = make_step_window(cfg)

    def pinned(threads: int) -> Callable[[int], float]:
        def run(steps: int) -> float:
            set_cpu_threads(threads)
            return window(steps)
        return run

    per_step = interleave({str(t): pinned(t) for t in cfg.threads}, cfg.windows, cfg.steps, cfg.warmup)
    rows = [{"model": cfg.model, "batch_size": cfg.batch_size, "image_size": cfg.image_size, "cpu_threads": int(t),
             **summarize(times, cfg.batch_size)} for t, times in per_step.items()]
    best = min(rows, key=lambda r: r["ms_per_step"])
    return {"benchmark": "threads", "config": vars(cfg), "environment": finished(env), "rows": rows,
            "summary": {"best_cpu_threads": best["cpu_threads"],
                        "speedup_best_vs_worst": max(r["ms_per_step"] for r in rows) / best["ms_per_step"]},
            "notes": []}
