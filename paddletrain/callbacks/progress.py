"""What a run shows while it trains: a tqdm bar per training epoch and per validation on a terminal, a
progress line every ``log_every_seconds`` in the log (and on the console when no bar is shown), and one line
per epoch."""
from __future__ import annotations

import contextlib
import math
import sys
import time
from typing import TYPE_CHECKING, Any, TextIO

from tqdm import tqdm

from paddletrain.console import FILE_ONLY, above_bar, format_duration
from paddletrain.engine.callback import Callback, StepOutput
from paddletrain.registry import CALLBACKS

if TYPE_CHECKING:  # pragma: no cover
    from paddletrain.engine.trainer import Trainer

# Keys shown in the epoch line, in this order, when the metrics hold them.
_SUMMARY_KEYS = ("train/loss", "val/loss", "val/top1", "val/top5", "val/balanced_accuracy", "val/mAP", "val/f1")


class _EpochStats:
    """Running totals for one epoch: cheap to update on every batch (plain float arithmetic)."""

    def __init__(self, smoothing: float, now: float, first_batch: int) -> None:
        self.smoothing = smoothing
        self.start = now
        self.first_batch = first_batch  # a run resumed mid-epoch starts later: the ETA counts from here
        self.loss_sum = 0.0
        self.loss_count = 0
        self.val_seconds = 0.0
        self._ema = 0.0
        self._ema_weight = 0.0

    def update(self, output: StepOutput) -> None:
        if output.finite and output.loss == output.loss:
            self.loss_sum += output.loss
            self.loss_count += 1
            self._ema = self.smoothing * self._ema + (1.0 - self.smoothing) * output.loss
            self._ema_weight = self.smoothing * self._ema_weight + (1.0 - self.smoothing)

    @property
    def smoothed_loss(self) -> float | None:
        # Bias-corrected EMA, so the first batches are not pulled towards zero.
        return self._ema / self._ema_weight if self._ema_weight > 0 else None

    @property
    def mean_loss(self) -> float | None:
        return self.loss_sum / self.loss_count if self.loss_count else None


def _format_value(value: float) -> str:
    return f"{value:.4g}"


def _position(done: int, total: int | None) -> str:
    """``[  12/50 ( 24%)]`` (timm's layout), or ``[  12/?]`` when the length is unknown."""
    if not total:
        return f"[{done:>4}/?]"
    width = len(str(total))
    return f"[{done:>{width}}/{total} ({done / total:4.0%})]"


@CALLBACKS.register("progress_bar")
class ProgressBar(Callback):
    """Shows the run's progress on a terminal and in logs.

    On a terminal: a bar per training epoch (epoch i/N, batches, step, smoothed loss, lr, img/s, data-wait
    share, ETA) and a bar per validation. In the log: a progress line every ``log_every_seconds`` during
    training and validation (on the console too when no bar is shown, e.g. CI logs, ``nohup``, ``> log``), and
    one line per epoch. The log file is the same with or without a terminal.

    Args:
        smoothing: EMA factor for the displayed loss (0 = last batch only).
        enabled: ``None`` shows the bars only when ``file`` is a terminal; ``True``/``False`` force them. The
            progress and epoch lines are logged either way.
        file: Stream for the bars; default ``sys.stdout`` (looked up when a bar opens).
        mininterval: Seconds between redraws of a bar and updates of its numbers.
        log_every_seconds: Seconds between progress lines in the log; ``None`` for none.
    """

    main_process_only = True
    # Wall clock of the bars and progress lines (replaced in tests).
    clock = staticmethod(time.perf_counter)

    option_rules = {"smoothing": dict(ge=0, lt=1), "mininterval": dict(ge=0), "log_every_seconds": dict(gt=0)}

    def __init__(
        self,
        smoothing: float = 0.98,
        enabled: bool | None = None,
        file: TextIO | None = None,
        mininterval: float = 0.5,
        log_every_seconds: float | None = 30.0,
    ) -> None:
        self.check_options({"smoothing": smoothing, "mininterval": mininterval, "log_every_seconds": log_every_seconds})
        self.smoothing = smoothing
        self.enabled = enabled
        self.file = file
        self.mininterval = mininterval
        self.log_every_seconds = log_every_seconds
        self._bar: tqdm | None = None
        self._val_bar: tqdm | None = None
        self._stats: _EpochStats | None = None
        self._output: contextlib.ExitStack | None = None
        self._postfix_at = -math.inf
        self._line_at = math.inf
        self._val_start = 0.0
        self._val_done = 0

    # ------------------------------------------------------------------ training
    def on_fit_start(self, trainer: Trainer) -> None:
        self._schedule_line()

    def on_train_epoch_start(self, trainer: Trainer) -> None:
        self._close_bars()
        now = self.clock()
        self._stats = _EpochStats(self.smoothing, now, trainer.batch_in_epoch)
        if self.log_every_seconds and self._line_at == math.inf:  # hooks driven without on_fit_start
            self._schedule_line()
        self._bar = self._open_bar(total=trainer.num_train_batches, initial=trainer.batch_in_epoch,
                                   desc=f"Epoch {trainer.epoch + 1}/{trainer.limits.max_epochs}", unit="batch")
        self._postfix_at = -math.inf

    def on_train_batch_end(self, trainer: Trainer, output: StepOutput, batch: Any, batch_idx: int) -> None:
        if self._stats is None:  # a batch outside an epoch hook pair: nothing to show
            return
        self._stats.update(output)
        now = self.clock()
        if self._bar is not None:
            if now - self._postfix_at >= self.mininterval:
                self._bar.set_postfix_str(self._postfix(trainer, output), refresh=False)
                self._postfix_at = now
            # By position, not +1: a run resumed mid-epoch starts at a later batch index.
            self._bar.update(batch_idx + 1 - self._bar.n)
        if now >= self._line_at:
            self._log_line(trainer, self.progress_line(trainer, output, batch_idx + 1, now))

    def on_train_epoch_end(self, trainer: Trainer, metrics: dict[str, float]) -> None:
        self._close_bars()
        if self._stats is not None:
            trainer.logger.info(self.epoch_summary(trainer, {**trainer.metrics, **metrics}))
        self._stats = None

    # ------------------------------------------------------------------ validation
    def on_validation_start(self, trainer: Trainer) -> None:
        self._val_start = self.clock()
        self._val_done = 0
        self._val_bar = self._open_bar(total=getattr(trainer, "num_val_batches", None), initial=0,
                                       desc=f"Validation {trainer.epoch + 1}/{trainer.limits.max_epochs}", unit="batch")

    def on_validation_batch_end(self, trainer: Trainer, batch: Any, batch_idx: int) -> None:
        self._val_done = batch_idx + 1
        if self._val_bar is not None:
            self._val_bar.update(self._val_done - self._val_bar.n)
        now = self.clock()
        if now >= self._line_at:
            self._log_line(trainer, self.validation_line(trainer, now))

    def on_validation_end(self, trainer: Trainer, metrics: dict[str, float]) -> None:
        if self._val_bar is not None:
            self._val_bar.close()
            self._val_bar = None
        if self._stats is not None:
            self._stats.val_seconds += self.clock() - self._val_start
        if self._bar is None:
            self._release_output()  # a validation outside a training epoch (Trainer.validate)

    # ------------------------------------------------------------------ end
    def on_fit_end(self, trainer: Trainer) -> None:
        self._close_bars()

    def on_exception(self, trainer: Trainer, exception: BaseException) -> None:
        self._close_bars()

    # ------------------------------------------------------------------ lines
    def epoch_summary(self, trainer: Trainer, metrics: dict[str, float]) -> str:
        """One line: epoch, losses and accuracies present in ``metrics``, training img/s (the Trainer's
        :class:`~paddletrain.metrics.Throughput` of the epoch), the epoch's wall time with its validation share,
        and the data-wait share."""
        stats = self._stats if self._stats is not None else _EpochStats(self.smoothing, self.clock(), 0)
        values = dict(metrics)
        if "train/loss" not in values and stats.mean_loss is not None:
            values["train/loss"] = stats.mean_loss
        parts = [f"{key} {_format_value(values[key])}" for key in _SUMMARY_KEYS if key in values]
        throughput = trainer.epoch_throughput
        wall = f"wall {self.clock() - stats.start:.1f}s"
        if stats.val_seconds:
            wall += f" (validation {stats.val_seconds:.1f}s)"
        parts += [
            f"train {throughput.images_per_second:.1f} img/s",
            wall,
            f"data wait {throughput.data_share:.0%}",
        ]
        loss_scale = trainer.precision.loss_scale
        if loss_scale is not None:
            parts.append(f"loss scale {loss_scale:g}")
        if trainer.nonfinite_steps:
            parts.append(f"skipped non-finite steps {trainer.nonfinite_steps}")
        return f"Epoch {trainer.epoch + 1}/{trainer.limits.max_epochs} | " + " | ".join(parts)

    def progress_line(self, trainer: Trainer, output: StepOutput, done: int, now: float) -> str:
        """``Train: epoch 3/5 [ 100/1251 (  8%)] loss 1.234 | lr 0.1 | 412.3 img/s | data 3% | elapsed ... | ETA ...``.
        """
        stats = self._stats
        assert stats is not None
        loss = stats.smoothed_loss
        throughput = trainer.epoch_throughput
        elapsed = now - stats.start
        parts = [f"loss {_format_value(loss) if loss is not None else 'nan'}", f"lr {output.lr:.3g}",
                 f"{throughput.images_per_second:.1f} img/s", f"data {throughput.data_share:.0%}",
                 f"elapsed {format_duration(elapsed)}"]
        total, ran = trainer.num_train_batches, done - stats.first_batch
        if total and ran > 0:
            parts.append(f"ETA {format_duration(elapsed / ran * (total - done))}")
        return (f"Train: epoch {trainer.epoch + 1}/{trainer.limits.max_epochs} {_position(done, total)} "
                + " | ".join(parts))

    def validation_line(self, trainer: Trainer, now: float) -> str:
        """``Validation: epoch 3/5 [ 40/100 ( 40%)] elapsed 0:00:31 | ETA 0:00:46``."""
        total, done, elapsed = getattr(trainer, "num_val_batches", None), self._val_done, now - self._val_start
        parts = [f"elapsed {format_duration(elapsed)}"]
        if total and done:
            parts.append(f"ETA {format_duration(elapsed / done * (total - done))}")
        return (f"Validation: epoch {trainer.epoch + 1}/{trainer.limits.max_epochs} {_position(done, total)} "
                + " | ".join(parts))

    def _postfix(self, trainer: Trainer, output: StepOutput) -> str:
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

    def _log_line(self, trainer: Trainer, line: str) -> None:
        # With a bar on the terminal the line is for the log file only: the bar shows the same numbers.
        shown = self._bar is not None or self._val_bar is not None
        trainer.logger.info(line, extra=FILE_ONLY if shown else None)
        self._schedule_line()

    def _schedule_line(self) -> None:
        self._line_at = self.clock() + self.log_every_seconds if self.log_every_seconds else math.inf

    # ------------------------------------------------------------------ bars
    def _open_bar(self, total: int | None, initial: int, desc: str, unit: str) -> tqdm | None:
        """A bar on ``file`` when it is shown (see ``enabled``), else None; log output goes above it."""
        file = self.file if self.file is not None else sys.stdout
        shown = self.enabled if self.enabled is not None else _is_terminal(file)
        if not shown:
            return None
        if self._output is None:
            self._output = contextlib.ExitStack()
            self._output.enter_context(above_bar())
        return tqdm(total=total, initial=initial, desc=desc, file=file, dynamic_ncols=True, leave=False,
                    mininterval=self.mininterval, unit=unit)

    def _close_bars(self) -> None:
        for bar in (self._val_bar, self._bar):
            if bar is not None:
                bar.close()
        self._bar = self._val_bar = None
        self._release_output()

    def _release_output(self) -> None:
        if self._output is not None:
            self._output.close()
            self._output = None


def _is_terminal(file: Any) -> bool:
    try:
        return bool(file.isatty())
    except (AttributeError, ValueError):  # no isatty, or a closed stream
        return False

