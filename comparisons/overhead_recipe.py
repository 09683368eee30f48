"""Trainer overhead on a recipe's own steps: ``python -m comparisons overhead experiment=<name>``.

The synthetic arms of :mod:`comparisons.overhead` feed both loops the same in-memory tensors. Here every arm
trains its own copy of the run ``python -m paddletrain.fit --config-dir <config_dir> +experiment=<name>`` builds
(``paddletrain.build.build_run``, so the same model with its options, loss, optimizer, schedule and training
loader with its decode and augmentation, in this process, seeded alike so that the arms see the same batches):

- ``trainer``: that run's ``Trainer.fit``, with the callbacks the recipe configures (progress line, learning
  rate, history, VisualDL, checkpoints), over its training loader, without validation. One ``fit`` runs all the
  windows: a last callback pauses it every ``steps`` batches to time the other arms' windows, so the Trainer
  pays its set-up and its callbacks' per-fit work once, as in the recipe, and not once a window.
- ``hand``: a plain Paddle loop over the second copy: next batch from the loader, forward, the run's loss,
  backward, gradient norm for the finite check, step, schedule, clear, ``float(loss)``, top-k hits on device.
- ``bare``: the same loop without the finite check and the metrics.

Windows are interleaved (trainer, hand, bare, trainer, ...) and medians of the paired ratios are reported.
"""
from __future__ import annotations

import tempfile
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from omegaconf import DictConfig

from comparisons.plain_loop import compare_with_trainer, hand_loop
from paddletrain.bench.common import device_sync, environment, finished, summarize
from paddletrain.engine.callback import Callback
from paddletrain.engine.hooks import EpochSampler, batch_sampler_of
from paddletrain.errors import ConfigError

if TYPE_CHECKING:  # pragma: no cover
    from paddletrain.build import Run
    from paddletrain.engine.trainer import Trainer

ARMS = ("trainer", "hand", "bare")
ARM_WORK = {
    "trainer": "the experiment's Trainer.fit with its configured callbacks over its training loader (no "
               "validation); one fit() for all windows, paused between them",
    "hand": "plain loop over its own copy of the run: loader, fwd, the run's loss, bwd, clip_grad_norm_ "
            "(unlimited) -> host, step if finite, scheduler.step, clear, float(loss), device loss/top-k sums",
    "bare": "the same loop without the finite check and the metrics",
}


@dataclass(frozen=True)
class ExperimentSteps:
    """What to measure: the recipe ``config_dir/experiment/<experiment>.yaml`` with the fit ``overrides`` on top,
    on ``device`` with ``cpu_threads``; the ``arms`` and their windows."""

    experiment: str
    config_dir: str
    overrides: list[str]
    arms: list[str]
    windows: int
    steps: int
    warmup: int
    cpu_threads: int | None
    device: str


def compose_experiment(cfg: ExperimentSteps) -> DictConfig:
    """The validated config ``python -m paddletrain.fit --config-dir <config_dir> +experiment=<experiment>
    <overrides>`` runs with, on this benchmark's device and threads."""
    from hydra import compose, initialize_config_module
    from hydra.errors import HydraException
    from omegaconf.errors import OmegaConfBaseException

    from paddletrain.config import register_configs
    from paddletrain.validation import validate_config

    config_dir = Path(cfg.config_dir).resolve()
    recipe = config_dir / "experiment" / f"{cfg.experiment}.yaml"
    if not recipe.is_file():
        found = sorted(p.stem for p in (config_dir / "experiment").glob("*.yaml"))
        raise ConfigError(f"bench overhead: experiment={cfg.experiment}: no {recipe}"
                          + (f"; {config_dir / 'experiment'} has {found}" if found else "; set config_dir"))
    runtime = [f"trainer.device={cfg.device}"] + ([f"trainer.cpu_threads={cfg.cpu_threads}"] if cfg.cpu_threads else [])
    overrides = [f"hydra.searchpath=[file://{config_dir}]", f"+experiment={cfg.experiment}", *runtime, *cfg.overrides]
    register_configs()
    try:
        with initialize_config_module("paddletrain.conf", version_base="1.3"):
            composed = compose("fit", overrides=overrides)
    except (HydraException, OmegaConfBaseException) as exc:
        raise ConfigError(f"bench overhead: experiment={cfg.experiment} overrides={list(cfg.overrides)}: "
                          f"{str(exc).splitlines()[0]}") from None
    validate_config(composed)
    if composed.trainer.amp.enabled:
        raise ConfigError("bench overhead: the experiment sets trainer.amp.enabled=true; the hand loop trains "
                          "in float32")
    return composed


def check_arms(cfg: ExperimentSteps) -> None:
    """Refuse options that have no meaning on an experiment's steps, naming them."""
    others = [arm for arm in cfg.arms if arm not in ARMS]
    if others:
        raise ConfigError(f"bench overhead: arms {others} do not run on an experiment's steps; "
                          f"choose from {list(ARMS)}")
    if "trainer" not in cfg.arms:
        raise ConfigError("bench overhead: with experiment= the windows are paced by the trainer arm; add it to arms")
    if cfg.warmup < 1:
        raise ConfigError("bench overhead: with experiment= warmup must be >= 1 (the first step opens the "
                          "VisualDL file and logs sample images)")


class LoaderWindows:
    """Batches of a training loader, ``steps`` at a time, across its epochs (reshuffled as the Trainer does)."""

    def __init__(self, loader: Any) -> None:
        self.loader = loader
        self.epoch = 0
        self._batches = iter(loader)

    def take(self, steps: int) -> Iterator[Any]:
        for _ in range(steps):
            try:
                yield next(self._batches)
            except StopIteration:
                self.epoch += 1
                sampler = batch_sampler_of(self.loader)
                if isinstance(sampler, EpochSampler):
                    sampler.set_epoch(self.epoch)
                self._batches = iter(self.loader)
                yield next(self._batches)


class WindowClock(Callback):
    """The last callback of the trainer arm: times its windows of ``steps`` batches and, between two of them,
    runs the other arms' windows; stops the fit after ``windows`` windows."""

    def __init__(self, others: dict[str, Callable[[int], float]], windows: int, steps: int, warmup: int) -> None:
        self.others, self.windows, self.steps, self.warmup = others, windows, steps, warmup
        self.per_step: dict[str, list[float]] = {"trainer": [], **{name: [] for name in others}}
        self.batches = 0
        self.started: float | None = None

    def on_train_batch_end(self, trainer: Trainer, output: Any, batch: Any, batch_idx: int) -> None:
        self.batches += 1
        done = self.batches - self.warmup
        if done < 0 or done % self.steps:
            return
        device_sync()
        if self.started is not None:
            self.per_step["trainer"].append((time.perf_counter() - self.started) / self.steps)
        for name, run in self.others.items():
            if self.started is None:
                run(self.warmup)  # each arm's own warm-up, after the trainer's
            else:
                self.per_step[name].append(run(self.steps) / self.steps)
        if len(self.per_step["trainer"]) >= self.windows:
            trainer.should_stop = True
        self.started = time.perf_counter()


def _hand_arm(run: Run, equivalent_work: bool) -> Callable[[int], float]:
    """A plain loop over ``run``'s own model, loss, optimizer, schedule and training loader."""
    trainer = run.trainer
    if trainer.batch_transform is not None or trainer.distiller is not None:
        raise ConfigError("bench overhead: the experiment mixes batches (data.mixup) or distils "
                          "(trainer.distill); the hand loop does neither, so its steps would not be the recipe's")
    return hand_loop(trainer.module, trainer.optimizer, trainer.loss_fn, trainer.num_classes,
                     LoaderWindows(run.train_loader).take, scheduler=trainer.scheduler,
                     equivalent_work=equivalent_work)


def run_experiment_overhead(cfg: ExperimentSteps) -> dict[str, Any]:
    """Median ms/step of each arm on the experiment's own steps, and the Trainer's ratios to the loops."""
    from paddletrain.build import build_run
    from paddletrain.job.runtime import setup_runtime

    check_arms(cfg)
    composed = compose_experiment(cfg)
    runtime = setup_runtime(cfg.device, cfg.cpu_threads)
    env = environment(runtime.cpu_threads)
    with tempfile.TemporaryDirectory(prefix="overhead-") as tmp:
        loops = {name: _hand_arm(build_run(composed, Path(tmp) / name), name == "hand")
                 for name in cfg.arms if name != "trainer"}
        clock = WindowClock(loops, cfg.windows, cfg.steps, cfg.warmup)
        trainer_run = build_run(composed, Path(tmp) / "trainer", callbacks=[clock])
        trainer_run.trainer.fit(trainer_run.train_loader)
        trainer = trainer_run.trainer
        data_wait, trainer_steps = trainer.run_throughput.data_share, trainer.global_step
    per_step = {name: times for name, times in clock.per_step.items() if name in cfg.arms}
    if len(per_step["trainer"]) < cfg.windows:
        raise ConfigError(f"bench overhead: the experiment's run ended after {clock.batches} batches; "
                          f"warmup + windows x steps = {cfg.warmup + cfg.windows * cfg.steps}")
    batch_size = int(composed.data.batch_size)
    rows = [{"arm": name, "model": composed.model.name, "batch_size": batch_size, **summarize(times, batch_size)}
            for name, times in per_step.items()]
    summary, goals = compare_with_trainer(per_step)
    # The Trainer's own measure of its loader wait, over the warm-up and the windows.
    summary["trainer_data_wait_share"] = data_wait
    recipe = {"experiment": cfg.experiment, "model": composed.model.name, "width": composed.model.get("width"),
              "conv_input_grad": composed.model.get("conv_input_grad"), "batch_size": batch_size,
              "image_size": composed.data.image_size, "augment": [a.name for a in composed.data.augment or []],
              "callbacks": sorted(k for k, v in (composed.callbacks or {}).items() if v is not None),
              "trainer_steps": trainer_steps}
    return {"benchmark": "overhead", "environment": finished(env), "recipe": recipe,
            "rows": rows, "summary": summary, "trainer_parts_us": {}, "goals": goals,
            "notes": [f"{name}: {ARM_WORK[name]}" for name in cfg.arms]}
