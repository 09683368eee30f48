"""Stop training when a validation metric has stopped improving."""
from __future__ import annotations

import logging
from typing import TYPE_CHECKING, Any

from paddletrain.checkpoint.untrusted import checked_int, checked_number, checked_optional_int
from paddletrain.engine.callback import MODES, Callback, metric_improved
from paddletrain.registry import CALLBACKS

if TYPE_CHECKING:  # pragma: no cover
    from paddletrain.engine.trainer import Trainer

_log = logging.getLogger(__name__)


@CALLBACKS.register("early_stopping")
class EarlyStopping(Callback):
    """Sets ``trainer.should_stop`` after ``patience`` consecutive validations without improvement.

    An improvement must beat the best value by more than ``min_delta``; a NaN never improves.
    Runs on every rank (not only the main one) so that all ranks stop together: the validation
    metrics it reads are the same on every rank.

    Args:
        monitor: Metric key, e.g. ``"val/top1"`` or ``"val/loss"``.
        mode: ``"max"`` when larger is better, ``"min"`` when smaller is better.
        patience: Consecutive validations without improvement after which training stops.
        min_delta: Smallest change that counts as an improvement.
    """

    option_rules = {"mode": dict(choices=MODES), "patience": dict(ge=1), "min_delta": dict(ge=0)}

    def __init__(self, monitor: str = "val/top1", mode: str = "max", patience: int = 10,
                 min_delta: float = 0.0) -> None:
        self.check_options({"mode": mode, "patience": patience, "min_delta": min_delta})
        self.monitor = monitor
        self.mode = mode
        self.patience = patience
        self.min_delta = float(min_delta)
        self.best: float | None = None
        self.best_epoch: int | None = None
        self.wait = 0

    def on_validation_end(self, trainer: Trainer, metrics: dict[str, float]) -> None:
        value = self._read_monitor(trainer, metrics)
        if metric_improved(value, self.best, self.mode, self.min_delta):
            self.best, self.best_epoch, self.wait = float(value), trainer.epoch, 0
            return
        self.wait += 1
        if self.wait >= self.patience:
            trainer.should_stop = True
            if trainer.is_main:
                best = "none" if self.best is None else f"{self.best:.6g} (epoch {self.best_epoch + 1})"
                trainer.logger.info(
                    "Early stopping: %s = %s did not improve (mode=%s, min_delta=%g) for %d validations; "
                    "best %s", self.monitor, value, self.mode, self.min_delta, self.wait, best)

    def _read_monitor(self, trainer: Trainer, metrics: dict[str, float]) -> float:
        available = {**trainer.metrics, **metrics}
        if self.monitor not in available:
            raise KeyError(
                f"EarlyStopping monitors {self.monitor!r}, but validation produced no such metric. "
                f"Available metrics: {sorted(available)}. Set early_stopping.monitor to one of them.")
        return available[self.monitor]

    def state_dict(self) -> dict[str, Any]:
        return {"monitor": self.monitor, "mode": self.mode, "best": self.best,
                "best_epoch": self.best_epoch, "wait": self.wait}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        if (state.get("monitor"), state.get("mode")) != (self.monitor, self.mode):
            # A best value of another metric or direction would be meaningless here: start afresh.
            _log.warning("EarlyStopping: checkpoint tracked %s (%s), now %s (%s); starting a fresh count",
                         state.get("monitor"), state.get("mode"), self.monitor, self.mode)
            return

        best = checked_number(state.get("best"), "best", allow_none=True)
        best_epoch = checked_optional_int(state.get("best_epoch"), "best_epoch")
        self.best, self.best_epoch, self.wait = best, best_epoch, checked_int(state.get("wait"), "wait")
