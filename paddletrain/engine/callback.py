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
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, ClassVar

if TYPE_CHECKING:  # pragma: no cover
    from pathlib import Path

    from paddletrain.engine.trainer import Trainer


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


class Callback:
    """Base class: override the hooks you need. Every hook receives the trainer."""

    # Only the main process (rank 0) runs callbacks whose ``main_process_only`` is True.
    main_process_only: bool = False

    @property
    def state_key(self) -> str:
        """Key under which this callback's state is stored in a checkpoint."""
        return type(self).__name__

    def setup(self, trainer: Trainer) -> None:
        """Called once when ``fit`` starts, before a checkpoint is restored (e.g. to resolve paths from
        ``trainer.run_dir``)."""

    def on_fit_start(self, trainer: Trainer) -> None: ...

    def on_fit_end(self, trainer: Trainer) -> None: ...

    def on_train_epoch_start(self, trainer: Trainer) -> None: ...

    def on_train_epoch_end(self, trainer: Trainer, metrics: dict[str, float]) -> None: ...

    def on_train_batch_start(self, trainer: Trainer, batch: Any, batch_idx: int) -> None: ...

    def on_before_optimizer_step(self, trainer: Trainer, optimizer: Any) -> None: ...

    def on_train_batch_end(self, trainer: Trainer, output: StepOutput, batch: Any, batch_idx: int) -> None: ...

    def on_validation_start(self, trainer: Trainer) -> None: ...

    def on_validation_batch_end(self, trainer: Trainer, batch: Any, batch_idx: int) -> None: ...

    def on_validation_end(self, trainer: Trainer, metrics: dict[str, float]) -> None: ...

    def on_save_checkpoint(self, trainer: Trainer, checkpoint: dict[str, Any]) -> None: ...

    def on_load_checkpoint(self, trainer: Trainer, checkpoint: dict[str, Any]) -> None: ...

    def on_exception(self, trainer: Trainer, exception: BaseException) -> None: ...

    def state_dict(self) -> dict[str, Any]:
        """JSON-serialisable state restored on resume (numbers, strings, lists, dicts)."""
        return {}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore what :meth:`state_dict` returned."""


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
