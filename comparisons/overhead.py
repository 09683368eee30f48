"""Trainer overhead: the same training through ``Trainer.fit``, ``paddle.Model.fit`` and hand-written loops.

All arms run in one process with the same pinned CPU threads, the same model (same initial weights, one
copy per arm), the same Momentum optimizer and the same on-device synthetic batches; their windows are
interleaved A B C D A B C D ... and the medians are compared. What each arm does per step:

- ``trainer``: ``Trainer.fit`` over a list of batches with the callbacks ``paddletrain.fit`` always adds
  (a hidden ProgressBar and LearningRateMonitor): forward, backward, ``Precision.step`` (global gradient
  norm -> host, step unless non-finite, clear), ``float(loss)`` (host), loss and top-1/top-5 hits summed on
  the device, callback dispatch. One ``fit()`` call per window, so a window also pays fit/epoch set-up.
- ``hand``: the same per-step work written inline: forward, backward, global gradient norm from the same
  ``paddle.nn.utils.clip_grad_norm_`` (unlimited) -> host, step if finite, clear, ``float(loss)``, loss and
  top-k hits on device.
- ``bare``: forward, backward, ``optimizer.step()``, ``clear_grad()``, ``float(loss)``: the floor, without
  the finite check or metrics (for reference; the goal compares with ``hand``).
- ``model_fit``: ``paddle.Model.fit`` (hapi) with ``Accuracy(topk=(1, 5))``, ``verbose=0``: per step it
  copies inputs with ``to_tensor``, steps, and moves the loss and the metric's hits to NumPy.

With ``experiment=<recipe>`` the trainer, hand and bare arms train that recipe's own model on its own loader and
augmentation instead (:mod:`comparisons.overhead_recipe`).
"""
from __future__ import annotations

import timeit
from collections.abc import Callable
from dataclasses import dataclass, field, fields, replace
from typing import Any

import paddle

from comparisons.plain_loop import compare_with_trainer, hand_loop
from paddletrain.bench.common import (
    bench_model,
    check_options,
    cycle,
    environment,
    finished,
    interleave,
    summarize,
    synthetic_batches,
    timed,
)
from paddletrain.config import allowed
from paddletrain.engine.precision import clip_grad_norm_
from paddletrain.errors import ConfigError
from paddletrain.job.runtime import DEVICES

ARMS = ("trainer", "hand", "bare", "model_fit")
# Per-step work of each arm, reported with the results (details in the module docstring).
ARM_WORK = {
    "trainer": "Trainer.fit: fwd, bwd, Precision.step (grad norm -> host, step, clear), float(loss), device "
               "loss/top-k sums, callbacks (hidden ProgressBar, LearningRateMonitor); one fit() per window",
    "hand": "inline loop with the same work: fwd, bwd, clip_grad_norm_ (unlimited) -> host, step if finite, "
            "clear, float(loss), device loss/top-k sums",
    "bare": "fwd, bwd, step, clear, float(loss) (no finite check, no metrics)",
    "model_fit": "paddle.Model.fit, Accuracy(topk=(1,5)), verbose=0: to_tensor copies, loss and hits to NumPy",
}
LR = 0.01
# Keys of the synthetic arms that an experiment decides; a value other than their default is a mistake.
FROM_EXPERIMENT = ("model", "width", "batch_size", "image_size", "num_classes")


@dataclass
class OverheadBenchConfig:
    model: str = "resnet20"
    # model.width: the channels of every stage times this.
    width: float = allowed(1.0, gt=0)
    batch_size: int = allowed(64, ge=1)
    image_size: int = allowed(32, ge=1)
    num_classes: int = allowed(10, ge=1)
    arms: list[str] = allowed(factory=lambda: list(ARMS), choices=ARMS)
    windows: int = allowed(5, ge=1)
    steps: int = allowed(10, ge=1)
    warmup: int = allowed(3, ge=0)
    # Also time the Trainer's extra parts one by one (hooks, meter; module.parameters() is now once per fit).
    attribute: bool = True
    cpu_threads: int | None = allowed(None, ge=1)
    device: str = allowed("auto", choices=DEVICES)
    # A recipe in config_dir/experiment/ (e.g. fashion_mnist_949): the arms then train copies of the run that
    # `python -m paddletrain.fit --config-dir <config_dir> +experiment=<name>` builds, on its own loader and
    # augmentation, instead of synthetic batches (comparisons.overhead_recipe). Its model and batch decide;
    # `overrides` are further fit overrides, e.g. [data.root=/data/fashion-mnist].
    experiment: str | None = None
    config_dir: str = "configs"
    overrides: list[str] = field(default_factory=list)


def _optimizer(model: paddle.nn.Layer) -> paddle.optimizer.Optimizer:
    return paddle.optimizer.Momentum(LR, momentum=0.9, parameters=model.parameters())


def trainer_arm(cfg: OverheadBenchConfig, batches: list[Any]) -> Callable[[int], float]:
    from paddletrain.callbacks import LearningRateMonitor, ProgressBar
    from paddletrain.engine.limits import Limits
    from paddletrain.engine.trainer import Trainer

    model = bench_model(cfg.model, cfg.num_classes, width=cfg.width)
    trainer = Trainer(model, _optimizer(model), callbacks=[ProgressBar(enabled=False), LearningRateMonitor()],
                      num_classes=cfg.num_classes, limits=Limits(max_epochs=0))

    def run(steps: int) -> float:
        trainer.limits = replace(trainer.limits, max_epochs=trainer.epoch + 1)  # one more epoch: this window's batches
        return timed(lambda: trainer.fit(cycle(batches, steps)))

    return run


def hand_arm(cfg: OverheadBenchConfig, batches: list[Any], equivalent_work: bool = True) -> Callable[[int], float]:
    model = bench_model(cfg.model, cfg.num_classes, width=cfg.width)
    return hand_loop(model, _optimizer(model), paddle.nn.CrossEntropyLoss(), cfg.num_classes,
                     lambda steps: cycle(batches, steps), equivalent_work=equivalent_work)


def model_fit_arm(cfg: OverheadBenchConfig, batches: list[Any]) -> Callable[[int], float]:
    from paddle.static import InputSpec

    network = bench_model(cfg.model, cfg.num_classes, width=cfg.width)
    model = paddle.Model(network, inputs=[InputSpec([None, 3, cfg.image_size, cfg.image_size], "float32", "x")],
                         labels=[InputSpec([None], "int64", "y")])
    ks = tuple(k for k in (1, 5) if k <= cfg.num_classes)
    model.prepare(_optimizer(network), paddle.nn.CrossEntropyLoss(), metrics=paddle.metric.Accuracy(topk=ks))

    def run(steps: int) -> float:
        return timed(lambda: model.fit(cycle(batches, steps), epochs=1, verbose=0, shuffle=False, log_freq=10**9))

    return run


BUILDERS: dict[str, Callable[..., Callable[[int], float]]] = {
    "trainer": trainer_arm,
    "hand": hand_arm,
    "bare": lambda cfg, batches: hand_arm(cfg, batches, equivalent_work=False),
    "model_fit": model_fit_arm,
}


def per_call_us(fn: Callable[[], Any], number: int = 200, repeat: int = 5) -> float:
    """Best-of-``repeat`` mean microseconds of ``fn`` (the least-disturbed run: this is attribution, not speed)."""
    fn()
    return min(timeit.repeat(fn, number=number, repeat=repeat)) / number * 1e6


def _on_experiment(cfg: OverheadBenchConfig) -> dict[str, Any]:
    """``experiment=<recipe>``: the arms on the recipe's own steps (:mod:`comparisons.overhead_recipe`)."""
    from comparisons.overhead_recipe import ARMS as RECIPE_ARMS
    from comparisons.overhead_recipe import ExperimentSteps, run_experiment_overhead

    defaults = OverheadBenchConfig()
    fixed = [key for key in FROM_EXPERIMENT if getattr(cfg, key) != getattr(defaults, key)]
    if fixed:
        raise ConfigError(f"bench overhead: {fixed} come from experiment={cfg.experiment}; change them with "
                          f"overrides=[...] (e.g. overrides=[data.batch_size=32])")
    arms = list(RECIPE_ARMS) if cfg.arms == defaults.arms else cfg.arms  # not chosen: all that run on a recipe
    steps = ExperimentSteps(**{**{f.name: getattr(cfg, f.name) for f in fields(ExperimentSteps)}, "arms": arms})
    return {"config": vars(cfg), **run_experiment_overhead(steps)}


def trainer_step_parts(cfg: OverheadBenchConfig, batches: list[Any]) -> dict[str, float]:
    """Microseconds per step of what the Trainer does beyond the hand loop, measured one part at a time."""
    from paddletrain.callbacks import LearningRateMonitor, ProgressBar, StepOutput
    from paddletrain.engine.trainer import Trainer
    from paddletrain.metrics import ClassificationMeter

    model = bench_model(cfg.model, cfg.num_classes, width=cfg.width)
    optimizer = _optimizer(model)
    callbacks = [ProgressBar(enabled=False), LearningRateMonitor()]
    trainer = Trainer(model, optimizer, callbacks=callbacks, num_classes=cfg.num_classes)
    for cb in callbacks:
        cb.on_fit_start(trainer)
        cb.on_train_epoch_start(trainer)
    images, labels = batches[0]
    logits = model(images)
    loss = paddle.nn.functional.cross_entropy(logits, labels)
    loss.backward()  # gradients for timing the norm; the parts below only read them
    logits, loss = logits.detach(), loss.detach()
    params = list(model.parameters())
    output = StepOutput(loss=1.0, batch_size=len(labels), lr=0.01, stepped=True, data_time=0.0, compute_time=0.0)
    meter = ClassificationMeter(cfg.num_classes)
    ks = [k for k in (1, 5) if k <= cfg.num_classes]

    def hooks() -> None:
        for cb in callbacks:
            cb.on_train_batch_start(trainer, batches[0], 0)
            cb.on_before_optimizer_step(trainer, optimizer)
            cb.on_train_batch_end(trainer, output, batches[0], 0)

    sums: list[Any] = [None, None]

    def inline_metric() -> None:
        _, top = paddle.topk(logits, k=max(ks), axis=-1)
        correct = top == labels.reshape([-1, 1])
        hits = paddle.stack([correct[:, :k].any(axis=-1).astype("float32").sum() for k in ks])
        loss_sum = loss.detach() * len(labels)
        sums[0] = hits if sums[0] is None else sums[0] + hits  # accumulated, as in the hand loop
        sums[1] = loss_sum if sums[1] is None else sums[1] + loss_sum

    return {
        "gradient norm, unlimited clip_grad_norm_ (in Precision.step; the hand loop does it too)":
            per_call_us(lambda: clip_grad_norm_(params, None), number=20),
        "module.parameters() (once per fit: the Trainer caches the list)":
            per_call_us(lambda: trainer.module.parameters()),
        "callback hooks (3 per step x 2 callbacks)": per_call_us(hooks),
        "ClassificationMeter.update": per_call_us(lambda: meter.update(loss, logits, labels, len(labels))),
        "inline top-k + loss sum, accumulated (hand loop)": per_call_us(inline_metric),
        "StepOutput + current_lr": per_call_us(lambda: (trainer.current_lr, StepOutput(
            loss=1.0, batch_size=8, lr=0.01, stepped=True, data_time=0.0, compute_time=0.0))),
    }


def run_overhead(cfg: OverheadBenchConfig) -> dict[str, Any]:
    """Median ms/step of each arm, the Trainer's throughput ratios and its absolute overhead in ms/step."""
    from paddletrain.job.runtime import setup_runtime

    check_options(cfg, "overhead")
    if not cfg.arms:
        raise ConfigError(f"bench overhead: arms=[] names no arm; choose from {list(ARMS)}")
    if cfg.experiment:
        return _on_experiment(cfg)
    runtime = setup_runtime(cfg.device, cfg.cpu_threads)
    env = environment(runtime.cpu_threads)
    batches = synthetic_batches(4, cfg.batch_size, cfg.image_size, cfg.num_classes)
    arms = {name: BUILDERS[name](cfg, batches) for name in cfg.arms}
    per_step = interleave(arms, cfg.windows, cfg.steps, cfg.warmup)
    rows = [{"arm": name, "model": cfg.model, "batch_size": cfg.batch_size, **summarize(times, cfg.batch_size)}
            for name, times in per_step.items()]
    summary, goals = compare_with_trainer(per_step)
    parts = trainer_step_parts(cfg, batches) if cfg.attribute and "trainer" in cfg.arms else {}
    return {"benchmark": "overhead", "config": vars(cfg), "environment": finished(env),
            "rows": rows, "summary": summary, "trainer_parts_us": parts, "goals": goals,
            "notes": [f"{name}: {ARM_WORK[name]}" for name in cfg.arms]}


