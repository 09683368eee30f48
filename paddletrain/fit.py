"""`python -m paddletrain.fit`: the composition root that turns a validated config into objects and trains.

Examples::

    python -m paddletrain.fit                                   # resnet20 on the embedded `shapes` dataset
    python -m paddletrain.fit model=resnet50 data=imagefolder data.root=/data/imagenet trainer.amp.enabled=true
    python -m paddletrain.fit -m optim.lr=0.1,0.05              # a sweep
"""
from __future__ import annotations

if __name__ == "__main__":
    # Hold SIGTERM/SIGINT while Paddle and Hydra load (~2 s in which a signal would kill the process half-started
    # with a Paddle crash report); they are handled right after the imports.
    from paddletrain.processes import hold_stop_signals_during_imports

    hold_stop_signals_during_imports()

import json  # noqa: E402
import logging  # noqa: E402
import signal  # noqa: E402
import sys  # noqa: E402
from contextlib import nullcontext  # noqa: E402
from dataclasses import dataclass  # noqa: E402
from pathlib import Path  # noqa: E402
from typing import Any, Dict, List, NoReturn, Optional, Sequence  # noqa: E402

import hydra  # noqa: E402
import paddle  # noqa: E402
from omegaconf import DictConfig, OmegaConf  # noqa: E402

from paddletrain import distributed  # noqa: E402
from paddletrain.config import register_configs, validate_config  # noqa: E402
from paddletrain.errors import ExitCode, NonFiniteLossError, TrainingInterrupted, UserError  # noqa: E402
from paddletrain.processes import own_stop_signals, stop_request  # noqa: E402
from paddletrain.registry import prepare  # noqa: E402
from paddletrain.resume import is_legacy_checkpoint, load_resume_checkpoint, warm_start_from_legacy  # noqa: E402
from paddletrain.rundir import hold_run_dir, holding_run_dir  # noqa: E402

if __name__ == "__main__":
    own_stop_signals()

log = logging.getLogger("paddletrain")


@dataclass
class DataBundle:
    """What the data config builds: loaders plus what the model must know about the data."""

    train_loader: Any
    val_loader: Any
    classes: List[str]
    in_chans: int


def build_data(cfg: DictConfig, seed: int, rank: int = 0, world_size: int = 1) -> DataBundle:
    """Datasets, transforms and loaders from the ``data`` config."""
    from paddletrain.data import build_datasets, build_loader, build_transform

    # Transforms need the channel count the dataset reports, so the loaders apply them (per seeded sample).
    splits = build_datasets(cfg.data)
    train_tf = build_transform(cfg.data, train=True, in_chans=splits.in_chans)
    eval_tf = build_transform(cfg.data, train=False, in_chans=splits.in_chans)
    if len(splits.train) == 0:
        raise UserError(f"data.name={cfg.data.name}: the training split is empty")
    num_classes = cfg.model.num_classes
    if num_classes is not None and num_classes < len(splits.classes):
        raise UserError(f"model.num_classes={num_classes} is smaller than the {len(splits.classes)} classes "
                        f"of data.name={cfg.data.name}")
    per_rank = -(-len(splits.train) // world_size)
    if cfg.data.drop_last and per_rank < cfg.data.batch_size:
        raise UserError(f"data.batch_size={cfg.data.batch_size} is larger than the {per_rank} training samples each "
                        f"of the {world_size} process(es) gets from data.name={cfg.data.name}: with "
                        "data.drop_last=true no training step would run. Lower data.batch_size.")
    train_loader = build_loader(splits.train, cfg.data, train=True, seed=seed, num_replicas=world_size, rank=rank,
                                transform=train_tf)
    val_loader = build_loader(splits.val, cfg.data, train=False, seed=seed, num_replicas=world_size, rank=rank,
                              transform=eval_tf)
    return DataBundle(train_loader, val_loader, list(splits.classes), splits.in_chans)


def build_model(cfg: DictConfig, classes: List[str], in_chans: int) -> paddle.nn.Layer:
    """The model from the ``model`` config; class count and channels default to the data's.

    ``model.arch`` is passed only when set (``model=vision``); builder options the weights need (e.g.
    PaddleClas' first-block projection shortcut) come from the weight source.
    """
    from paddletrain.models import create_model
    from paddletrain.models.weights import describe

    m = cfg.model
    options: Dict[str, Any] = {"arch": m.arch} if m.arch else {}
    # Only options the config changes reach the builder, so a user's builder need not accept them all.
    for key, default in (("drop_rate", 0.0), ("zero_init_residual", False), ("data_format", "NCHW")):
        if m[key] != default:
            options[key] = m[key]
    if m.pretrained:
        options.update(describe(m.pretrained).model_options)
    return create_model(
        m.name,
        num_classes=m.num_classes if m.num_classes is not None else len(classes),
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
    import copy

    from paddletrain.config import DataConfig

    unset = [key for key in PREPROCESSING_FROM_WEIGHTS if cfg.data.get(key) is None]
    if not unset:
        return cfg
    weights: Dict[str, Any] = {}
    if cfg.model.pretrained:
        from paddletrain.models.weights import describe

        weights = describe(cfg.model.pretrained).preprocessing
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


def build_callbacks(cfg: DictConfig, run_dir: Path, mean: List[float], std: List[float],
                    run_info: Dict[str, Any]) -> list:
    """Built-in callbacks selected by the ``trainer`` config; ``run_info`` is stored in every checkpoint."""
    from paddletrain.callbacks import (BackboneFreeze, EarlyStopping, FreezeBatchNorm, LearningRateMonitor,
                                       ModelCheckpoint, ModelEMA, ProfilerCallback, ProgressBar,
                                       VisualDLLogger)

    t = cfg.trainer
    callbacks: list = [ProgressBar(enabled=None if t.progress_bar else False), LearningRateMonitor()]
    if t.visualdl:
        callbacks.append(VisualDLLogger(str(run_dir / "visualdl"), log_every_n_steps=t.log_every_n_steps,
                                        log_images=t.log_images, mean=mean, std=std))
    if t.early_stopping.enabled:
        es = t.early_stopping
        callbacks.append(EarlyStopping(monitor=es.monitor, mode=es.mode, patience=es.patience, min_delta=es.min_delta))
    if t.ema_decay is not None:
        callbacks.append(ModelEMA(t.ema_decay))
    if t.finetune.freeze_backbone_epochs:
        callbacks.append(BackboneFreeze(t.finetune.freeze_backbone_epochs))
    if t.finetune.freeze_bn:
        callbacks.append(FreezeBatchNorm())
    if t.profile:
        callbacks.append(ProfilerCallback(run_dir / "profiler", wait=t.profile_wait, warmup=t.profile_warmup,
                                          active=t.profile_active))
    if t.checkpoint.enabled:
        ck = t.checkpoint
        callbacks.append(ModelCheckpoint(
            run_dir / "checkpoints", monitor=ck.monitor, mode=ck.mode, keep_last=ck.keep_last,
            keep_best=ck.keep_best, every_n_steps=ck.every_n_steps, every_n_epochs=ck.every_n_epochs,
            extra_state={"config": OmegaConf.to_container(cfg, resolve=True), "run": run_info}))
    return callbacks


def train(cfg: DictConfig, run_dir: Path, callbacks: Sequence[Any] = (),
          trainer_cls: Optional[type] = None) -> Dict[str, float]:
    """Build everything from ``cfg`` and train; returns the final metrics (also written to summary.json).

    Downstream apps add their own ``callbacks`` (after the built-in ones) or a ``Trainer`` subclass
    (``trainer_cls``) with their own ``training_step``. The run directory is locked while training (a
    launcher holds it for its ranks).
    """
    prepare(cfg)  # import the config's `imports`, which register the names it uses
    validate_config(cfg)  # before the lock: a bad value does no work in the run directory
    with nullcontext() if distributed.is_launched() else holding_run_dir(run_dir):
        return _train(cfg, run_dir, callbacks, trainer_cls)


def _train(cfg: DictConfig, run_dir: Path, callbacks: Sequence[Any], trainer_cls: Optional[type]) -> Dict[str, float]:
    from paddletrain.optim import build_optimizer, build_scheduler, scaled_lr
    from paddletrain.precision import Precision
    from paddletrain.runtime import seed_everything, setup_runtime
    from paddletrain.trainer import Trainer, count_batches, optimizer_steps_per_epoch

    cfg = resolve_preprocessing(cfg)
    t = cfg.trainer
    rank, world_size = distributed.rank(), distributed.world_size()
    runtime = setup_runtime(t.device, t.cpu_threads, deterministic=t.deterministic)
    seed_everything(t.seed + rank)  # dropout differs per rank; the data order comes from t.seed alone
    data = build_data(cfg, seed=t.seed, rank=rank, world_size=world_size)
    model = build_model(cfg, data.classes, data.in_chans)
    steps_per_epoch = optimizer_steps_per_epoch(count_batches(data.train_loader, t.limit_train_batches),
                                                t.accumulate_grad_batches)
    global_batch = cfg.data.batch_size * world_size * t.accumulate_grad_batches
    lr = scaled_lr(cfg.optim.lr, global_batch, cfg.optim.base_batch_size) if cfg.optim.scale_lr else cfg.optim.lr
    log.info("Global batch %d (%d per process x %d process(es) x %d accumulation), learning rate %g%s", global_batch,
             cfg.data.batch_size, world_size, t.accumulate_grad_batches, lr,
             f" (optim.lr={cfg.optim.lr:g} scaled by {global_batch}/{cfg.optim.base_batch_size})"
             if cfg.optim.scale_lr else "")
    scheduler = build_scheduler(cfg.sched, lr, steps_per_epoch, t.max_epochs)
    optimizer = build_optimizer(model, cfg.optim, scheduler)
    precision = Precision.from_config(t.amp, device=runtime.device)
    # O2 decorates the bare model before DataParallel wraps it.
    model, optimizer = precision.setup(model, optimizer)
    model = distributed.wrap(model, find_unused_parameters=t.find_unused_parameters, sync_bn=cfg.model.sync_bn)
    run_info = {"model": cfg.model.name, "num_classes": len(data.classes), "batch_size": cfg.data.batch_size,
                "world_size": world_size}
    if t.resume and is_legacy_checkpoint(Path(t.resume)):
        warm_start_from_legacy(Path(t.resume), distributed.unwrap(model), optimizer, t.checkpoint.trust_pickle)
        checkpoint = None
    else:
        checkpoint = load_resume_checkpoint(t.resume, run_dir, run_info)
    trainer = (trainer_cls or Trainer)(
        model, optimizer, scheduler=scheduler, rank=rank, world_size=world_size,
        loss_fn=paddle.nn.CrossEntropyLoss(label_smoothing=t.label_smoothing),
        precision=precision,
        callbacks=[*build_callbacks(cfg, run_dir, list(cfg.data.mean), list(cfg.data.std), run_info), *callbacks],
        max_epochs=t.max_epochs, max_steps=t.max_steps, accumulate_grad_batches=t.accumulate_grad_batches,
        grad_clip_norm=t.grad_clip_norm, limit_train_batches=t.limit_train_batches,
        limit_val_batches=t.limit_val_batches, val_every_n_epochs=t.val_every_n_epochs,
        max_consecutive_nonfinite=t.max_consecutive_nonfinite, num_classes=len(data.classes),
        run_dir=str(run_dir), hparams=flat_hparams(cfg),
    )
    try:
        metrics = trainer.fit(data.train_loader, data.val_loader, ckpt_path=checkpoint)
    except TrainingInterrupted as exc:  # say which checkpoint the stop wrote, not whichever is newest on disk
        saved = [cb.last_path for cb in trainer.callbacks if getattr(cb, "saves_on_interrupt", False)]
        exc.checkpoint = str(saved[0]) if saved and saved[0] else None
        raise
    if trainer.is_main:
        write_summary(run_dir, metrics, trainer)
    distributed.barrier()
    return metrics


def flat_hparams(cfg: DictConfig) -> Dict[str, Any]:
    """Scalar hyper-parameters as a flat dict (``optim.lr`` → 0.1) for loggers."""
    flat: Dict[str, Any] = {}

    def walk(node: Any, prefix: str) -> None:
        if isinstance(node, dict):
            for key, value in node.items():
                walk(value, f"{prefix}{key}.")
        elif isinstance(node, (int, float, str, bool)):
            flat[prefix[:-1]] = node

    walk(OmegaConf.to_container(cfg, resolve=True), "")
    return flat


def write_summary(run_dir: Path, metrics: Dict[str, float], trainer: Any) -> None:
    """One summary line on the console and ``summary.json`` in the run directory."""
    summary = {"epochs": trainer.epoch, "global_step": trainer.global_step,
               "nonfinite_steps": trainer.nonfinite_steps, **metrics}
    (run_dir / "summary.json").write_text(json.dumps(summary, indent=2, sort_keys=True))
    shown = " ".join(f"{k}={v:.4f}" if isinstance(v, float) else f"{k}={v}" for k, v in sorted(summary.items()))
    log.info("Summary: %s (run dir: %s)", shown, run_dir)


def run_dir_from_hydra() -> Path:
    from hydra.core.hydra_config import HydraConfig

    return Path(HydraConfig.get().runtime.output_dir)


register_configs()
# Whether Hydra got as far as calling main(): an exit status 1 before that is Hydra rejecting the command line.
_main_ran = False


@hydra.main(version_base="1.3", config_path="conf", config_name="fit")
def main(cfg: DictConfig) -> Optional[float]:
    """Hydra entry point; returns the monitored metric so sweepers can optimise it.

    With ``trainer.devices=N`` (N > 1) or ``trainer.num_nodes`` > 1 this process only launches the ranks
    through ``paddle.distributed.launch`` into the same run directory; each rank runs this function again.
    Every way of ending maps to one :class:`~paddletrain.errors.ExitCode`, the same in a rank as in a single
    process.
    """
    global _main_ran
    _main_ran = True
    run_dir = run_dir_from_hydra()
    t = cfg.trainer
    if (t.devices > 1 or t.num_nodes > 1) and not distributed.is_launched():
        with stop_request.interruptible():
            try:
                launch_workers(cfg, run_dir)
            except TrainingInterrupted as exc:  # before the launcher took over the signals
                finish(exc.exit_code, stop_message(exc, cfg, run_dir))
        return None
    try:
        if distributed.is_launched():
            # The ranks meet inside Paddle, where no Python handler runs; a stop request waits until they have
            # met, so that every rank stops at the same point below.
            with stop_request.deferred("stopping once the ranks have met (nothing to save yet)"):
                distributed.init()
                distributed.setup_rank_logging(distributed.rank())
        # Start-up (data, model, restore) has nothing to save: a stop request interrupts it at once.
        with stop_request.interruptible():
            if distributed.is_launched():
                # Direct `paddle.distributed.launch` runs get one run directory too: rank 0's.
                run_dir = Path(distributed.broadcast_object(str(run_dir)))
            metrics = train(cfg, run_dir)
    except (Exception, KeyboardInterrupt) as exc:  # KeyboardInterrupt: SIGINT while someone else's handler ruled
        end_with(exc, cfg, run_dir)
    distributed.report_outcome(ExitCode.OK, "finished")
    return metrics.get(cfg.trainer.checkpoint.monitor)


def end_with(exc: BaseException, cfg: DictConfig, run_dir: Path) -> NoReturn:
    """Log how ``exc`` ended the run in one line (no traceback unless it is unexpected) and exit with its code."""
    lost = distributed.as_rank_lost(exc)
    if isinstance(exc, KeyboardInterrupt):
        exc = TrainingInterrupted(signal.SIGINT)
    if lost is not None:  # before the stop case: a lost peer is the cause even if a signal also arrived
        finish(ExitCode.RANK_LOST, f"rank {distributed.rank()} {lost}", lost_ranks=lost.lost_ranks)
    if isinstance(exc, TrainingInterrupted):
        finish(exc.exit_code, stop_message(exc, cfg, run_dir))
    if isinstance(exc, UserError):
        finish(ExitCode.USER_ERROR, str(exc))
    if isinstance(exc, NonFiniteLossError):
        finish(ExitCode.BAD_RESULT, str(exc))
    if stop_request.requested:
        # A rank that stopped during start-up can break a peer's collective: that is part of the same stop.
        log.debug("error while stopping", exc_info=exc)
        finish(ExitCode.interrupted(stop_request.signum), stop_message(TrainingInterrupted(stop_request.signum),
                                                                        cfg, run_dir))
    log.error("Unexpected error", exc_info=exc)
    finish(ExitCode.UNEXPECTED, f"unexpected {type(exc).__name__}: {exc} (traceback above and in the log)")


def stop_message(exc: TrainingInterrupted, cfg: DictConfig, run_dir: Path) -> str:
    """What a stop left behind and how to continue, in one line."""
    name = signal.Signals(exc.signum).name
    if exc.step is None:
        return f"Stopped by {name} during start-up; nothing to save"
    by = f" (received by rank {exc.rank})" if exc.rank is not None and distributed.is_launched() else ""
    if not cfg.trainer.checkpoint.enabled:
        return f"Stopped by {name}{by} after step {exc.step}; nothing saved (trainer.checkpoint.enabled=false)"
    resume = f"Continue with the same command plus trainer.resume=auto hydra.run.dir={run_dir}"
    if distributed.rank() != 0:
        return f"Stopped by {name}{by} after step {exc.step}; rank 0 saves the checkpoint. {resume}"
    if exc.checkpoint is None:
        return f"Stopped by {name}{by} after step {exc.step}; no checkpoint could be saved (see the log above)"
    return f"Stopped by {name}{by} after step {exc.step}; saved {exc.checkpoint}. {resume}"


def finish(code: int, message: str, lost_ranks: Optional[List[int]] = None) -> NoReturn:
    """Say how the run ended in one line and exit with ``code``.

    A rank reports it to its launcher (:func:`paddletrain.distributed.report_outcome`); a single process logs it.
    """
    if distributed.is_launched():
        distributed.report_outcome(code, message, lost_ranks)
    elif code >= 128:
        log.warning("%s", message)
    else:
        log.error("%s", message)
    sys.exit(code)


def launch_workers(cfg: DictConfig, run_dir: Path) -> None:
    """Start this node's ``trainer.devices`` ranks with this run's overrides and run directory.

    Returns when the job finished; otherwise logs its verdict and exits with its code.
    """
    from hydra.core.hydra_config import HydraConfig

    from paddletrain.launcher import Launcher, NodeSpec

    t = cfg.trainer
    try:
        validate_config(cfg)  # one line from here rather than the same error from every rank
        if t.node_rank == 0:  # node 0's launcher holds the (shared) run directory for every rank of the job
            hold_run_dir(run_dir)
    except UserError as exc:
        finish(ExitCode.USER_ERROR, str(exc))
    overrides = [o for o in HydraConfig.get().overrides.task if not o.startswith("hydra.run.dir=")]
    # The ranks share this run directory; this process already wrote its .hydra/ config there.
    args = [*overrides, f"hydra.run.dir={run_dir}", "hydra.output_subdir=null"]
    log_dir = run_dir / "launch" if t.num_nodes == 1 else run_dir / "launch" / f"node{t.node_rank}"
    if t.node_rank > 0:  # the run's fit.log belongs to rank 0's node
        root = logging.getLogger()
        for handler in [h for h in root.handlers if isinstance(h, logging.FileHandler)]:
            root.removeHandler(handler)
    plan = ("the ranks finish their current step, save a checkpoint and stop" if t.checkpoint.enabled else
            "the ranks finish their current step and stop (no checkpoint will be saved: checkpointing is off)")
    outcome = Launcher(NodeSpec(t.devices, t.num_nodes, t.node_rank, t.master), log_dir, plan).run(
        Path(__file__), args)
    if outcome.code == ExitCode.OK:
        return
    (log.warning if outcome.code >= 128 else log.error)("%s", outcome.message)
    sys.exit(outcome.code)


def run_from_command_line() -> None:
    """``main()``, with Hydra's own rejection of a command line (exit 1) mapped to :attr:`ExitCode.USER_ERROR`."""
    try:
        main()
    except SystemExit as exc:
        # Hydra exits 1 after printing why it rejected an override; everything main() ends with has its own code.
        if exc.code == 1 and not _main_ran:
            sys.exit(ExitCode.USER_ERROR)
        raise


if __name__ == "__main__":
    run_from_command_line()
