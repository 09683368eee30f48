"""Training curves, hyper-parameters and sample images in a VisualDL log.

VisualDL shows one log file per directory (the newest ``vdlrecords.*`` file; it does not merge files),
so a resumed run appends to the file it wrote before instead of starting a new one, after cutting off
what was written past the checkpoint: the curves then continue without a fold-back.
"""
from __future__ import annotations

import logging
import math
import os
import stat
from typing import TYPE_CHECKING, Any, Dict, Optional, Sequence

import numpy as np
from visualdl import LogWriter

from paddletrain.callbacks.base import Callback, StepOutput
from paddletrain.config import check_option
from paddletrain.metrics import Throughput
from paddletrain.registries import CALLBACKS

if TYPE_CHECKING:  # pragma: no cover
    from paddletrain.trainer import Trainer

log = logging.getLogger("paddletrain")

SAMPLES_TAG = "train/samples"
# Written from this logger's own per-interval measurements; the trainer's values of these are ignored.
_OWN_TRAIN_TAGS = ("train/loss", "train/lr", "train/throughput", "train/data_time_share")


def denormalize_images(images: Any, mean: Optional[Sequence[float]] = None,
                       std: Optional[Sequence[float]] = None, max_images: int = 16) -> np.ndarray:
    """Turns a normalised NCHW batch back into displayable NCHW ``uint8`` images.

    ``mean``/``std`` are per channel, in the [0, 1] pixel scale the normalisation used; without them
    float images are taken to be in [0, 1] already. Integer images are only clipped to [0, 255].
    """
    array = np.asarray(images)[:max_images]
    if array.ndim != 4 or array.shape[1] not in (1, 3, 4):
        raise ValueError(f"expected images of shape (N, C, H, W) with C in 1, 3 or 4; got {array.shape}")
    if np.issubdtype(array.dtype, np.integer):
        return np.clip(array, 0, 255).astype(np.uint8)
    array = array.astype(np.float32)
    channels = array.shape[1]
    for name, values in (("std", std), ("mean", mean)):
        if values is not None and len(values) not in (1, channels):
            raise ValueError(f"image {name} has {len(values)} values but the images have {channels} channels")
    if std is not None:
        array = array * np.asarray(std, dtype=np.float32).reshape(1, -1, 1, 1)
    if mean is not None:
        array = array + np.asarray(mean, dtype=np.float32).reshape(1, -1, 1, 1)
    return np.clip(np.rint(array * 255.0), 0, 255).astype(np.uint8)


def _batch_images(batch: Any) -> Any:
    """The image tensor of a batch: ``(images, labels, ...)``, ``{"image": ...}`` or the tensor itself."""
    if isinstance(batch, (list, tuple)):
        images = batch[0]
    elif isinstance(batch, dict):
        images = batch.get("image", batch.get("images"))
    else:
        images = batch
    return images.numpy() if hasattr(images, "numpy") else images


def _hparam_value(value: Any) -> Any:
    # VisualDL accepts only int, float and str (and rejects bool as an int).
    if isinstance(value, bool) or not isinstance(value, (int, float, str)):
        return str(value)
    return value


def _is_number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


class _Interval:
    """Sums over the batches since the last scalar write."""

    def __init__(self) -> None:
        self.loss_sum = 0.0
        self.loss_count = 0
        self.throughput = Throughput()

    def update(self, output: StepOutput) -> None:
        self.throughput.add(output.batch_size, output.data_time, output.compute_time)
        if output.finite and math.isfinite(output.loss):
            self.loss_sum += output.loss
            self.loss_count += 1

    def scalars(self) -> Dict[str, float]:
        values: Dict[str, float] = {}
        if self.loss_count:
            values["train/loss"] = self.loss_sum / self.loss_count
        if self.throughput.seconds > 0:
            values["train/throughput"] = self.throughput.images_per_second
            values["train/data_time_share"] = self.throughput.data_share
        return values


@CALLBACKS.register("visualdl")
class VisualDLLogger(Callback):
    """Writes scalars, hyper-parameters and a grid of sample training images with ``visualdl.LogWriter``.

    Scalars, at ``trainer.global_step`` every ``log_every_n_steps`` optimizer steps: ``train/loss``
    (mean over the interval), ``train/lr``, ``train/throughput`` (img/s), ``train/data_time_share``,
    every other ``train/*`` number in ``trainer.metrics`` (e.g. ``train/lr_group{i}``),
    ``amp/loss_scale`` (when a loss scaler is active) and ``amp/nonfinite_steps``; after each
    validation every ``val/*`` metric. ``train/*`` metrics that first appear at an epoch end (epoch
    aggregates such as ``train/top1``) are written once per epoch instead of repeating stale values.
    Hyper-parameters (``trainer.hparams``) and the image grid are written at the first training batch,
    once the log file is known (a resumed run appends).

    Args:
        logdir: Log directory; ``None`` uses ``<trainer.run_dir>/visualdl``.
        log_every_n_steps: Interval of the training scalars, in optimizer steps.
        log_images: Write up to ``max_images`` images of the first batch as one grid.
        mean, std: Per-channel normalisation of the images (in [0, 1] pixel scale), undone for display.
        hparam_metrics: Metric tags VisualDL's hyper-parameter view compares runs by.
    """

    main_process_only = True

    def __init__(
        self,
        logdir: Optional[str] = None,
        log_every_n_steps: int = 20,
        log_images: bool = True,
        mean: Optional[Sequence[float]] = None,
        std: Optional[Sequence[float]] = None,
        max_images: int = 16,
        hparam_metrics: Sequence[str] = ("val/top1", "val/loss"),
    ) -> None:
        check_option("log_every_n_steps", log_every_n_steps, ge=1)
        check_option("max_images", max_images, ge=1)
        self.logdir = logdir
        self.log_every_n_steps = log_every_n_steps
        self.log_images = log_images
        self.mean = list(mean) if mean is not None else None
        self.std = list(std) if std is not None else None
        self.max_images = max_images
        self.hparam_metrics = list(hparam_metrics)
        self.last_step: Optional[int] = None
        self._writer: Optional[LogWriter] = None
        self._file_name: Optional[str] = None
        self._resume_size: Optional[int] = None
        self._header_pending = True
        self._interval = _Interval()
        self._step_keys: set = set()
        self._epoch_keys: set = set()

    @property
    def file_path(self) -> Optional[str]:
        """Path of the log file being written (None before the first write)."""
        return self._writer.file_name if self._writer is not None else None

    def on_fit_start(self, trainer: "Trainer") -> None:
        self._resolve_logdir(trainer)
        self._header_pending = True
        self._interval = _Interval()

    def on_train_batch_start(self, trainer: "Trainer", batch: Any, batch_idx: int) -> None:
        if not self._header_pending:
            return
        self._header_pending = False
        # Opening here, not at fit start, lets a resume (load_state_dict) pick the file to append to.
        resumed = self._open(trainer)
        if resumed:  # hyper-parameters and samples are in the file already
            return
        if trainer.hparams:
            hparams = {k: _hparam_value(v) for k, v in trainer.hparams.items() if v is not None}
            self._writer.add_hparams(hparams, self.hparam_metrics)
        if self.log_images:
            self._log_samples(trainer, batch)

    def on_train_batch_end(self, trainer: "Trainer", output: StepOutput, batch: Any, batch_idx: int) -> None:
        self._interval.update(output)
        if not output.stepped or trainer.global_step % self.log_every_n_steps != 0:
            return
        scalars = {k: v for k, v in trainer.metrics.items() if k.startswith("train/") and _is_number(v)
                   and k not in self._epoch_keys and k not in _OWN_TRAIN_TAGS}
        self._step_keys.update(scalars)
        scalars.update(self._interval.scalars())
        scalars["train/lr"] = output.lr
        loss_scale = trainer.precision.loss_scale
        if loss_scale is not None:
            scalars["amp/loss_scale"] = loss_scale
        scalars["amp/nonfinite_steps"] = trainer.nonfinite_steps
        self._write_scalars(trainer, scalars)
        self._interval = _Interval()

    def on_train_epoch_end(self, trainer: "Trainer", metrics: Dict[str, float]) -> None:
        self._epoch_keys.update(k for k in metrics if k.startswith("train/")
                                and k not in self._step_keys and k not in _OWN_TRAIN_TAGS)
        self._write_scalars(trainer, {k: metrics[k] for k in self._epoch_keys if _is_number(metrics.get(k))})

    def on_validation_end(self, trainer: "Trainer", metrics: Dict[str, float]) -> None:
        values = {**trainer.metrics, **metrics}
        self._write_scalars(trainer, {k: v for k, v in values.items() if k.startswith("val/") and _is_number(v)})

    def on_fit_end(self, trainer: "Trainer") -> None:
        self.close()

    def on_exception(self, trainer: "Trainer", exception: BaseException) -> None:
        self.close()

    def close(self) -> None:
        """Flushes and closes the log file (the next write opens it again, appending)."""
        if self._writer is not None:
            self._writer.close()
            self._writer = None
            self._header_pending = False

    def state_dict(self) -> Dict[str, Any]:
        """The log file and how much of it this checkpoint covers (flushes pending records first)."""
        size = None
        if self._writer is not None:
            self._writer.flush()
            size = os.path.getsize(self._writer.file_name)
        elif self._file_name is not None and self.logdir is not None:
            path = os.path.join(self.logdir, self._file_name)
            size = os.path.getsize(path) if os.path.exists(path) else None
        return {"file_name": self._file_name, "file_size": size, "last_step": self.last_step,
                "epoch_keys": sorted(self._epoch_keys)}

    def load_state_dict(self, state: Dict[str, Any]) -> None:
        """Take the log file and size to continue from a checkpoint.

        The record is untrusted (anyone can hand over a run directory): one of the wrong types (a size or step
        that is not a non-negative integer) is ignored with a warning and the run starts a new log file. Where
        the file lies is checked when it is opened (:meth:`_resumable_file`), so resuming never writes to or
        cuts a file outside the log directory.
        """
        from paddletrain.checkpoint.untrusted import (StateValueError, checked_mapping, checked_optional_int,
                                                      checked_str, checked_str_list)

        if self._writer is not None:
            raise RuntimeError("VisualDLLogger state must be loaded before the first training batch")
        try:
            checked_mapping(state, "(VisualDL state)")
            file_name = checked_str(state.get("file_name"), "file_name", allow_none=True)
            resume_size = checked_optional_int(state.get("file_size"), "file_size")
            last_step = checked_optional_int(state.get("last_step"), "last_step")
            epoch_keys = checked_str_list(state.get("epoch_keys", []), "epoch_keys")
        except StateValueError as error:
            log.warning("VisualDLLogger: the checkpoint's log-file record is unusable (%s); writing a new log file",
                        error)
            self._file_name = self._resume_size = self.last_step = None
            return
        self._file_name, self._resume_size, self.last_step = file_name, resume_size, last_step
        self._epoch_keys = set(epoch_keys)

    def _resolve_logdir(self, trainer: "Trainer") -> None:
        if self.logdir is None:
            if trainer.run_dir is None:
                raise ValueError("VisualDLLogger needs a logdir: pass logdir=... or give the Trainer a run_dir")
            self.logdir = os.path.join(trainer.run_dir, "visualdl")

    def _open(self, trainer: "Trainer") -> bool:
        """Opens the writer; True when it appends to the file of a resumed run."""
        from paddletrain.checkpoint.untrusted import check_inside

        self._resolve_logdir(trainer)
        if trainer.run_dir is not None:
            # <run_dir>/visualdl must not be a symlink out of the run directory (files are written into it).
            check_inside(self.logdir, trainer.run_dir, "VisualDL log directory")
        os.makedirs(self.logdir, exist_ok=True)
        # Cut at most once: a later reopen must keep what this run has written since.
        resume_size, self._resume_size = self._resume_size, None
        path = self._resumable_file()
        if path is not None:
            if resume_size is not None and os.path.getsize(path) > resume_size:
                # Records past the checkpoint would fold the curves back when the steps repeat. O_NOFOLLOW: the
                # file checked above is the one cut, even if a symlink appeared in between.
                fd = os.open(path, os.O_RDWR | getattr(os, "O_NOFOLLOW", 0))
                try:
                    os.ftruncate(fd, resume_size)
                finally:
                    os.close(fd)
            self._writer = LogWriter(logdir=self.logdir, file_name=self._file_name)
            return True
        self._writer = LogWriter(logdir=self.logdir)
        self._file_name = os.path.basename(self._writer.file_name)
        return False

    def _resumable_file(self) -> Optional[str]:
        """The log file a resumed run appends to, if it is safe to: a regular file with a single link, inside
        the log directory once every symlink is resolved; otherwise None (with a warning) for a new file."""
        from paddletrain.checkpoint.untrusted import StateValueError, confined_path

        if not self._file_name:
            return None
        try:
            path = confined_path(self.logdir, self._file_name, "VisualDLLogger.file_name", plain_name=True)
            if not path.name.startswith("vdlrecords."):
                raise StateValueError("VisualDLLogger.file_name", f"is {path.name!r}: not a vdlrecords.* log file")
            info = os.lstat(path)
        except FileNotFoundError:
            return None
        except StateValueError as error:
            log.warning("VisualDLLogger: not appending to the checkpoint's log file (%s); writing a new one", error)
            return None
        if not stat.S_ISREG(info.st_mode) or info.st_nlink != 1:
            log.warning("VisualDLLogger: not appending to %s: it is not a regular file with a single link (a "
                        "hard link could reach a file outside the run directory); writing a new log file", path)
            return None
        return str(path)

    def _log_samples(self, trainer: "Trainer", batch: Any) -> None:
        try:
            images = denormalize_images(_batch_images(batch), self.mean, self.std, self.max_images)
        except (ValueError, TypeError) as error:
            # A picture is not worth stopping a run for: say why it is missing.
            trainer.logger.warning("VisualDLLogger: not logging sample images: %s", error)
            return
        # VisualDL tiles an NCHW batch into one HWC grid (8 per row).
        self._writer.add_image(SAMPLES_TAG, images, step=trainer.global_step, dataformats="NCHW")

    def _write_scalars(self, trainer: "Trainer", scalars: Dict[str, float]) -> None:
        if not scalars:
            return
        if self._writer is None:
            self._header_pending = False
            self._open(trainer)
        step = trainer.global_step
        for tag, value in scalars.items():
            self._writer.add_scalar(tag, float(value), step)
        self.last_step = step if self.last_step is None else max(self.last_step, step)
