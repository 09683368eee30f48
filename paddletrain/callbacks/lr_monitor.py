"""Per parameter-group learning rates, published as ``train/lr_group{i}`` in ``trainer.metrics``."""
from __future__ import annotations

from typing import TYPE_CHECKING, Any

from paddletrain.engine.callback import Callback
from paddletrain.registry import CALLBACKS

if TYPE_CHECKING:  # pragma: no cover
    from paddletrain.engine.trainer import Trainer


def group_lr_multipliers(optimizer: Any) -> list[float]:
    """LR multiplier of each parameter group of a Paddle optimizer ([] when it has no groups).

    Paddle scales the global learning rate by a group's ``learning_rate`` entry (default 1.0).
    """
    # Paddle keeps the groups only in this attribute; a flat parameter list holds no dicts.
    groups = getattr(optimizer, "_param_groups", None) or []
    if not all(isinstance(group, dict) for group in groups):
        return []
    return [float(group.get("learning_rate", 1.0)) for group in groups]


@CALLBACKS.register("lr_monitor")
class LearningRateMonitor(Callback):
    """Publishes each parameter group's effective learning rate when the groups' multipliers differ.

    The values go to ``trainer.metrics["train/lr_group{i}"]``, where loggers (e.g. the VisualDL
    logger, which writes every ``train/*`` metric) pick them up; with equal multipliers
    ``train/lr`` already says everything and nothing is added. Values are written just before each
    optimizer step, so they are current when any callback's ``on_train_batch_end`` reads them.
    """

    def __init__(self) -> None:
        self._multipliers: list[float] = []

    def on_fit_start(self, trainer: Trainer) -> None:
        multipliers = group_lr_multipliers(trainer.optimizer)
        self._multipliers = multipliers if len(set(multipliers)) > 1 else []

    def on_before_optimizer_step(self, trainer: Trainer, optimizer: Any) -> None:
        if not self._multipliers:
            return
        lr = trainer.current_lr
        for i, multiplier in enumerate(self._multipliers):
            trainer.metrics[f"train/lr_group{i}"] = lr * multiplier
