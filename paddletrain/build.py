"""The composition root: a validated config becomes a model, data, loss, optimizer, schedule, precision,
callbacks and a :class:`~paddletrain.engine.trainer.Trainer`.

``fit`` builds through here, and so do the examples and the tests; the commands that read a run back
(``evaluate``, ``export``, ``predict``, ``ship``) build through :mod:`paddletrain.rebuild`, which shares the
builders below (:func:`task_parts`: the loss and the meters). The Trainer receives built objects and never reads
a config. Each component's builder lives beside the component (``data.bundle.build_data``,
``models.factory.build_model``, ``optim.build_optimization``, ``losses.build_loss``, ...); :func:`build_run` calls
them in order and hands each what the earlier ones built.

    run = build_run(cfg, run_dir)            # everything, nothing started
    run.trainer.fit(run.train_loader, run.val_loader, ckpt_path=run.resume_from)

or, with the run directory locked and ``summary.json`` written: ``train(cfg, run_dir)``.
"""
from __future__ import annotations

import copy
import logging
import warnings
from collections.abc import Callable, Sequence
from contextlib import nullcontext
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import paddle
from hydra.core.hydra_config import HydraConfig
from hydra.core.override_parser.overrides_parser import OverridesParser
from omegaconf import DictConfig, OmegaConf

from paddletrain._moved import forward_names
from paddletrain.callbacks.heartbeat import heartbeat_callbacks
from paddletrain.callbacks.instantiate import instantiate_callbacks
from paddletrain.config import (
    DataConfig,
    factory_options,
)
from paddletrain.data.loading.bundle import DataBundle, anchored_paths, build_data
from paddletrain.data.transforms.mixup import Mixup
from paddletrain.data.transforms.presets import eval_image_size
from paddletrain.distill import build_distiller
from paddletrain.engine.callback import Callback
from paddletrain.engine.limits import Limits
from paddletrain.engine.precision import Precision
from paddletrain.engine.resume import is_legacy_checkpoint, load_resume_checkpoint, warm_start_from_legacy
from paddletrain.engine.summary import TrainingArithmetic, write_summary
from paddletrain.engine.trainer import Trainer, count_batches
from paddletrain.errors import TrainingInterrupted
from paddletrain.job import distributed
from paddletrain.job.rundir import holding_run_dir
from paddletrain.job.runtime import seed_everything, setup_runtime
from paddletrain.losses import build_loss
from paddletrain.metrics.multilabel import task_meters
from paddletrain.models.conv_backward import use_conv_input_grad
from paddletrain.models.factory import build_model
from paddletrain.models.flops import training_arithmetic
from paddletrain.models.tta import TestTimeAugmentation
from paddletrain.models.weights import describe
from paddletrain.optim import build_optimization
from paddletrain.validation import DEFAULT_MONITOR, validate_once

__all__ = ["DataBundle", "Run", "build_callbacks", "build_data", "build_model", "build_run", "command_line_overrides",
           "monitored_metric", "resolve_preprocessing", "resolve_task", "run_hparams", "saves_checkpoints",
           "task_parts", "train"]

# Reading a run back moved to paddletrain.rebuild (0.2.0): its names are handed on from here, with a warning.
__getattr__ = forward_names("paddletrain.build", "paddletrain.rebuild")

log = logging.getLogger("paddletrain")


# data keys that null hands to the pretrained weights; without weights (or without that value) the schema
# default applies.
PREPROCESSING_FROM_WEIGHTS = ("image_size", "interpolation", "mean", "std")


def resolve_preprocessing(cfg: DictConfig) -> DictConfig:
    """``cfg`` with every null ``data.image_size/interpolation/mean/std`` filled from ``model.pretrained``.

    Values set in the config always win. A size taken from the weights also takes their crop ratio for
    ``data.eval_resize`` when that is null.
    """
    unset = [key for key in PREPROCESSING_FROM_WEIGHTS if cfg.data.get(key) is None]
    if not unset:
        return cfg
    weights: dict[str, Any] = describe(cfg.model.pretrained).preprocessing if cfg.model.pretrained else {}
    found = {"image_size": weights["input_size"][-1] if weights.get("input_size") else None,
             "interpolation": weights.get("interpolation"),
             "mean": list(weights["mean"]) if weights.get("mean") else None,
             "std": list(weights["std"]) if weights.get("std") else None}
    defaults = DataConfig()
    resolved = copy.deepcopy(cfg)
    for key in unset:
        from_weights = found[key] is not None
        resolved.data[key] = found[key] if from_weights else getattr(defaults, key)
        log.info("data.%s=%s (from %s)", key, resolved.data[key],
                 cfg.model.pretrained if from_weights else "the schema default")
    if "image_size" in unset and found["image_size"] and weights.get("crop_pct") and cfg.data.eval_resize is None:
        resolved.data.eval_resize = int(round(found["image_size"] / weights["crop_pct"]))
    return resolved


# The headline metric of a multi-label run, monitored when the config keeps the single-label default.
MULTILABEL_MONITOR = "val/mAP"


def monitored_metric(cfg: DictConfig) -> str:
    """The metric the run monitors: ``monitor``, except that a multi-label run left at the single-label default
    (``val/top1``, which it does not have) monitors ``val/mAP``."""
    return MULTILABEL_MONITOR if cfg.data.multilabel and cfg.monitor == DEFAULT_MONITOR else cfg.monitor


def resolve_task(cfg: DictConfig) -> DictConfig:
    """``cfg`` with ``monitor`` set to :func:`monitored_metric`; the callbacks that follow ``${monitor}`` follow it."""
    monitor = monitored_metric(cfg)
    if monitor == cfg.monitor:
        return cfg
    resolved = copy.deepcopy(cfg)
    resolved.monitor = monitor
    log.info("monitor=%s (data.multilabel=true has no %s)", monitor, cfg.monitor)
    return resolved


def build_callbacks(cfg: DictConfig) -> list[Callback]:
    """The ``callbacks`` config node, each entry built once (see :mod:`paddletrain.callbacks.instantiate`)."""
    return instantiate_callbacks(cfg.get("callbacks") or {})


def saves_checkpoints(cfg: DictConfig) -> bool:
    """Whether the run's callbacks write checkpoints (a stop request then saves one)."""
    return (cfg.get("callbacks") or {}).get("checkpoint") is not None


# Keys every run is compared by (VisualDL's hyper-parameter views), after those set on the command line.
KEY_HPARAMS = ("model.name", "data.name", "optim.name", "optim.lr", "data.batch_size", "trainer.max_epochs")
# Command-line keys that say where or how a run executes, not what it learns: not hyper-parameters.
_RUN_PLUMBING = ("hydra", "name", "tags", "imports", "trainer.resume", "trainer.device", "trainer.cpu_threads",
                 "trainer.node_rank", "trainer.master", "trainer.trust_pickle", "model.trust_pickle", "data.root",
                 "data.download", "data.num_workers", "data.use_shared_memory", "data.persistent_workers",
                 "callbacks.progress_bar", "callbacks.visualdl", "callbacks.checkpoint",
                 "trainer.distill.unlabeled_root", "trainer.distill.trust_pickle", "trainer.max_restarts",
                 "trainer.collective_timeout", "callbacks.optuna_pruning",
                 # where and how the run executes: the same run on 1 or 2 devices is one point of a comparison
                 "trainer.devices", "trainer.num_nodes", "trainer.cluster", "trainer.find_unused_parameters",
                 "data.eval_batch_size", "data.cache_dir", "data.cache_max_gb", "data.fetch_ahead", "data.timeout",
                 "data.retries", "data.deadline")
_ABSENT = object()


def command_line_overrides() -> list[str]:
    """The running Hydra job's command-line overrides (``.hydra/overrides.yaml``); none outside a Hydra app."""
    return list(HydraConfig.get().overrides.task) if HydraConfig.initialized() else []


def run_hparams(cfg: DictConfig, overrides: Sequence[str] | None = None) -> dict[str, Any]:
    """The hyper-parameters loggers compare runs by, most important first: the keys ``overrides`` set
    (default: :func:`command_line_overrides`), then :data:`KEY_HPARAMS`; dotted key -> resolved value.

    A config group chosen on the command line (``optim=sgd``) counts as its ``name`` (``optim.name``), or as the
    choice when the group has no name (``+experiment=x``); deletions and run plumbing (paths, devices, logging,
    resume; :data:`_RUN_PLUMBING`) are left out.
    """
    overrides = command_line_overrides() if overrides is None else list(overrides)
    picked: dict[str, Any] = {}
    for override in OverridesParser.create().parse_overrides(overrides):
        key = override.key_or_group
        if override.is_delete() or override.package or any(key == p or key.startswith(p + ".")
                                                           for p in _RUN_PLUMBING):
            continue
        value = OmegaConf.select(cfg, key, default=_ABSENT)
        if isinstance(value, DictConfig):
            if "name" not in value:
                continue
            key, value = f"{key}.name", value.name
        elif value is _ABSENT:
            value = override.get_value_element_as_str()
        picked[key] = OmegaConf.to_container(value, resolve=True) if OmegaConf.is_config(value) else value
    for key in KEY_HPARAMS:
        picked.setdefault(key, OmegaConf.select(cfg, key))
    return picked


@dataclass
class Run:
    """A built training run: call ``trainer.fit(train_loader, val_loader, ckpt_path=resume_from)``."""

    trainer: Trainer
    train_loader: Any
    val_loader: Any
    resume_from: Any
    config: DictConfig
    # The arithmetic of training: FLOPs of one image's step, and images in an epoch on all ranks (None: unknown).
    arithmetic: TrainingArithmetic | None = None


def task_parts(cfg: DictConfig, data: DataBundle, loss_options: dict[str, Any],
               world_size: int = 1) -> tuple[Callable[..., Any], Callable[[str], Any]]:
    """The task's loss and meters, as ``fit`` trains and validates with them and ``evaluate`` scores with them:
    the loss of ``cfg.loss`` for the data's classes (single- or multi-label) and ``meters(stage)``."""
    multilabel = bool(cfg.data.multilabel)
    num_classes = cfg.model.num_classes or len(data.classes)
    loss_fn = build_loss(cfg.loss, num_classes=num_classes, class_counts=data.class_counts, classes=data.classes,
                         multilabel=multilabel, dataset=f"data.name={cfg.data.name}", options=loss_options)
    return loss_fn, task_meters(multilabel, num_classes, float(cfg.data.multilabel_threshold), world_size)


def build_run(cfg: DictConfig, run_dir: Path, callbacks: Sequence[Callback] = (),
              trainer_cls: type[Trainer] | None = None) -> Run:
    """Build everything a training run needs from a validated ``cfg``, in the order that fails cheapest first.

    ``callbacks`` are added after the configured ones; ``trainer_cls`` replaces the Trainer (e.g. a subclass
    with its own ``training_step``). Each component is built once, by the builder beside it; what they need of
    each other (the data's classes, the model, the device) is handed on as built objects and values.
    """
    cfg = resolve_task(resolve_preprocessing(cfg))
    hparams = run_hparams(cfg)
    configured = build_callbacks(cfg)  # their options are checked before any data or model work
    options = factory_options(cfg)  # each builder gets its factory's own keys
    t = cfg.trainer
    rank, world_size = distributed.rank(), distributed.world_size()
    runtime = setup_runtime(t.device, t.cpu_threads, deterministic=t.deterministic, data_workers=cfg.data.num_workers)
    seed_everything(t.seed + rank)  # dropout differs per rank; the data order comes from t.seed alone
    data = build_data(cfg, seed=t.seed, rank=rank, world_size=world_size, eval_crop=t.tta.crops == 1,
                      options=options["data"])
    model = build_model(cfg, len(data.classes), data.in_chans, options=options["model"])
    arithmetic = training_arithmetic(model, data.in_chans, int(cfg.data.image_size), data.train_loader,
                                     int(cfg.data.batch_size), world_size, t.limit_train_batches)
    if cfg.model.conv_input_grad:
        use_conv_input_grad(model, runtime.device)
    limits = Limits.from_config(t)
    optimizer, scheduler = build_optimization(
        cfg.optim, cfg.sched, model, count_batches(data.train_loader, limits.limit_train_batches),
        max_epochs=limits.max_epochs, accumulate=limits.accumulate_grad_batches, batch_size=cfg.data.batch_size,
        world_size=world_size, options=options)
    # What a resumed run must share with its checkpoint (model, classes) or is warned about (batch, world).
    # The classes and their training counts let `evaluate` read only the split it scores.
    facts = {"model": cfg.model.name, "num_classes": len(data.classes), "batch_size": cfg.data.batch_size,
             "world_size": world_size, "classes": list(data.classes),
             "class_counts": data.class_counts.tolist() if data.class_counts is not None else None}
    resolved = anchored_paths(OmegaConf.to_container(cfg, resolve=True))
    resume_from = None
    if t.resume and is_legacy_checkpoint(Path(t.resume)):
        warm_start_from_legacy(Path(t.resume), model, optimizer, t.trust_pickle)
    else:
        resume_from = load_resume_checkpoint(t.resume, run_dir, facts, config=resolved)
    precision = Precision.from_config(t.amp, device=runtime.device)
    num_classes = cfg.model.num_classes or len(data.classes)
    multilabel = bool(cfg.data.multilabel)
    loss_fn, meters = task_parts(cfg, data, options["loss"], world_size)
    trainer = (trainer_cls or Trainer)(
        model, optimizer, scheduler=scheduler, rank=rank, world_size=world_size,
        loss_fn=loss_fn, precision=precision,
        meters=meters,
        # Mixed targets are smoothed by loss.label_smoothing, except multi-hot ones: the multi-label loss smooths
        # those itself (paddletrain.losses).
        batch_transform=Mixup.from_config(cfg.data.mixup, num_classes, seed=t.seed, rank=rank,
                                          label_smoothing=0.0 if multilabel else cfg.loss.label_smoothing),
        distiller=build_distiller(t.get("distill"), num_classes, data.in_chans, precision, hard_loss=loss_fn),
        callbacks=[*configured, *callbacks, *heartbeat_callbacks(rank)], limits=limits,
        num_classes=len(data.classes), class_names=data.classes,
        run_dir=str(run_dir), hparams=hparams, sync_bn=cfg.model.sync_bn,
        find_unused_parameters=t.find_unused_parameters,
        checkpoint_extras={"config": resolved, "run": facts},
        eval_model=TestTimeAugmentation.around(model, t.tta, eval_image_size(cfg.data)),
    )
    return Run(trainer, data.train_loader, data.val_loader, resume_from, cfg, arithmetic)


def train(cfg: DictConfig, run_dir: Path, callbacks: Sequence[Callback] = (),
          trainer_cls: type[Trainer] | None = None) -> dict[str, float]:
    """Validate ``cfg`` (unless the entry point did, :func:`~paddletrain.validation.validate_once`), build the run,
    train it; returns the final metrics (also in ``summary.json``).

    The run directory is locked while training (a launcher holds it for its ranks). A stop request names the
    checkpoint it wrote on the :class:`~paddletrain.errors.TrainingInterrupted` it raises.
    """
    validate_once(cfg)  # before the lock: a bad value does no work in the run directory
    with nullcontext() if distributed.is_launched() else holding_run_dir(run_dir):
        run = build_run(cfg, run_dir, callbacks, trainer_cls)
        trainer = run.trainer
        try:
            metrics = trainer.fit(run.train_loader, run.val_loader, ckpt_path=run.resume_from)
        except TrainingInterrupted as exc:  # say which checkpoint the stop wrote, not whichever is newest on disk
            saved = [cb.last_path for cb in trainer.checkpoint_callbacks if cb.saves_on_interrupt]
            exc.checkpoint = str(saved[0]) if saved and saved[0] else None
            raise
        if trainer.is_main:
            write_summary(run_dir, metrics, trainer, run.arithmetic)
        distributed.barrier()
        return metrics


def test_time_augmentation(model: paddle.nn.Layer, tta: Any, data: Any) -> TestTimeAugmentation | None:
    """Deprecated, goes in 0.3.0: ``TestTimeAugmentation.around(model, tta, eval_image_size(data))``."""
    warnings.warn("paddletrain.build.test_time_augmentation is deprecated and goes in 0.3.0: use "
                  "paddletrain.models.tta.TestTimeAugmentation.around(model, tta, crop_size)", DeprecationWarning,
                  stacklevel=2)
    return TestTimeAugmentation.around(model, tta, eval_image_size(data))
