"""The training loop: fit / validate / predict over built objects, with callbacks and a full state_dict.

The Trainer never reads configuration: ``paddletrain.fit`` (or your own script) builds the model, optimizer,
scheduler, precision and callbacks and hands them over.
"""
from __future__ import annotations

import contextlib
import dataclasses
import functools
import itertools
import logging
import math
import threading
import time
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import paddle

from paddletrain.engine.callback import Callback, CheckpointCallback, StepOutput
from paddletrain.engine.hooks import (
    BatchTransform,
    EpochSampler,
    PaddedLoader,
    SkippingSampler,
    Stateful,
    batch_sampler_of,
    continues_mid_epoch,
    describe_loader,
)
from paddletrain.engine.limits import Limits
from paddletrain.engine.precision import Precision
from paddletrain.engine.state import Loaded, Progress, StateParts, load_state, restore, save_state
from paddletrain.errors import NonFiniteLossError, TrainingInterrupted, UserError
from paddletrain.job import distributed
from paddletrain.job.processes import raise_if_worker_lost, stop_request
from paddletrain.losses import cross_entropy
from paddletrain.metrics import ClassificationMeter, ClassReport, Throughput

log = logging.getLogger("paddletrain")

# The validation meter's stage: its metrics are named "val/<metric>".
VAL_STAGE = "val"


# Trainer.predict's outputs from float32 logits.
_ACTIVATIONS: dict[str, Callable[[paddle.Tensor], paddle.Tensor]] = {
    "softmax": lambda logits: paddle.nn.functional.softmax(logits, axis=-1),
    "sigmoid": paddle.nn.functional.sigmoid,
    "none": lambda logits: logits,
}


@dataclass
class TrainerSettings:
    """What the Trainer is told about the run besides the objects it drives (its constructor's plain values)."""

    num_classes: int | None = None
    class_names: list[str] | None = None
    run_dir: str | None = None
    hparams: dict[str, Any] | None = None
    checkpoint_extras: dict[str, Any] = field(default_factory=dict)
    rank: int = 0
    world_size: int = 1
    sync_bn: bool = False
    find_unused_parameters: bool = False
    handle_signals: bool = True


@dataclass
class FitResults:
    """What fitting and validating produced: the last metrics, the last validation's per-class report, meter and
    image count, the throughput of the epoch and of the fit, the fit's wall time, the checkpoint it resumed."""

    metrics: dict[str, float] = field(default_factory=dict)
    val_report: ClassReport | None = None
    val_samples: int = 0  # images the last validation scored (all ranks)
    val_meter: Any | None = None
    epoch_throughput: Throughput = field(default_factory=Throughput)
    run_throughput: Throughput = field(default_factory=Throughput)
    fit_seconds: float = 0.0  # everything: steps, validation, checkpoints
    resumed_from: str | None = None


@dataclass
class LoopState:
    """The running loop's own state: its loader, parameters and batch counts, the epoch's meter, the stop flag
    callbacks set, the run of non-finite steps, and a mid-epoch checkpoint's training meter waiting for its
    epoch."""

    train_loader: Iterable | None = None
    train_sampler: Any = None  # the training loader's batch sampler (engine.hooks.batch_sampler_of)
    parameters: list[Any] = field(default_factory=list)  # the model's, for clipping and the AMP step
    num_train_batches: int | None = None
    num_val_batches: int | None = None
    train_meter: ClassificationMeter | None = None
    is_setup: bool = False
    should_stop: bool = False
    consecutive_nonfinite: int = 0
    resumed_train_meter: dict[str, Any] | None = None


class _Held:
    """A Trainer attribute kept in one of its state objects (``settings``, ``progress``, ``results``, ``loop``):
    ``trainer.epoch`` reads and writes ``trainer.progress.epoch``, so callbacks keep their names."""

    def __init__(self, holder: str) -> None:
        self.holder = holder

    def __set_name__(self, owner: type, name: str) -> None:
        self.name = name

    def __get__(self, trainer: Any, owner: type | None = None) -> Any:
        if trainer is None:
            return self
        return getattr(getattr(trainer, self.holder), self.name)

    def __set__(self, trainer: Any, value: Any) -> None:
        setattr(getattr(trainer, self.holder), self.name, value)


class Trainer:
    """Train and evaluate a classification model.

    Args:
        model: the network (a ``paddle.nn.Layer``; may be wrapped in ``paddle.DataParallel``).
        optimizer: a ``paddle.optimizer.Optimizer`` over the model's parameters; needed by :meth:`fit` only
            (``None``: the trainer can :meth:`validate` and :meth:`predict`).
        scheduler: an LR scheduler stepped once per optimizer step (``None`` for a constant LR).
        loss_fn: ``loss_fn(logits, targets) -> scalar``; default :func:`paddletrain.losses.cross_entropy`
            (class indices or soft targets).
        precision: fp32/AMP behaviour (``paddletrain.engine.precision.Precision``); default fp32.
        callbacks: hooks run in the order given (checkpointing callbacks run last).
        limits: how long the loop runs and how it steps (:class:`~paddletrain.engine.limits.Limits`: epochs, steps,
            accumulation, clipping, batch caps, validation interval, non-finite tolerance); default one epoch.
        num_classes: for top-k metrics (top-5 only when there are at least 5 classes).
        class_names: the classes' names, for the per-class results of each validation (:attr:`val_report`:
            precision, recall, F1, confusion matrix); default: their indices.
        run_dir: where callbacks write (logs, checkpoints); ``None`` for none.
        hparams: a flat dict of hyper-parameters for loggers.
        checkpoint_extras: JSON-serialisable entries stored in every checkpoint beside the state (e.g. the
            resolved config).
        rank / world_size: this process's place in data-parallel training. With ``world_size > 1`` in a job
            started by ``paddle.distributed.launch`` the trainer wraps the model in ``paddle.DataParallel``
            (after any O2 cast), converting BatchNorm to SyncBatchNorm with ``sync_bn``.
        handle_signals: on SIGTERM/SIGINT finish the current optimizer step, let callbacks save (see
            :class:`~paddletrain.errors.TrainingInterrupted`) and stop; a second signal, at least a second
            after the first, exits at once.
        batch_transform: ``batch_transform(images, labels) -> (images, targets)`` run on every training batch
            before the forward pass (e.g. :class:`~paddletrain.data.transforms.mixup.Mixup`, whose soft targets the loss
            takes); metrics still count the original labels (:class:`~paddletrain.engine.hooks.BatchTransform`). A
            :class:`~paddletrain.engine.hooks.Stateful` one is saved in checkpoints (one entry per rank), so a resumed
            run draws what an uninterrupted one would.
        distiller: a :class:`~paddletrain.distill.Distiller`; training losses become its loss of the student's
            logits (its teacher sees the same, transformed, images). Validation keeps ``loss_fn``.
        meters: ``meters(stage)`` builds the meter of a training epoch (``"train"``) or of a validation
            (``"val"``), with :class:`~paddletrain.metrics.ClassificationMeter`'s interface; default: that meter
            (top-k). Multi-label runs pass :mod:`paddletrain.metrics.multilabel`'s.
        eval_model: the layer validation runs instead of ``model``, holding it (e.g.
            :class:`~paddletrain.models.tta.TestTimeAugmentation` of it), so that what is validated, monitored and
            chosen as best is what will be reported; its weights are the model's (an EMA swapped in included).
    """

    def __init__(
        self,
        model: paddle.nn.Layer,
        optimizer: paddle.optimizer.Optimizer | None = None,
        scheduler: paddle.optimizer.lr.LRScheduler | None = None,
        loss_fn: Callable[[paddle.Tensor, paddle.Tensor], paddle.Tensor] | None = None,
        precision: Precision | None = None,
        callbacks: Sequence[Callback] = (),
        limits: Limits | None = None,
        num_classes: int | None = None,
        run_dir: str | None = None,
        hparams: dict[str, Any] | None = None,
        checkpoint_extras: dict[str, Any] | None = None,
        rank: int = 0,
        world_size: int = 1,
        sync_bn: bool = False,
        find_unused_parameters: bool = False,
        handle_signals: bool = True,
        batch_transform: BatchTransform | None = None,
        distiller: Any | None = None,
        class_names: Sequence[str] | None = None,
        meters: Callable[[str], Any] | None = None,
        eval_model: paddle.nn.Layer | None = None,
    ) -> None:
        keys = [cb.state_key for cb in callbacks]
        if len(set(keys)) != len(keys):
            raise ValueError(f"two callbacks share a state_key (their state would collide in checkpoints): {keys}")
        self.model = model
        self.eval_model = eval_model
        self.optimizer = optimizer
        self.scheduler = scheduler
        self.loss_fn = loss_fn or cross_entropy
        self.precision = precision or Precision()
        # Checkpointing runs after every other callback so it saves their updated state (as Lightning does).
        self.callbacks: list[Callback] = sorted(
            callbacks, key=lambda c: isinstance(c, CheckpointCallback) and c.runs_last)
        # Frozen: to change a limit between fits, assign dataclasses.replace(trainer.limits, ...).
        self.limits = limits if limits is not None else Limits()
        self.batch_transform = batch_transform
        self.distiller = distiller
        self.meters = meters
        self.logger = log
        # The state, in named objects; the attributes below (trainer.epoch, trainer.metrics, ...) read them.
        self.settings = TrainerSettings(
            num_classes=num_classes, class_names=list(class_names) if class_names is not None else None,
            run_dir=run_dir, hparams=hparams, checkpoint_extras=dict(checkpoint_extras or {}), rank=rank,
            world_size=world_size, sync_bn=sync_bn, find_unused_parameters=find_unused_parameters,
            handle_signals=handle_signals)
        # The position to continue from is (epoch, batch_in_epoch); epoch_finished marks that the epoch's
        # validation and end hooks have run.
        self.progress = Progress()
        self.results = FitResults()
        self.loop = LoopState()

    # The state objects' fields under the names callbacks and scripts use.
    num_classes = _Held("settings")
    class_names = _Held("settings")
    run_dir = _Held("settings")
    hparams = _Held("settings")
    checkpoint_extras = _Held("settings")
    rank = _Held("settings")
    world_size = _Held("settings")
    sync_bn = _Held("settings")
    find_unused_parameters = _Held("settings")
    handle_signals = _Held("settings")
    epoch = _Held("progress")
    batch_in_epoch = _Held("progress")
    epoch_finished = _Held("progress")
    global_step = _Held("progress")
    nonfinite_steps = _Held("progress")
    metrics = _Held("results")
    val_report = _Held("results")
    val_samples = _Held("results")
    val_meter = _Held("results")
    epoch_throughput = _Held("results")
    run_throughput = _Held("results")
    fit_seconds = _Held("results")
    resumed_from = _Held("results")
    train_loader = _Held("loop")
    num_train_batches = _Held("loop")
    num_val_batches = _Held("loop")
    should_stop = _Held("loop")
    consecutive_nonfinite = _Held("loop")
    resumed_train_meter = _Held("loop")

    # ------------------------------------------------------------------ properties
    @property
    def module(self) -> paddle.nn.Layer:
        """The model without its data-parallel wrapper."""
        return distributed.unwrap(self.model)

    @property
    def is_main(self) -> bool:
        return self.rank == 0

    @property
    def checkpoint_callbacks(self) -> list[CheckpointCallback]:
        """The callbacks that write checkpoints, in the order they run."""
        return [cb for cb in self.callbacks if isinstance(cb, CheckpointCallback)]

    @property
    def current_lr(self) -> float:
        """The optimizer's learning rate now (the rate the next step uses)."""
        return float(self._required_optimizer().get_lr())

    def _required_optimizer(self) -> paddle.optimizer.Optimizer:
        if self.optimizer is None:
            raise UserError("this Trainer has no optimizer: pass one, Trainer(model, optimizer, ...), to fit; "
                            "without one it can only validate() and predict()")
        return self.optimizer

    # ------------------------------------------------------------------ callbacks
    def call_hook(self, hook: str, *args: Any) -> None:
        """Run the callbacks' ``hook`` (a :class:`~paddletrain.callbacks.Callback` method) with this trainer, in
        order, skipping ``main_process_only`` callbacks on ranks other than 0."""
        for cb in self.callbacks:
            if cb.main_process_only and not self.is_main:
                continue
            getattr(cb, hook)(self, *args)

    # ------------------------------------------------------------------ overridable steps
    def training_step(self, batch: Any, batch_idx: int) -> tuple[paddle.Tensor, paddle.Tensor | None, Any]:
        """Forward one training batch; returns (loss, logits, labels). Override for custom tasks."""
        images, labels = batch[0], batch[1]
        targets = labels
        if self.batch_transform is not None:
            images, targets = self.batch_transform(images, labels)
        with self.precision.autocast(training=True):
            logits = self.model(images)
            if self.distiller is None:
                loss = self.loss_fn(logits, targets)
        if self.distiller is not None:  # the teacher enters the same autocast on its own
            loss = self.distiller.loss(logits, images, targets, precision=self.precision)
        return loss, logits, labels

    def validation_step(self, batch: Any, batch_idx: int) -> tuple[paddle.Tensor, paddle.Tensor | None, Any]:
        """Forward one evaluation batch; returns (loss, logits, labels). Override for custom tasks."""
        images, labels = batch[0], batch[1]
        with self.precision.autocast(training=False):
            logits = (self.eval_model or self.model)(images)
        logits = logits.astype("float32")
        return self.loss_fn(logits, labels), logits, labels

    def new_meter(self, stage: str) -> Any:
        """A fresh meter for a training epoch (``"train"``) or a validation (``"val"``): ``meters``' or the
        default top-k one."""
        if self.meters is not None:
            return self.meters(stage)
        return ClassificationMeter(self.num_classes, per_class=stage == VAL_STAGE)  # per class: validation only

    # ------------------------------------------------------------------ fit
    def setup(self) -> None:
        """Prepare the model once, before the first step or restore: the precision's casts (O2), then the
        data-parallel wrapper in a launched job (which must wrap the cast model)."""
        if self.loop.is_setup:
            return
        self.loop.is_setup = True
        self.model, self.optimizer = self.precision.setup(self.model, self.optimizer)
        if self.world_size > 1 and not isinstance(self.model, paddle.DataParallel):
            self.model = distributed.wrap(self.model, find_unused_parameters=self.find_unused_parameters,
                                          sync_bn=self.sync_bn)

    def fit(self, train_loader: Iterable, val_loader: Iterable | None = None,
            ckpt_path: Any | None = None) -> dict[str, float]:
        """Train until ``limits.max_epochs``/``limits.max_steps`` or a callback stops; returns the final metrics.

        ``ckpt_path`` (a checkpoint directory or a loaded ``Checkpoint``) restores model, optimizer, scheduler,
        precision, callbacks, RNGs and the position inside the epoch, so the run continues exactly where the
        checkpoint was written.
        """
        self._required_optimizer()  # before any hook runs: nothing is half-started
        self.setup()
        # Walking the layer tree every step costs ~0.2-0.5 ms (measured): list the parameters once.
        self.loop.parameters = list(self.module.parameters())
        self.train_loader = train_loader
        self.num_train_batches = count_batches(train_loader, self.limits.limit_train_batches)
        self.call_hook("setup")
        if ckpt_path is not None:
            self.restore(ckpt_path)
            if self._done():
                log.info("The run is already finished (epoch %d, step %d; max_epochs=%s, max_steps=%s): nothing "
                         "left to train", self.epoch, self.global_step, self.limits.max_epochs, self.limits.max_steps)
        self.loop.train_sampler = batch_sampler_of(train_loader)  # asked once: each epoch sets its epoch
        if self.batch_in_epoch and not continues_mid_epoch(train_loader):
            raise UserError(f"cannot continue epoch {self.epoch} at batch {self.batch_in_epoch} exactly: this training "
                            f"loader ({describe_loader(train_loader)}) draws its order when an epoch starts, which a "
                            "mid-epoch checkpoint does not hold. Build it with paddletrain.data.build_loader (its "
                            "sampler saves its position), or resume from a checkpoint written at an epoch's end")
        started = time.perf_counter()
        with self._stop_handling():
            try:
                self.call_hook("on_fit_start")
                while not self._done():
                    self._run_epoch(train_loader, val_loader)
                    self._check_stop()  # a signal that arrived during validation or the epoch-end hooks
                self.fit_seconds = time.perf_counter() - started
                self.call_hook("on_fit_end")
            except BaseException as exc:
                self.fit_seconds = time.perf_counter() - started
                self.call_hook("on_exception", exc)
                raise
        return dict(self.metrics)

    def _stop_handling(self):
        """SIGTERM/SIGINT become a stop after the current optimizer step
        (:data:`paddletrain.job.processes.stop_request`).

        A second signal, at least a second later, exits at once. Handlers can only be installed from the main
        thread; elsewhere the trainer still honours a request recorded by handlers its program installed.
        """
        if not self.handle_signals or threading.current_thread() is not threading.main_thread():
            return contextlib.nullcontext()
        saves = any(cb.saves_on_interrupt for cb in self.checkpoint_callbacks)
        plan = ("finishing the current step, then saving a checkpoint and stopping" if saves else
                "finishing the current step, then stopping (no checkpoint will be saved: checkpointing is off)")
        return stop_request.handling(plan)

    def _check_stop(self) -> None:
        """Raise :class:`TrainingInterrupted` when any rank received a stop signal (all ranks agree on the step),
        and a loader worker's death noticed since the last step (:func:`paddletrain.job.processes.
        raise_if_worker_lost`)."""
        raise_if_worker_lost()  # with several ranks this one stops, and its peers report it lost
        signum = None
        if self.handle_signals:
            stop_request.say_unsaid()
            signum = stop_request.signum
        if self.world_size > 1:
            agreed = distributed.agree_on_stop(signum)  # every rank, every step: one tiny all-reduce
        else:
            agreed = (signum, self.rank) if signum else None
        if agreed is not None:
            raise TrainingInterrupted(agreed[0], step=self.global_step, rank=agreed[1] if self.world_size > 1 else None)

    def _done(self) -> bool:
        return self.should_stop or self.epoch >= self.limits.max_epochs or self.limits.steps_exhausted(self.global_step)

    def _run_epoch(self, train_loader: Iterable, val_loader: Iterable | None) -> None:
        self.epoch_finished = False
        sampler = self.loop.train_sampler
        if isinstance(sampler, EpochSampler):
            sampler.set_epoch(self.epoch)
        # A stateful sampler restored its position on resume; others are told what to skip.
        if self.batch_in_epoch and isinstance(sampler, SkippingSampler) and not isinstance(sampler, Stateful):
            sampler.skip_batches(self.batch_in_epoch)
        # The last validation scored an earlier epoch's weights: an epoch that does not validate
        # (trainer.val_every_n_epochs > 1) must not report its figures as its own, nor be ranked by them.
        for key in [key for key in self.metrics if key.startswith(f"{VAL_STAGE}/")]:
            del self.metrics[key]
        self.module.train()
        self.call_hook("on_train_epoch_start")
        train_metrics, exhausted = self._train_batches(train_loader)
        self.metrics.update(train_metrics)
        last_epoch = not exhausted or self.epoch + 1 >= self.limits.max_epochs
        if val_loader is not None and self.limits.validates_after(self.epoch, last_epoch):
            self.metrics.update(self._validate(val_loader))
        # Only an epoch whose batches all ran is finished: a checkpoint written after a max_steps or
        # should_stop cut resumes at the next batch of this epoch, not at the next epoch.
        self.epoch_finished = exhausted
        self.call_hook("on_train_epoch_end", dict(self.metrics))
        if exhausted:
            self.epoch += 1
            self.batch_in_epoch = 0
            self.epoch_finished = False

    def _train_batches(self, loader: Iterable) -> tuple[dict[str, float], bool]:
        """Train over the epoch's remaining batches; returns the epoch's metrics and whether all batches ran."""
        meter = self.loop.train_meter = self.new_meter("train")
        if self.resumed_train_meter is not None:
            meter.load_state_dict(self.resumed_train_meter)
            self.resumed_train_meter = None
        accumulate = self.limits.accumulate_grad_batches
        limit = self.num_train_batches
        throughput = self.epoch_throughput = Throughput()
        batch_idx = self.batch_in_epoch
        # A fixed sequence of batches continues where the epoch stopped; a resumable sampler did that itself.
        remaining = itertools.islice(loader, batch_idx, None) if isinstance(loader, (list, tuple)) else loader
        batches = _flag_last(iter(remaining), limit, batch_idx)
        exhausted = True
        while True:
            t0 = time.perf_counter()
            item = next(batches, None)
            if item is None:
                break
            batch, is_last = item
            t1 = time.perf_counter()
            lr = self.current_lr  # the rate this batch trains with, before the scheduler advances
            self.call_hook("on_train_batch_start", batch, batch_idx)
            step_now = (batch_idx + 1) % accumulate == 0 or is_last
            with self._no_sync(not step_now):
                loss, logits, labels = self.training_step(batch, batch_idx)
                self.precision.backward(loss / accumulate if accumulate > 1 else loss)
            stepped, finite = False, True
            if step_now:
                stepped, finite = self._optimizer_step()
            loss_value = float(loss.item())  # the step's one host sync; .item() also accepts a [1]-shaped loss
            if math.isfinite(loss_value):
                meter.update(loss, logits, labels, len(labels))
            t2 = time.perf_counter()
            batch_size = int(batch[0].shape[0])
            throughput.add(batch_size, t1 - t0, t2 - t1)
            self.run_throughput.add(batch_size, t1 - t0, t2 - t1)
            self.batch_in_epoch = batch_idx + 1
            out = StepOutput(loss=loss_value, batch_size=batch_size, lr=lr, stepped=stepped,
                             data_time=t1 - t0, compute_time=t2 - t1, finite=finite)
            self.call_hook("on_train_batch_end", out, batch, batch_idx)
            batch_idx += 1
            # Stop only on an optimizer-step boundary (accumulated gradients are not part of a checkpoint), and
            # on the same step on every rank, or the others would wait forever in the next all-reduce.
            if step_now:
                self._check_stop()
            if self.should_stop or self.limits.steps_exhausted(self.global_step):
                exhausted = is_last
                break
        sums = meter.sums()
        if self.world_size > 1:
            paddle.distributed.all_reduce(sums)
        metrics = meter.compute("train", sums)
        if throughput.images:
            metrics["train/throughput"] = throughput.images_per_second
            metrics["train/data_time_share"] = throughput.data_share
        metrics["train/lr"] = self.current_lr
        return metrics, exhausted

    def _optimizer_step(self) -> tuple[bool, bool]:
        """Unscale, check, clip and step; the scheduler advances only when the optimizer really stepped."""
        self.call_hook("on_before_optimizer_step", self.optimizer)
        result = self.precision.step(self.optimizer, self.loop.parameters, clip_norm=self.limits.grad_clip_norm)
        if result.stepped:
            self.global_step += 1
            self.consecutive_nonfinite = 0
            if self.scheduler is not None:
                self.scheduler.step()
            return True, True
        if result.found_inf:
            self.nonfinite_steps += 1
            self.consecutive_nonfinite += 1
            log.warning("Non-finite loss or gradient at epoch %d batch %d: optimizer step skipped "
                        "(%d in a row, %d in total)%s", self.epoch, self.batch_in_epoch, self.consecutive_nonfinite,
                        self.nonfinite_steps,
                        f", loss scale now {result.loss_scale:g}" if result.loss_scale is not None else "")
            if self.consecutive_nonfinite >= self.limits.max_consecutive_nonfinite:
                raise NonFiniteLossError(
                    f"{self.consecutive_nonfinite} consecutive optimizer steps had a non-finite loss or gradient "
                    f"(the last at epoch {self.epoch}, batch {self.batch_in_epoch}, after global step "
                    f"{self.global_step}); stopping. Lower the learning rate, enable gradient clipping "
                    f"(trainer.grad_clip_norm) or check the data. Earlier checkpoints are intact.")
        return False, not result.found_inf

    def _no_sync(self, skip_allreduce: bool):
        """Accumulation micro-batches skip the gradient all-reduce under data parallelism."""
        if skip_allreduce and isinstance(self.model, paddle.DataParallel):
            return self.model.no_sync()
        return contextlib.nullcontext()

    # ------------------------------------------------------------------ validate / predict
    def validate(self, loader: Iterable) -> dict[str, float]:
        """Loss, top-k and balanced accuracy over ``loader`` (all ranks combined; per-class results in
        :attr:`val_report`); also runs the validation hooks."""
        self.setup()
        metrics = self._validate(loader)
        self.metrics.update(metrics)
        return metrics

    def _validate(self, loader: Iterable) -> dict[str, float]:
        limit = self.num_val_batches = count_batches(loader, self.limits.limit_val_batches)
        self.call_hook("on_validation_start")
        was_training = self.module.training
        self.module.eval()
        if self.world_size > 1:
            distributed.broadcast_buffers(self.module)
        meter = self.val_meter = self.new_meter(VAL_STAGE)
        # A distributed sampler pads each rank's shard at its end; those repeated samples are not counted.
        real = loader.num_real_samples if isinstance(loader, PaddedLoader) else None
        seen = 0
        with paddle.no_grad():
            for batch_idx, batch in enumerate(loader):
                if (limit is not None and batch_idx >= limit) or (real is not None and seen >= real):
                    break
                loss, logits, labels = self.validation_step(batch, batch_idx)
                size = int(labels.shape[0])
                if real is not None and seen + size > real:
                    keep = real - seen
                    logits, labels = logits[:keep], labels[:keep]
                    loss, size = self.loss_fn(logits, labels), keep
                meter.update(loss, logits, labels, size)
                seen += size
                self.call_hook("on_validation_batch_end", batch, batch_idx)
        sums = meter.sums()
        if self.world_size > 1:
            paddle.distributed.all_reduce(sums)  # the per-class counts and the confusion matrix ride along
        self.val_samples = int(sums.numpy()[0])  # every meter's sums start with its sample count
        metrics = meter.compute(VAL_STAGE, sums)
        # Single-label runs: per-class counts and the confusion matrix (a multi-label meter keeps its own report).
        self.val_report = meter.report(sums, self.class_names) if isinstance(meter, ClassificationMeter) else None
        if was_training:
            self.module.train()
        self.call_hook("on_validation_end", metrics)
        return metrics

    def predict(self, loader: Iterable, activation: str = "softmax") -> np.ndarray:
        """Probabilities for every sample of ``loader`` (batches of images, or (images, ...) tuples).

        ``activation``: ``softmax`` (one class per image), ``sigmoid`` (each class on its own: a multi-label
        model), or ``none`` for the logits.
        """
        outputs_of = _ACTIVATIONS.get(activation)
        if outputs_of is None:
            raise ValueError(f"activation={activation!r} is not one of {', '.join(_ACTIVATIONS)}")
        self.setup()
        self.module.eval()
        outputs = []
        with paddle.no_grad():
            for batch in loader:
                images = batch[0] if isinstance(batch, (list, tuple)) else batch
                with self.precision.autocast(training=False):
                    logits = self.model(images)
                outputs.append(outputs_of(logits.astype("float32")).numpy())
        return np.concatenate(outputs) if outputs else np.zeros((0, 0), dtype="float32")

    # ------------------------------------------------------------------ state
    def _state_parts(self) -> StateParts:
        return StateParts(module=self.module, optimizer=self.optimizer, scheduler=self.scheduler,
                          precision=self.precision, callbacks=self.callbacks,
                          sampler=batch_sampler_of(self.train_loader), batch_transform=self.batch_transform,
                          rank=self.rank, world_size=self.world_size, new_meter=self.new_meter)

    def state_dict(self) -> dict[str, Any]:
        """Everything needed to continue exactly (:func:`paddletrain.engine.state.save_state`): weights, optimizer,
        scheduler, precision, callbacks, progress, RNGs, the sampler's position."""
        return save_state(self._state_parts(), dataclasses.replace(self.progress), self.metrics, self.loop.train_meter)

    def checkpoint_state(self) -> dict[str, Any]:
        """What a checkpoint holds: :meth:`state_dict`, the ``checkpoint_extras``, and whatever each callback's
        ``on_save_checkpoint`` adds (callbacks on the main process only write there)."""
        state = self.state_dict()
        state.update(self.checkpoint_extras)
        if self.is_main:
            self.call_hook("on_save_checkpoint", state)
        return state

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore what :meth:`state_dict` produced (:func:`paddletrain.engine.state.load_state`: every value is
        checked before anything changes; one that does not fit raises ``StateValueError`` naming its key)."""
        self._continue_from(load_state(self._state_parts(), state))

    def _continue_from(self, loaded: Loaded) -> None:
        self.progress = loaded.progress
        self.metrics.update(loaded.metrics)
        self.loop.resumed_train_meter = loaded.train_meter

    def restore(self, checkpoint: Any) -> None:
        """Load a checkpoint (a directory, or a :class:`~paddletrain.checkpoint.Checkpoint`) into the trainer;
        callbacks' ``on_load_checkpoint`` see its state first. An error names the checkpoint (and the key)."""
        parts = self._state_parts()
        path, loaded = restore(checkpoint, parts, functools.partial(self.call_hook, "on_load_checkpoint"))
        self._continue_from(loaded)
        self.resumed_from = str(path)
        log.info("Resumed from %s at epoch %d, batch %d, global step %d", self.resumed_from, self.epoch,
                 self.batch_in_epoch, self.global_step)


def count_batches(loader: Iterable, limit: int | None) -> int | None:
    """Batches an epoch of ``loader`` runs: its length capped by ``limit`` (None when neither is known)."""
    try:
        n: int | None = len(loader)  # type: ignore[arg-type]
    except TypeError:
        n = None
    if limit is not None:
        n = limit if n is None else min(n, limit)
    return n


def _flag_last(batches: Iterator[Any], limit: int | None, start: int) -> Iterator[tuple[Any, bool]]:
    """``(batch, is_last)`` for batches ``start, start + 1, ...`` up to ``limit``.

    Without a known length the following batch is fetched first, so the last one is still known as last.
    """
    if limit is not None:
        for index in range(start, limit):
            batch = next(batches, _END)
            if batch is _END:
                return
            yield batch, index + 1 >= limit
        return
    current = next(batches, _END)
    if current is _END:
        return
    for following in batches:
        yield current, False
        current = following
    yield current, True


_END = object()
