"""Learning-rate schedules stepped once per optimizer step, with linear warmup, in the ``SCHEDULERS`` registry.

A schedule factory is ``factory(cfg: SchedConfig, base_lr, steps: ScheduleSteps) -> LRScheduler`` for the
steps after warmup; :func:`build_scheduler` adds the warmup in front. Its length comes from
:func:`schedule_steps`, computed from :func:`optimizer_steps_per_epoch`, the count the training loop follows, so the
schedule ends exactly on the run's last optimizer step.
"""
from __future__ import annotations

import itertools
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from paddle.optimizer.lr import LambdaDecay, LinearWarmup, LRScheduler, MultiStepDecay, OneCycleLR

from paddletrain.config import SchedConfig
from paddletrain.errors import ConfigError
from paddletrain.registry import SCHEDULERS


@dataclass(frozen=True)
class ScheduleSteps:
    """How long a schedule runs, in optimizer steps."""

    # Optimizer steps in one epoch.
    per_epoch: int
    # Optimizer steps of max_epochs epochs.
    total: int
    # Warmup steps at the start (part of total).
    warmup: int

    @property
    def after_warmup(self) -> int:
        return self.total - self.warmup


def optimizer_steps_per_epoch(num_batches: int, accumulate_grad_batches: int) -> int:
    """Optimizer steps in an epoch of ``num_batches``: one per ``accumulate_grad_batches``, and one on the last
    batch even when its group is short (its gradients must not leak into the next epoch).

    The one definition: the Trainer steps this way, and the LR schedule and VisualDL's log interval count so.
    """
    return -(-num_batches // accumulate_grad_batches)


def schedule_steps(steps_per_epoch: int, max_epochs: int, warmup_epochs: float = 0.0) -> ScheduleSteps:
    """The schedule's length: every optimizer step of ``max_epochs`` epochs.

    ``trainer.max_steps`` only stops a run early; it does not shorten the schedule, so a run stopped by it and
    resumed with a larger one follows the same curve.
    """
    if steps_per_epoch <= 0 or max_epochs <= 0:
        raise ConfigError(f"need steps_per_epoch > 0 and max_epochs > 0, got {steps_per_epoch} and {max_epochs}")
    total = steps_per_epoch * max_epochs
    warmup = int(round(warmup_epochs * steps_per_epoch))
    if warmup >= total:
        raise ConfigError(f"sched.warmup_epochs={warmup_epochs} covers the whole run ({total} optimizer steps): "
                          "make it shorter")
    return ScheduleSteps(per_epoch=steps_per_epoch, total=total, warmup=warmup)


def check_sched_config(sched: SchedConfig, run_lr: float | None = None, lr: float | None = None) -> None:
    """The ``sched.*`` rules beyond each key's declared range; with ``run_lr`` (the rate the run starts from,
    :func:`paddletrain.optim.run_lr`, from ``optim.lr`` = ``lr``) a cosine schedule's ``sched.min_lr`` must not
    exceed it."""
    name = str(sched.name).lower()
    if name == "multistep":
        milestones = list(sched.milestones)
        if not milestones or any(b <= a for a, b in itertools.pairwise(milestones)):
            raise ConfigError(f"sched.milestones must be strictly increasing epochs, got {milestones}")
    if name == "cosine" and run_lr is not None and sched.min_lr > run_lr:
        scaled = f" (optim.lr={lr:g} scaled to the global batch)" if lr is not None and lr != run_lr else ""
        raise ConfigError(f"sched.min_lr={sched.min_lr} must be <= optim.lr={run_lr:g}{scaled}")


def build_scheduler(cfg: SchedConfig, base_lr: float, steps: ScheduleSteps,
                    options: Mapping[str, Any] | None = None) -> LRScheduler:
    """The schedule registered as ``sched.name``, after a linear warmup over ``steps.warmup`` steps.

    The warmup ramps from ``sched.warmup_start_factor`` x the schedule's first rate to it; the schedule itself
    starts counting after the warmup. Past its last step a schedule holds its final rate. ``cfg`` is a validated
    ``sched`` node or a :class:`SchedConfig` (checked when constructed); ``options`` the factory's own keyword
    arguments (:func:`paddletrain.config.factory_options`).
    """
    if not base_lr > 0:
        raise ConfigError(f"the learning rate (optim.lr) must be > 0, got {base_lr!r}")
    main = SCHEDULERS.get(str(cfg.name).lower())(cfg, base_lr, steps, **(options or {}))
    if steps.warmup == 0:
        return main
    first_lr = main()
    return LinearWarmup(main, warmup_steps=steps.warmup, start_lr=cfg.warmup_start_factor * first_lr,
                        end_lr=first_lr)


@SCHEDULERS.register("constant")
def constant(cfg: SchedConfig, base_lr: float, steps: ScheduleSteps) -> LRScheduler:
    """``optim.lr`` throughout."""
    return LambdaDecay(base_lr, lambda step: 1.0)


@SCHEDULERS.register("cosine")
def cosine(cfg: SchedConfig, base_lr: float, steps: ScheduleSteps) -> LRScheduler:
    """Half a cosine from ``optim.lr`` down to ``sched.min_lr`` over the steps after warmup, then ``min_lr``."""
    # sched.min_lr <= the run's learning rate: validation.py
    floor, length = cfg.min_lr / base_lr, steps.after_warmup
    # Paddle's CosineAnnealingDecay is periodic (it climbs back after T_max); this one holds min_lr.
    return LambdaDecay(base_lr, lambda step: floor + (1 - floor) * 0.5 * (1 + math.cos(math.pi * min(step, length)
                                                                                        / length)))


@SCHEDULERS.register("onecycle")
def onecycle(cfg: SchedConfig, base_lr: float, steps: ScheduleSteps) -> LRScheduler:
    """One cycle (Smith): up to ``optim.lr * sched.max_lr_factor`` over ``sched.pct_start``, then down."""
    length = steps.after_warmup
    # Paddle divides by the length of the warm phase (pct_start * steps - 1): it must be at least one step.
    if cfg.pct_start * length < 2 or (1 - cfg.pct_start) * length < 2:
        warm = f" ({steps.total} optimizer steps less sched.warmup_epochs' {steps.warmup})" if steps.warmup else ""
        fix = ("train more steps (trainer.max_epochs, a smaller data.batch_size)" if length < 4 else
               f"set sched.pct_start between {2 / length:.3g} and {1 - 2 / length:.3g}")
        raise ConfigError(f"sched.pct_start={cfg.pct_start} leaves a phase under 2 steps of the {length}-step "
                          f"one-cycle schedule{warm}: {fix}" + (", or sched.warmup_epochs=0" if steps.warmup else ""))
    return OneCycleLR(max_learning_rate=base_lr * cfg.max_lr_factor, total_steps=length,
                      phase_pct=float(cfg.pct_start), end_learning_rate=cfg.min_lr)


@SCHEDULERS.register("step")
def step(cfg: SchedConfig, base_lr: float, steps: ScheduleSteps) -> LRScheduler:
    """Multiply by ``sched.gamma`` every ``sched.step_size`` epochs."""
    epochs = list(range(cfg.step_size, -(-steps.total // steps.per_epoch), cfg.step_size))
    return _drops_at_epochs(epochs, "sched.step_size", cfg.gamma, base_lr, steps)


@SCHEDULERS.register("multistep")
def multistep(cfg: SchedConfig, base_lr: float, steps: ScheduleSteps) -> LRScheduler:
    """Multiply by ``sched.gamma`` when each epoch of ``sched.milestones`` starts."""
    milestones = list(cfg.milestones)  # strictly increasing: validation.py
    return _drops_at_epochs(milestones, "sched.milestones", cfg.gamma, base_lr, steps)


def _drops_at_epochs(epochs: Sequence[int], key: str, gamma: float, base_lr: float,
                     steps: ScheduleSteps) -> LRScheduler:
    # The schedule counts from the end of warmup, so shift the absolute epochs back by the warmup.
    at = [e * steps.per_epoch - steps.warmup for e in epochs]
    if at and at[0] <= 0:
        raise ConfigError(f"{key}: a drop at epoch {epochs[0]} falls inside the warmup; shorten sched.warmup_epochs")
    if not at:  # no drop within the run
        return LambdaDecay(base_lr, lambda step: 1.0)
    return MultiStepDecay(base_lr, milestones=at, gamma=gamma)
