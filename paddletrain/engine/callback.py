"""The callback contract: hooks the Trainer calls, in a documented order, and the callback's own state.

Order of hooks during ``Trainer.fit``::

    setup                                 (before a checkpoint is restored)
    on_fit_start
      for each epoch:
        on_train_epoch_start
          for each batch:
            on_train_batch_start
            on_before_optimizer_step      (only on batches that step the optimizer)
            on_train_batch_end
        on_validation_start                (when validation runs this epoch)
          on_validation_batch_end          (for each validation batch)
        on_validation_end
        on_train_epoch_end
    on_fit_end
    on_exception                          (instead of the rest, if an exception escapes)

``on_save_checkpoint``/``on_load_checkpoint`` run when a checkpoint is written or restored.
Callbacks never reach into each other: they read the trainer's public state and write their own.

Callbacks that write checkpoints derive from :class:`CheckpointCallback`; the Trainer tells them apart by that type.
Hooks receive the trainer as a :class:`TrainerView`: what a callback may rely on, declared here so that the contract
does not depend on the loop that honours it (:class:`~paddletrain.engine.trainer.Trainer` is that loop, and a test
holds it to every member).
"""
from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, ClassVar, Protocol, runtime_checkable

from paddletrain.config import check_option


@dataclass
class StepOutput:
    """What one training batch produced, as host values (already synchronised once per step)."""

    loss: float
    batch_size: int
    lr: float
    # Whether the optimizer stepped on this batch (False for accumulation micro-batches and skipped steps).
    stepped: bool
    # Seconds spent waiting for the batch and computing it.
    data_time: float
    compute_time: float
    # False when the loss or a gradient was non-finite and the step was skipped.
    finite: bool = True
    extra: dict[str, float] = field(default_factory=dict)


@runtime_checkable
class TrainerView(Protocol):
    """What a callback may read of the trainer that calls its hooks; ``should_stop`` it may also set.

    The objects (model, optimizer, scheduler, precision, limits) are those the trainer was built with; the rest is
    the loop's progress and its records.
    """

    model: Any
    optimizer: Any
    scheduler: Any
    precision: Any
    limits: Any
    callbacks: list[Callback]
    run_dir: str | None
    hparams: Any
    rank: int
    world_size: int
    # Progress: the position to continue from is (epoch, batch_in_epoch).
    epoch: int
    batch_in_epoch: int
    epoch_finished: bool
    global_step: int
    should_stop: bool
    num_train_batches: int | None
    nonfinite_steps: int
    resumed_from: str | None
    # Records: the last metrics, the last validation's per-class report, throughput of the epoch and the fit.
    metrics: dict[str, float]
    val_report: Any
    epoch_throughput: Any
    run_throughput: Any
    fit_seconds: float
    logger: Any

    @property
    def module(self) -> Any:
        """The model without its data-parallel wrapper."""

    @property
    def is_main(self) -> bool:
        """Whether this is rank 0."""

    @property
    def checkpoint_callbacks(self) -> list[CheckpointCallback]:
        """The callbacks that write checkpoints, in the order they run."""

    @property
    def current_lr(self) -> float:
        """The learning rate the next step uses."""

    def checkpoint_state(self) -> dict[str, Any]:
        """What a checkpoint written now would hold."""


class Callback:
    """Base class: override the hooks you need. Every hook receives the trainer."""

    # Only the main process (rank 0) runs callbacks whose ``main_process_only`` is True.
    main_process_only: bool = False

    # The allowed values of the constructor's options, as paddletrain.config.check_option takes them, e.g.
    # {"patience": {"ge": 1}, "mode": {"choices": ("max", "min")}}: checked before the callback is built.
    option_rules: ClassVar[dict[str, dict[str, Any]]] = {}

    @classmethod
    def check_options(cls, options: Mapping[str, Any]) -> None:
        """Raise ``ConfigError``/``ValueError`` for an option value this callback cannot work with, before it is
        built (the config's ``callbacks.<name>`` entry). The base checks :attr:`option_rules`; a subclass with
        other rules extends it. Constructors run it too, so Python callers get the same message."""
        for name, rule in cls.option_rules.items():
            if name in options:
                check_option(name, options[name], **rule)

    @property
    def state_key(self) -> str:
        """Key under which this callback's state is stored in a checkpoint."""
        return type(self).__name__

    def setup(self, trainer: TrainerView) -> None:
        """Called once when ``fit`` starts, before a checkpoint is restored (e.g. to resolve paths from
        ``trainer.run_dir``)."""

    def on_fit_start(self, trainer: TrainerView) -> None: ...

    def on_fit_end(self, trainer: TrainerView) -> None: ...

    def on_train_epoch_start(self, trainer: TrainerView) -> None: ...

    def on_train_epoch_end(self, trainer: TrainerView, metrics: dict[str, float]) -> None: ...

    def on_train_batch_start(self, trainer: TrainerView, batch: Any, batch_idx: int) -> None: ...

    def on_before_optimizer_step(self, trainer: TrainerView, optimizer: Any) -> None: ...

    def on_train_batch_end(self, trainer: TrainerView, output: StepOutput, batch: Any, batch_idx: int) -> None: ...

    def on_validation_start(self, trainer: TrainerView) -> None: ...

    def on_validation_batch_end(self, trainer: TrainerView, batch: Any, batch_idx: int) -> None: ...

    def on_validation_end(self, trainer: TrainerView, metrics: dict[str, float]) -> None: ...

    def on_save_checkpoint(self, trainer: TrainerView, checkpoint: dict[str, Any]) -> None: ...

    def on_load_checkpoint(self, trainer: TrainerView, checkpoint: dict[str, Any]) -> None: ...

    def on_exception(self, trainer: TrainerView, exception: BaseException) -> None: ...

    def state_dict(self) -> dict[str, Any]:
        """JSON-serialisable state restored on resume (numbers, strings, lists, dicts)."""
        return {}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore what :meth:`state_dict` returned."""

    def run_files(self) -> dict[str, Path]:
        """What this callback writes that the run's ``summary.json`` names under ``paths`` (e.g.
        ``{"visualdl": <log dir>}``); nothing by default."""
        return {}


class CheckpointCallback(Callback):
    """Base class of callbacks that write the trainer's state (:meth:`Trainer.checkpoint_state
    <paddletrain.engine.trainer.Trainer.checkpoint_state>`) to checkpoints, e.g.
    :class:`~paddletrain.callbacks.ModelCheckpoint`.

    The Trainer finds them by this type (as Lightning does) and relies on the members below; a subclass writes
    its checkpoints from the ordinary hooks.
    """

    # Run after every other callback, so a checkpoint holds the others' state as it is after this hook
    # (e.g. EarlyStopping's counters after the validation that ended the epoch).
    runs_last: ClassVar[bool] = True
    # Whether a stop request (SIGTERM/SIGINT, raised as TrainingInterrupted) makes it save where training stopped,
    # in on_exception: the trainer says so when the request arrives, and `fit` names last_path afterwards.
    saves_on_interrupt: ClassVar[bool] = True
    # The checkpoint this callback wrote last, None before its first; set by the subclass on every save.
    last_path: Path | None = None
    # The metric that picks the best checkpoint, None when none is monitored.
    monitor: str | None = None

    def best_checkpoint(self) -> Path | None:
        """The best checkpoint by :attr:`monitor` among those kept (over resumes too), None when there is none."""
        return None

    def newest_checkpoint(self) -> Path | None:
        """The newest checkpoint kept (over resumes too), None before the first."""
        return self.last_path


# How a monitored metric improves: it rises ("max", e.g. accuracy) or falls ("min", e.g. loss).
MODES = ("max", "min")


def metric_improved(value: float | None, best: float | None, mode: str, min_delta: float = 0.0) -> bool:
    """Whether ``value`` beats ``best`` in ``mode`` ("max" or "min"); a NaN or missing value never improves."""
    if value is None or value != value:
        return False
    if best is None or best != best:
        return True
    if mode == "max":
        return value > best + min_delta
    if mode == "min":
        return value < best - min_delta
    raise ValueError(f"mode must be 'max' or 'min', got {mode!r}")
