"""What the overhead comparisons share: a plain Paddle training loop, and the Trainer's ratios to the other arms.

:mod:`comparisons.overhead` runs them on synthetic batches, :mod:`comparisons.overhead_recipe` on a recipe's own
steps.
"""
from __future__ import annotations

import math
import statistics
from collections.abc import Callable, Iterable
from typing import Any

import paddle

from paddletrain.bench.common import paired_ratio, paired_ratio_interval, timed

# Throughput ratios the Trainer must reach against these arms.
GOALS = {"hand": 0.98, "model_fit": 1.0}


def hand_loop(model: paddle.nn.Layer, optimizer: paddle.optimizer.Optimizer, loss_fn: Callable[..., paddle.Tensor],
              num_classes: int, batches: Callable[[int], Iterable[Any]], scheduler: Any = None,
              equivalent_work: bool = True) -> Callable[[int], float]:
    """A plain Paddle training loop over ``batches(steps)``, timed one window at a time.

    ``equivalent_work``: also what the Trainer does for every step (the global gradient norm for its finite
    check, loss and top-k hits summed on the device, one metric sync a window); without it, the bare floor.
    """
    model.train()
    params = list(model.parameters())
    ks = [k for k in (1, 5) if k <= num_classes]

    def work(steps: int) -> None:
        loss_sum = hits = None
        for images, labels in batches(steps):
            logits = model(images)
            loss = loss_fn(logits, labels)
            loss.backward()
            if equivalent_work:
                norm = paddle.nn.utils.clip_grad_norm_([p for p in params if p.grad is not None], math.inf)
                stepped = math.isfinite(float(norm))
            else:
                stepped = True
            if stepped:
                optimizer.step()
                if scheduler is not None:
                    scheduler.step()
            optimizer.clear_grad()
            loss_value = float(loss)
            if equivalent_work and math.isfinite(loss_value):
                _, top = paddle.topk(logits.detach(), k=max(ks), axis=-1)
                correct = top == labels.reshape([-1, 1])
                batch_hits = paddle.stack([correct[:, :k].any(axis=-1).astype("float32").sum() for k in ks])
                batch_loss = loss.detach() * len(labels)
                hits = batch_hits if hits is None else hits + batch_hits
                loss_sum = batch_loss if loss_sum is None else loss_sum + batch_loss
        if hits is not None:
            paddle.concat([loss_sum.reshape([1]), hits]).numpy()  # the epoch's one metric sync, as the Trainer

    return lambda steps: timed(lambda: work(steps))


def compare_with_trainer(per_step: dict[str, list[float]]) -> tuple[dict[str, float], list[dict[str, Any]]]:
    """The trainer arm's throughput ratio to each other arm (the other's time / the trainer's: > 1 means the
    Trainer is faster), its overhead over the hand loop in ms a step, and the goals with their 95% intervals."""
    summary: dict[str, float] = {}
    goals: list[dict[str, Any]] = []
    trainer = per_step.get("trainer")
    if trainer is None:
        return summary, goals
    for other in ("hand", "bare", "model_fit"):
        if other in per_step:
            summary[f"trainer_vs_{other}"] = paired_ratio(per_step[other], trainer)
    if "hand" in per_step:
        summary["trainer_overhead_ms_per_step"] = 1e3 * statistics.median(
            t - h for t, h in zip(trainer, per_step["hand"], strict=True))
    for other, target in GOALS.items():
        if other in per_step:
            measured = summary[f"trainer_vs_{other}"]
            interval = paired_ratio_interval(per_step[other], trainer)
            goals.append({"goal": f"trainer_vs_{other} >= {target}", "measured": measured, "met": measured >= target,
                          "interval": list(interval) if interval else None})
    return summary, goals
