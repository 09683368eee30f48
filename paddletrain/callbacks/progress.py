"""A tqdm progress bar per training epoch and a one-line epoch summary in the log."""
from __future__ import annotations

import sys
import time
from typing import TYPE_CHECKING, Any, Dict, Optional, TextIO

from tqdm import tqdm

from paddletrain.callbacks.base import Callback, StepOutput
from paddletrain.config import check_option
from paddletrain.registries import CALLBACKS

if TYPE_CHECKING:  # pragma: no cover
    from paddletrain.trainer import Trainer

# Keys shown in the epoch summary, in this order, when the metrics hold them.
_SUMMARY_KEYS = ("train/loss", "val/loss", "val/top1", "val/top5")


class _EpochStats:
    """Running totals for one epoch: cheap to update on every batch (plain float arithmetic)."""

    def __init__(self, smoothing: float) -> None:
        self.smoothing = smoothing
        self.start = time.perf_counter()
        self.loss_sum = 0.0
        self.loss_count = 0
        self._ema = 0.0
        self._ema_weight = 0.0

    def update(self, output: StepOutput) -> None:
        if output.finite and output.loss == output.loss:
            self.loss_sum += output.loss
            self.loss_count += 1
            self._ema = self.smoothing * self._ema + (1.0 - self.smoothing) * output.loss
            self._ema_weight = self.smoothing * self._ema_weight + (1.0 - self.smoothing)

    @property
    def smoothed_loss(self) -> Optional[float]:
        # Bias-corrected EMA, so the first batches are not pulled towards zero.
        return self._ema / self._ema_weight if self._ema_weight > 0 else None

    @property
    def mean_loss(self) -> Optional[float]:
        return self.loss_sum / self.loss_count if self.loss_count else None

    @property
    def elapsed(self) -> float:
        """Wall time of the epoch so far (steps and everything between them)."""
        return time.perf_counter() - self.start


def _format_value(value: float) -> str:
    return f"{value:.4g}"


@CALLBACKS.register("progress_bar")
class ProgressBar(Callback):
    """Shows epoch i/N, step, smoothed loss, lr, img/s, ETA and data-wait share; logs an epoch summary.

    Args:
        refresh_every: Update the bar's numbers every this many batches (the bar itself redraws at
            most ``mininterval`` seconds apart, so per-batch cost stays negligible).
        smoothing: EMA factor for the displayed loss (0 = last batch only).
        enabled: ``None`` shows the bar only when ``file`` is a terminal (so logs of batch jobs stay
            clean); ``True``/``False`` force it. The epoch summary is logged either way.
        file: Stream for the bar; default ``sys.stdout`` (looked up when the bar opens).
        mininterval: Minimum seconds between redraws.
    """

    main_process_only = True

    def __init__(
        self,
        refresh_every: int = 10,
        smoothing: float = 0.98,
        enabled: Optional[bool] = None,
        file: Optional[TextIO] = None,
        mininterval: float = 0.5,
    ) -> None:
        check_option("refresh_every", refresh_every, ge=1)
        check_option("smoothing", smoothing, ge=0, lt=1)
        check_option("mininterval", mininterval, ge=0)
        self.refresh_every = refresh_every
        self.smoothing = smoothing
        self.enabled = enabled
        self.file = file
        self.mininterval = mininterval
        self._bar: Optional[tqdm] = None
        self._stats: Optional[_EpochStats] = None

    def on_train_epoch_start(self, trainer: "Trainer") -> None:
        self._close_bar()
        self._stats = _EpochStats(self.smoothing)
        self._bar = tqdm(
            total=trainer.num_train_batches,
            desc=f"Epoch {trainer.epoch + 1}/{trainer.max_epochs}",
            file=self.file if self.file is not None else sys.stdout,
            # tqdm's disable=None means "disable when the stream is not a TTY".
            disable=None if self.enabled is None else not self.enabled,
            dynamic_ncols=True,
            leave=False,
            mininterval=self.mininterval,
            unit="batch",
        )

    def on_train_batch_end(self, trainer: "Trainer", output: StepOutput, batch: Any, batch_idx: int) -> None:
        if self._stats is None:  # a batch outside an epoch hook pair: nothing to show
            return
        self._stats.update(output)
        if self._bar is None or self._bar.disable:
            return
        if (batch_idx + 1) % self.refresh_every == 0 or batch_idx == 0:
            self._bar.set_postfix_str(self._postfix(trainer, output), refresh=False)
        # By position, not +1: a run resumed mid-epoch starts at a later batch index.
        self._bar.update(batch_idx + 1 - self._bar.n)

    def on_train_epoch_end(self, trainer: "Trainer", metrics: Dict[str, float]) -> None:
        self._close_bar()
        if self._stats is not None:
            trainer.logger.info(self.epoch_summary(trainer, {**trainer.metrics, **metrics}))
        self._stats = None

    def on_fit_end(self, trainer: "Trainer") -> None:
        self._close_bar()

    def on_exception(self, trainer: "Trainer", exception: BaseException) -> None:
        self._close_bar()

    def epoch_summary(self, trainer: "Trainer", metrics: Dict[str, float]) -> str:
        """One line: epoch, losses and accuracies present in ``metrics``, img/s, wall time, data-wait share."""
        stats = self._stats if self._stats is not None else _EpochStats(self.smoothing)
        values = dict(metrics)
        if "train/loss" not in values and stats.mean_loss is not None:
            values["train/loss"] = stats.mean_loss
        parts = [f"{key} {_format_value(values[key])}" for key in _SUMMARY_KEYS if key in values]
        throughput = trainer.epoch_throughput
        parts += [
            f"train {throughput.images_per_second:.1f} img/s",
            f"wall {stats.elapsed:.1f}s",
            f"data wait {throughput.data_share:.0%}",
        ]
        loss_scale = trainer.precision.loss_scale
        if loss_scale is not None:
            parts.append(f"loss scale {loss_scale:g}")
        if trainer.nonfinite_steps:
            parts.append(f"skipped non-finite steps {trainer.nonfinite_steps}")
        return f"Epoch {trainer.epoch + 1}/{trainer.max_epochs} | " + " | ".join(parts)

    def _postfix(self, trainer: "Trainer", output: StepOutput) -> str:
        stats = self._stats
        assert stats is not None
        loss = stats.smoothed_loss
        fields = [
            f"step={trainer.global_step}",
            f"loss={_format_value(loss) if loss is not None else 'nan'}",
            f"lr={output.lr:.3g}",
            f"img/s={trainer.epoch_throughput.images_per_second:.0f}",
            f"data={trainer.epoch_throughput.data_share:.0%}",
        ]
        if trainer.nonfinite_steps:
            fields.append(f"skipped={trainer.nonfinite_steps}")
        return " ".join(fields)

    def _close_bar(self) -> None:
        if self._bar is not None:
            self._bar.close()
            self._bar = None
