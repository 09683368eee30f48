"""The composition root: a validated config becomes a model, data, loss, optimizer, schedule, precision,
callbacks and a :class:`~paddletrain.engine.trainer.Trainer`.

Every command line (``fit``, ``evaluate``, ``export``, ``predict``, ``ship``) builds through here, ``fit`` from
its config, the others from the config saved in a checkpoint (:func:`checkpoint_model`,
:func:`rebuild_checkpoint`); the examples and the tests too. The Trainer receives built objects and never reads
a config.

    run = build_run(cfg, run_dir)            # everything, nothing started
    run.trainer.fit(run.train_loader, run.val_loader, ckpt_path=run.resume_from)

or, with the run directory locked and ``summary.json`` written: ``train(cfg, run_dir)``.
"""
from __future__ import annotations

import copy
import logging
import os
from collections.abc import Callable, Sequence
from contextlib import nullcontext
from dataclasses import dataclass, fields
from pathlib import Path
from typing import Any

import numpy as np
import paddle
from hydra.core.hydra_config import HydraConfig
from hydra.core.override_parser.overrides_parser import OverridesParser
from omegaconf import DictConfig, OmegaConf

from paddletrain.callbacks.heartbeat import Heartbeat
from paddletrain.callbacks.instantiate import instantiate_callbacks
from paddletrain.checkpoint import Checkpoint, load_checkpoint
from paddletrain.checkpoint.locate import locate_checkpoint
from paddletrain.config import (
    COMPONENT_GROUPS,
    SCHEMAS,
    DataConfig,
    EvaluateConfig,
    FitConfig,
    ModelConfig,
    check_values,
    component_options,
)
from paddletrain.data import DatasetError, build_datasets, build_loader, build_transform, preprocessing_info
from paddletrain.data.balance import class_balanced_weights, class_counts, dataset_targets
from paddletrain.data.holdout import hold_out_by_config
from paddletrain.data.mixup import Mixup
from paddletrain.data.transforms import eval_image_size
from paddletrain.data.unlabeled import with_unlabeled
from paddletrain.distill import Distiller
from paddletrain.engine.callback import Callback
from paddletrain.engine.limits import Limits
from paddletrain.engine.precision import Precision
from paddletrain.engine.resume import is_legacy_checkpoint, load_resume_checkpoint, warm_start_from_legacy
from paddletrain.engine.state_checks import check_state_matches
from paddletrain.engine.summary import write_summary
from paddletrain.engine.trainer import Trainer, count_batches
from paddletrain.errors import ConfigError, TrainingInterrupted, UserError
from paddletrain.job import distributed
from paddletrain.job.rundir import holding_run_dir
from paddletrain.job.runtime import seed_everything, setup_runtime
from paddletrain.losses import LossFn, build_loss
from paddletrain.metrics.multilabel import LossMeter, MultiLabelMeter, MultiLabelReport
from paddletrain.models import create_model
from paddletrain.models.tta import TestTimeAugmentation
from paddletrain.models.weights import describe
from paddletrain.optim import build_optimizer, run_lr
from paddletrain.plugins import prepare
from paddletrain.schedules import build_scheduler, optimizer_steps_per_epoch, schedule_steps
from paddletrain.validation import DEFAULT_MONITOR, validate_config, validate_once

log = logging.getLogger("paddletrain")


@dataclass
class DataBundle:
    """What the data config builds: loaders plus what the model must know about the data.

    ``class_counts``: training samples per class of the model (None when the dataset has no ``targets``), counted
    once here for ``data.sampler=class_balanced`` and ``loss.class_weights=balanced``.
    """

    train_loader: Any
    val_loader: Any
    classes: list[str]
    in_chans: int
    class_counts: np.ndarray | None = None


def build_data(cfg: DictConfig, seed: int, rank: int = 0, world_size: int = 1, eval_crop: bool = True,
               training: bool = True, eval_split: str = "val") -> DataBundle:
    """Datasets, transforms and loaders from the ``data`` config.

    ``eval_crop=False``: evaluation images keep the ``eval_resize`` square (multi-crop test-time augmentation).
    ``training=False``: only evaluation is coming, so ``trainer.distill.unlabeled_root`` is not read.
    ``eval_split="test"``: the evaluation loader reads the test split, which exists when ``data.holdout`` held
    the validation split out of the training split.
    """
    # Transforms need the channel count the dataset reports, so the loaders apply them (per seeded sample).
    splits = hold_out_by_config(build_datasets(cfg.data), cfg.data)
    if eval_split == "test":
        if splits.test is None:
            raise UserError(f"split=test: data.name={cfg.data.name} has no test split apart from its validation "
                            "split, because data.holdout is 0 (the run validated on the dataset's own validation "
                            "split); evaluate split=val")
        splits.val = splits.test
    elif splits.test is not None and training:
        log.info("data.holdout=%g: %d training images, %d validation images held out of them (data.holdout_seed=%d), "
                 "%d test images (evaluate split=test)", cfg.data.holdout, len(splits.train), len(splits.val),
                 cfg.data.holdout_seed, len(splits.test))
    unlabeled = (cfg.trainer.get("distill") or {}).get("unlabeled_root")
    if unlabeled and training:  # label-free distillation (SSLD) learns from these too
        splits.train = with_unlabeled(splits.train, unlabeled, splits.in_chans)
    train_tf = build_transform(cfg.data, train=True, in_chans=splits.in_chans)
    eval_tf = build_transform(cfg.data, train=False, in_chans=splits.in_chans, crop=eval_crop)
    if len(splits.train) == 0:
        raise UserError(f"data.name={cfg.data.name}: the training split is empty")
    num_classes = cfg.model.num_classes
    if num_classes is not None and num_classes < len(splits.classes):
        raise UserError(f"model.num_classes={num_classes} is smaller than the {len(splits.classes)} classes "
                        f"of data.name={cfg.data.name}")
    if num_classes is not None and cfg.data.multilabel and num_classes != len(splits.classes):
        raise UserError(f"model.num_classes={num_classes} differs from the {len(splits.classes)} classes of the "
                        "multi-label lists (data.multilabel=true: one logit per multi-hot column); leave it null")
    per_rank = -(-len(splits.train) // world_size)
    if cfg.data.drop_last and per_rank < cfg.data.batch_size:
        raise UserError(f"data.batch_size={cfg.data.batch_size} is larger than the {per_rank} training samples each "
                        f"of the {world_size} process(es) gets from data.name={cfg.data.name}: with "
                        "data.drop_last=true no training step would run. Lower data.batch_size.")
    targets = dataset_targets(splits.train)
    counts = class_counts(targets, num_classes or len(splits.classes)) if targets is not None else None
    weights = None
    if cfg.data.get("sampler") == "class_balanced" and targets is not None:
        weights = class_balanced_weights(targets, counts)
        if training:
            log.info("data.sampler=class_balanced: %d classes with %d to %d training samples, each drawn about "
                     "%.1f times per epoch", len(counts), counts.min(), counts.max(), len(targets) / len(counts))
    train_loader = build_loader(splits.train, cfg.data, train=True, seed=seed, num_replicas=world_size, rank=rank,
                                transform=train_tf, sample_weights=weights)
    val_loader = build_loader(splits.val, cfg.data, train=False, seed=seed, num_replicas=world_size, rank=rank,
                              transform=eval_tf)
    return DataBundle(train_loader, val_loader, list(splits.classes), splits.in_chans, counts)


# Model options passed to the builder only when the config changes them, so a user's builder need not take them.
_MODEL_OPTIONS = {"width": 1.0, "drop_rate": 0.0, "drop_path_rate": 0.0, "zero_init_residual": False,
                  "data_format": "NCHW"}


def build_model(cfg: DictConfig, num_classes: int, in_chans: int) -> paddle.nn.Layer:
    """The model from the ``model`` config; ``num_classes``/``in_chans`` are the data's, unless the config sets them.

    ``model.arch`` is passed only when set (``model=vision``); options the weights need (e.g. PaddleClas'
    first-block projection shortcut) come from the weight source, inside :func:`create_model`.
    """
    m = cfg.model
    options: dict[str, Any] = {"arch": m.arch} if m.arch else {}
    options.update({key: m[key] for key, default in _MODEL_OPTIONS.items() if m[key] != default})
    options.update(component_options(m, ModelConfig))  # the builder's own (model.<option>=...)
    return create_model(
        m.name,
        num_classes=m.num_classes if m.num_classes is not None else num_classes,
        in_chans=m.in_chans if m.in_chans is not None else in_chans,
        pretrained=m.pretrained,
        strict=m.strict,
        trust_pickle=m.trust_pickle,
        **options,
    )


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


def build_limits(cfg: DictConfig) -> Limits:
    """The loop's :class:`~paddletrain.engine.limits.Limits` from the ``trainer`` keys of the same names."""
    return Limits(**{field.name: cfg.trainer[field.name] for field in fields(Limits)})


def build_optimization(cfg: DictConfig, model: paddle.nn.Layer, train_loader: Any, limits: Limits,
                       world_size: int = 1) -> tuple[paddle.optimizer.Optimizer, paddle.optimizer.lr.LRScheduler]:
    """The optimizer and its schedule, whose length is the run's optimizer steps (the loop's own count under
    ``limits``)."""
    accumulate = limits.accumulate_grad_batches
    per_epoch = optimizer_steps_per_epoch(count_batches(train_loader, limits.limit_train_batches), accumulate)
    steps = schedule_steps(per_epoch, limits.max_epochs, cfg.sched.warmup_epochs)
    global_batch = cfg.data.batch_size * world_size * accumulate
    lr = run_lr(cfg.optim, global_batch)
    log.info("Global batch %d (%d per process x %d process(es) x %d accumulation), learning rate %g%s, "
             "%d optimizer steps", global_batch, cfg.data.batch_size, world_size, accumulate, lr,
             f" (optim.lr={cfg.optim.lr:g} scaled by {global_batch}/{cfg.optim.base_batch_size})"
             if cfg.optim.scale_lr else "", steps.total)
    scheduler = build_scheduler(cfg.sched, lr, steps)
    return build_optimizer(model, cfg.optim, scheduler), scheduler


def build_mixup(cfg: DictConfig, num_classes: int, seed: int, rank: int = 0) -> Mixup | None:
    """Mixup/CutMix from ``data.mixup`` (None when off); its targets are smoothed by ``loss.label_smoothing``,
    except multi-hot ones, which the multi-label loss smooths (:mod:`paddletrain.losses`)."""
    smoothing = 0.0 if cfg.data.multilabel else cfg.loss.label_smoothing
    return Mixup.from_config(cfg.data.mixup, num_classes, label_smoothing=smoothing, seed=seed, rank=rank)


def build_criterion(cfg: DictConfig, data: DataBundle | None = None) -> LossFn:
    """The loss of ``loss`` for this run's task (multi-hot targets with ``data.multilabel``), with
    ``loss.class_weights`` resolved against ``data``'s classes and training counts."""
    if cfg.loss.get("class_weights") == "balanced" and (data is None or data.class_counts is None):
        raise ConfigError(f"loss.class_weights=balanced needs the label of every training sample, but "
                          f"data.name={cfg.data.name} exposes no `targets`: give loss.class_weights as a list")
    classes = data.classes if data is not None else None
    return build_loss(cfg.loss, num_classes=cfg.model.num_classes or (len(classes) if classes else None),
                      class_counts=data.class_counts if data is not None else None, classes=classes,
                      multilabel=bool(cfg.data.multilabel))


def build_meters(cfg: DictConfig, num_classes: int, world_size: int = 1) -> Callable[[str], Any] | None:
    """The Trainer's meters for the task: None (its top-k default) for single-label data; for multi-label data the
    loss alone in training and mAP / F1 at ``data.multilabel_threshold`` in validation, gathered from every rank."""
    if not cfg.data.multilabel:
        return None
    threshold = float(cfg.data.multilabel_threshold)

    def meters(stage: str) -> LossMeter | MultiLabelMeter:
        return LossMeter(num_classes) if stage == "train" else MultiLabelMeter(num_classes, threshold, world_size)

    return meters


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


def build_distiller(cfg: DictConfig, num_classes: int, in_chans: int, precision: Precision,
                    hard_loss: Any = None) -> Distiller | None:
    """The frozen teacher of ``trainer.distill`` and its loss (None when ``teacher`` is null).

    The teacher is built like the student (registry name + weight source) with the student's classes; its
    hard-label term is ``hard_loss`` (default: the configured ``loss``).
    """
    d = cfg.trainer.get("distill")
    if d is None or not d.teacher:
        return None
    options = OmegaConf.to_container(d.teacher_options, resolve=True) if d.teacher_options else {}
    teacher = create_model(d.teacher, num_classes=num_classes, in_chans=in_chans, pretrained=d.pretrained,
                           strict=True, trust_pickle=d.trust_pickle, **options)
    if precision.amp_active and precision.level == "O2":  # O2 autocast expects low-precision weights
        teacher = paddle.amp.decorate(models=teacher, level="O2", dtype=precision.dtype)
    log.info("Distilling from the teacher %s (%s), kind=%s", d.teacher, d.pretrained, d.kind)
    return Distiller(teacher, kind=d.kind, alpha=d.alpha, temperature=d.temperature,
                     hard_loss=hard_loss or build_criterion(cfg), precision=precision)


def build_precision(cfg: DictConfig, device: str) -> Precision:
    """fp32 or AMP from ``trainer.amp``, for ``device``."""
    return Precision.from_config(cfg.trainer.amp, device=device)


def build_callbacks(cfg: DictConfig) -> list[Callback]:
    """The ``callbacks`` config node, each entry built once (see :mod:`paddletrain.callbacks.instantiate`)."""
    return instantiate_callbacks(cfg.get("callbacks") or {})


def heartbeat(rank: int) -> list[Callback]:
    """The watchdog's heartbeat (:mod:`paddletrain.job.watchdog`) for a rank that paddletrain's launcher supervises."""
    log_dir = os.environ.get("PADDLE_LOG_DIR")
    if not (distributed.is_launched() and distributed.under_paddletrain_launcher() and log_dir):
        return []
    return [Heartbeat(log_dir, rank)]


def saves_checkpoints(cfg: DictConfig) -> bool:
    """Whether the run's callbacks write checkpoints (a stop request then saves one)."""
    return (cfg.get("callbacks") or {}).get("checkpoint") is not None


def run_facts(cfg: DictConfig, num_classes: int, world_size: int) -> dict[str, Any]:
    """What a resumed run must share with its checkpoint (model, classes) or is warned about (batch, world)."""
    return {"model": cfg.model.name, "num_classes": num_classes, "batch_size": cfg.data.batch_size,
            "world_size": world_size}


# Keys every run is compared by (VisualDL's hyper-parameter views), after those set on the command line.
KEY_HPARAMS = ("model.name", "data.name", "optim.name", "optim.lr", "data.batch_size", "trainer.max_epochs")
# Command-line keys that say where or how a run executes, not what it learns: not hyper-parameters.
_RUN_PLUMBING = ("hydra", "name", "tags", "imports", "trainer.resume", "trainer.device", "trainer.cpu_threads",
                 "trainer.node_rank", "trainer.master", "trainer.trust_pickle", "model.trust_pickle", "data.root",
                 "data.download", "data.num_workers", "data.use_shared_memory", "data.persistent_workers",
                 "callbacks.progress_bar", "callbacks.visualdl", "callbacks.checkpoint",
                 "trainer.distill.unlabeled_root", "trainer.distill.trust_pickle", "trainer.max_restarts",
                 "trainer.collective_timeout", "callbacks.optuna_pruning")
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


def build_run(cfg: DictConfig, run_dir: Path, callbacks: Sequence[Callback] = (),
              trainer_cls: type[Trainer] | None = None) -> Run:
    """Build everything a training run needs from a validated ``cfg``, in the order that fails cheapest first.

    ``callbacks`` are added after the configured ones; ``trainer_cls`` replaces the Trainer (e.g. a subclass
    with its own ``training_step``).
    """
    cfg = resolve_task(resolve_preprocessing(cfg))
    t = cfg.trainer
    rank, world_size = distributed.rank(), distributed.world_size()
    configured = build_callbacks(cfg)  # their options are checked before any data or model work
    runtime = setup_runtime(t.device, t.cpu_threads, deterministic=t.deterministic, data_workers=cfg.data.num_workers)
    seed_everything(t.seed + rank)  # dropout differs per rank; the data order comes from t.seed alone
    data = build_data(cfg, seed=t.seed, rank=rank, world_size=world_size)
    model = build_model(cfg, len(data.classes), data.in_chans)
    limits = build_limits(cfg)
    optimizer, scheduler = build_optimization(cfg, model, data.train_loader, limits, world_size)
    facts = run_facts(cfg, len(data.classes), world_size)
    resolved = OmegaConf.to_container(cfg, resolve=True)
    resume_from = None
    if t.resume and is_legacy_checkpoint(Path(t.resume)):
        warm_start_from_legacy(Path(t.resume), model, optimizer, t.trust_pickle)
    else:
        resume_from = load_resume_checkpoint(t.resume, run_dir, facts, config=resolved)
    precision = build_precision(cfg, runtime.device)
    num_classes = cfg.model.num_classes or len(data.classes)
    loss_fn = build_criterion(cfg, data)
    trainer = (trainer_cls or Trainer)(
        model, optimizer, scheduler=scheduler, rank=rank, world_size=world_size,
        loss_fn=loss_fn, precision=precision, meters=build_meters(cfg, num_classes, world_size),
        batch_transform=build_mixup(cfg, num_classes, seed=t.seed, rank=rank),
        distiller=build_distiller(cfg, num_classes, data.in_chans, precision, hard_loss=loss_fn),
        callbacks=[*configured, *callbacks, *heartbeat(rank)], limits=limits, num_classes=len(data.classes),
        class_names=data.classes,
        run_dir=str(run_dir), hparams=run_hparams(cfg), sync_bn=cfg.model.sync_bn,
        find_unused_parameters=t.find_unused_parameters,
        checkpoint_extras={"config": resolved, "run": facts},
    )
    return Run(trainer, data.train_loader, data.val_loader, resume_from, cfg)


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
            write_summary(run_dir, metrics, trainer)
        distributed.barrier()
        return metrics


def checkpoint_config(saved: Any, overrides: Sequence[str] = (), base: DictConfig | None = None,
                      source: str = "the checkpoint") -> DictConfig:
    """The training config ``saved`` in a checkpoint, on top of ``base`` (default: the fit schema's defaults),
    with the dotlist ``overrides`` on top of it; pretrained weights are not fetched again.

    Keys of this version's schema only; a saved value the schema refuses is one error naming it.
    """
    if not saved or not isinstance(saved, dict):
        raise UserError(f"{source} holds no config; it was not written by paddletrain.fit")
    base = base if base is not None else OmegaConf.structured(FitConfig)
    known = set(base.keys())  # `in` would skip the schema's mandatory (missing) groups
    saved = {k: v for k, v in saved.items() if k in known}
    # A component group may hold its factory's own options beside the schema's keys: merged after the schema's.
    options = {group: component_options(OmegaConf.create(saved[group]), SCHEMAS[group])
               for group in COMPONENT_GROUPS if isinstance(saved.get(group), dict)}
    saved = {k: ({key: v for key, v in value.items() if key not in options.get(k, {})} if k in options else value)
             for k, value in saved.items()}
    try:
        cfg = OmegaConf.merge(base, saved)
        for group, extra in options.items():
            OmegaConf.set_struct(cfg[group], False)  # open this node (config.register_configs stores it so)
            for key, value in extra.items():
                cfg[group][key] = value
        cfg = OmegaConf.merge(cfg, OmegaConf.from_dotlist(list(overrides)))
    except Exception as exc:  # omegaconf's ValidationError/ConfigKeyError name the key
        raise UserError(f"the config saved in {source} does not match this paddletrain version's schema: "
                        f"{exc}") from None
    cfg.model.pretrained = None  # the checkpoint's weights replace any pretrained ones
    return cfg


def checkpoint_model(cfg: DictConfig, state: Any, num_classes: int, in_chans: int,
                     source: str = "the checkpoint") -> paddle.nn.Layer:
    """The model of ``cfg`` with the weights of a checkpoint's ``state``; any key that does not fit is refused."""
    if not isinstance(state, dict) or "model" not in state:
        raise UserError(f"{source} holds no model weights (no 'model' entry)")
    model = build_model(cfg, num_classes, in_chans)
    try:
        check_state_matches(model, state["model"])
    except UserError as exc:
        raise UserError(f"{source}: {exc}") from None
    model.set_state_dict(state["model"])
    return model


@dataclass
class RebuiltCheckpoint:
    """A checkpoint's model as trained, the model to export, and the data they were trained on."""

    model: paddle.nn.Layer
    exportable: paddle.nn.Layer
    splits: Any
    eval_transform: Any
    preprocessing: dict
    # A multi-label model's decision threshold (data.multilabel_threshold); None for a single-label one.
    multilabel_threshold: float | None = None


def rebuild_checkpoint(checkpoint_spec: str | Path, data_root: str | None = None,
                       imports: Sequence[str] = ()) -> RebuiltCheckpoint:
    """A checkpoint's model and data, rebuilt from the config saved in it, for export and the ship report.

    ``checkpoint_spec`` as :func:`~paddletrain.checkpoint.locate.locate_checkpoint` takes it; ``data_root``
    where its dataset is now, if it moved; ``imports`` modules to import besides the checkpoint's own.
    """
    checkpoint_dir = locate_checkpoint(checkpoint_spec)
    checkpoint = load_checkpoint(checkpoint_dir)
    prepare({"imports": list(imports)}, checkpoint)  # the checkpoint's `imports` and these
    source = f"checkpoint={checkpoint_dir}"
    cfg = checkpoint_config(checkpoint.state.get("config"), source=source)
    if data_root is not None:
        cfg.data.root = data_root
    validate_config(cfg, use="export")
    try:
        splits = build_datasets(cfg.data)
        eval_tf = build_transform(cfg.data, train=False, in_chans=splits.in_chans)
    except DatasetError as exc:
        raise UserError(f"cannot open the checkpoint's dataset ({exc}); if it moved, pass data_root=<dir>") from exc
    model = checkpoint_model(cfg, checkpoint.state, len(splits.classes), splits.in_chans, source)
    exportable = model
    if cfg.model.data_format != "NCHW":
        # oneDNN in Paddle Inference 3.3 cannot run NHWC convolutions; weights do not depend on the layout,
        # so the NCHW twin is exported and the parity check compares it with the model as trained.
        log.info("model.data_format=%s: exporting the NCHW layout of the same weights", cfg.model.data_format)
        exportable = checkpoint_model(OmegaConf.merge(cfg, {"model": {"data_format": "NCHW"}}), checkpoint.state,
                                      len(splits.classes), splits.in_chans, source)
    threshold = float(cfg.data.multilabel_threshold) if cfg.data.get("multilabel") else None
    return RebuiltCheckpoint(model, exportable, splits, eval_tf, preprocessing_info(cfg.data, in_chans=splits.in_chans),
                    threshold)


def evaluated_checkpoint(cfg: DictConfig, overrides: Sequence[str]) -> tuple[DictConfig, Checkpoint]:
    """The checkpoint an ``evaluate`` config names, and the config to evaluate it with: the checkpoint's own,
    with the command line's ``overrides`` on top.

    The command line's values are checked first, so a typo is refused before a checkpoint is read.
    """
    check_values(cfg, EvaluateConfig)
    if OmegaConf.is_missing(cfg, "checkpoint"):
        raise UserError("missing required value for checkpoint (e.g. checkpoint=outputs/<name>/<time>:best)")
    checkpoint = load_checkpoint(locate_checkpoint(cfg.checkpoint))
    prepare(cfg, checkpoint)  # the checkpoint's `imports` and the command line's
    source = f"checkpoint={checkpoint.path}"
    return checkpoint_config(checkpoint.state.get("config"), overrides, base=cfg, source=source), checkpoint


@dataclass
class Evaluation:
    """A checkpoint rebuilt to be evaluated on one split: a Trainer with the run's loss and meters (no
    optimizer) and that split's loader."""

    trainer: Trainer
    loader: Any
    split: str
    classes: list[str]

    def run(self) -> dict[str, float]:
        """The split's metrics, named after it (``test/top1``, ...; the Trainer names what it validates val/...)."""
        metrics = self.trainer.validate(self.loader)
        return {f"{self.split}/{key.removeprefix('val/')}": value for key, value in metrics.items()}

    def per_class(self) -> dict[str, Any]:
        """Log the last validation's per-class table; its entries for the JSON line (``<split>/per_class``, and
        for a single-label run ``<split>/classes`` and ``<split>/confusion_matrix``, as ``val/...`` in
        ``summary.json``)."""
        multilabel = getattr(self.trainer.val_meter, "report", None)
        if isinstance(multilabel, MultiLabelReport):
            log.info("Per class (threshold %g):\n%s", multilabel.threshold, "\n".join(multilabel.table(self.classes)))
            return {f"{self.split}/per_class": multilabel.rows(self.classes)}
        report = self.trainer.val_report
        if report is None:
            return {}
        for row in report.table():
            log.info("%s", row)
        return {f"{self.split}/{key}": value for key, value in report.to_dict().items()}


def build_evaluation(cfg: DictConfig, checkpoint: Checkpoint) -> Evaluation:
    """The model of ``cfg`` (a checkpoint's config, :func:`evaluated_checkpoint`) with the checkpoint's weights,
    behind test-time augmentation if ``tta`` asks for it, and the split ``cfg.split`` names."""
    validate_config(cfg, use="evaluate")
    cfg = resolve_preprocessing(cfg)
    setup_runtime(cfg.trainer.device, cfg.trainer.cpu_threads)
    seed_everything(cfg.trainer.seed)
    tta = cfg.get("tta") or {}
    split = cfg.get("split", "val")
    data = build_data(cfg, seed=cfg.trainer.seed, eval_crop=tta.get("crops", 1) == 1, training=False,
                      eval_split=split)
    model = checkpoint_model(cfg, checkpoint.state, len(data.classes), data.in_chans,
                             source=f"checkpoint={checkpoint.path}")
    if tta.get("flip") or tta.get("crops", 1) > 1:  # test-time augmentation (paddletrain.models.tta)
        model = TestTimeAugmentation(model, flip=tta.flip, crops=tta.crops, crop_size=eval_image_size(cfg.data))
    trainer = Trainer(model, num_classes=len(data.classes), limits=build_limits(cfg),
                      loss_fn=build_criterion(cfg, data), meters=build_meters(cfg, len(data.classes)),
                      class_names=data.classes)
    return Evaluation(trainer, data.val_loader, split, data.classes)
