"""Training curves, hyper-parameters and sample images in a VisualDL log.

What VisualDL 2.5 does with a log, and what this logger does about it:

- Scalar charts are grouped by the part of the tag before the first ``/``; the groups are listed alphabetically
  (``lr``, ``system``, ``train``, ``val``) and only the first is open. Inside a group, charts keep the order their
  tags first appear in the file, so every write here is in one fixed order (:func:`tag_sort_key`): the charts
  line up the same way in every run.
- The hyper-parameter table reads a dotted name as a path (the column stays blank) and the parallel-coordinates
  view hangs for good when an axis name is wider than its column (its shortening loop cuts one character and
  appends three). Names are therefore short, with ``/`` (:func:`hparam_names`), and only as many are logged as
  fit (:func:`select_hparams`).
- The runs list shows a run's directory unless its log names the run: each run gets a display name that starts
  with what tells it apart, e.g. ``2026-11-23_13-37-00 resnet20-shapes`` (:func:`run_display_name`).
- Images are shown per tag with a step slider: the confusion matrix of every validation is one image under
  ``val/confusion_matrix`` (:func:`render_confusion_matrix`).
- One log file per directory is shown (the newest ``vdlrecords.*``; files are not merged), so a resumed run
  appends to the file it wrote before instead of starting a new one, after cutting off what was written past the
  checkpoint: the curves then continue without a fold-back.
"""
from __future__ import annotations

import contextlib
import io
import logging
import math
import os
import re
import stat
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
from PIL import Image, ImageDraw, ImageFont
from visualdl import LogWriter

from paddletrain.checkpoint.untrusted import (
    StateValueError,
    check_inside,
    checked_mapping,
    checked_optional_int,
    checked_str,
    checked_str_list,
    confined_path,
)
from paddletrain.engine.callback import Callback, StepOutput
from paddletrain.metrics import Throughput
from paddletrain.registry import CALLBACKS
from paddletrain.schedules import optimizer_steps_per_epoch

if TYPE_CHECKING:  # pragma: no cover
    from paddletrain.engine.trainer import Trainer

log = logging.getLogger("paddletrain")

SAMPLES_TAG = "train/samples"
CONFUSION_TAG = "val/confusion_matrix"
# The confusion matrix image: class names on its axes up to this many classes (more would not be readable), each
# cell's share written in it up to MAX_VALUED_CLASSES, and its cells together at most about MAX_MATRIX_PIXELS wide.
MAX_NAMED_CLASSES = 30
MAX_VALUED_CLASSES = 12
MAX_MATRIX_PIXELS = 800
# Trainer metrics this logger writes from its own per-interval measurements (the trainer's epoch values of these
# would repeat them), and the tags they are written under.
_OWN_TRAIN_TAGS = ("train/loss", "train/lr", "train/throughput", "train/data_time_share")
_RENAMED_TAGS = {"train/lr": "lr/lr", "train/throughput": "system/throughput",
                 "train/data_time_share": "system/data_time_share"}
# The order tags are written in (VisualDL keeps it inside a group): groups, then names within a group.
_GROUP_ORDER = ("train", "val", "lr", "system")
_NAME_ORDER = ("loss", "top1", "top5", "balanced_accuracy", "mAP", "f1", "lr", "throughput", "data_time_share",
               "loss_scale",
               "nonfinite_steps")

# A run of up to this many optimizer steps logs every step; a longer one about this many points per curve.
AUTO_LOG_POINTS = 1000

# Hyper-parameters VisualDL's comparison views stay usable with (the issue saw the parallel-coordinates view
# freeze from about 7 on); fewer are logged when their names are long (:func:`select_hparams`).
MAX_HPARAMS = 8
# VisualDL 2.5's parallel-coordinates view, measured in Chromium: the plot is about 832 px wide in a 1280 px
# window; each axis gets (width - 20) / axes px (at least 60) and its name must be narrower than that less 10 px.
# Names average 5-6 px a character in its 12 px font; 6.5 leaves room for wider fonts.
_PLOT_WIDTH_PX = 832
_AXIS_MIN_PX, _AXIS_MARGIN_PX, _NAME_MARGIN_PX, _PX_PER_CHAR = 60, 20, 10, 6.5


def scalar_tag(metric: str) -> str:
    """The VisualDL tag of a trainer metric: ``train/lr`` -> ``lr/lr``, ``train/lr_group1`` -> ``lr/group1``,
    ``train/throughput`` -> ``system/throughput``; every other name is its own tag."""
    if metric in _RENAMED_TAGS:
        return _RENAMED_TAGS[metric]
    group = re.fullmatch(r"train/lr_group(\d+)", metric)
    return f"lr/group{group[1]}" if group else metric


def tag_sort_key(tag: str) -> tuple:
    """Sort key of the fixed tag order: groups ``train``, ``val``, ``lr``, ``system`` (others after them, by name);
    inside a group loss, top1, top5, ... first, then by name with numbers in numeric order (group2 < group10)."""
    group, _, name = tag.partition("/")

    def rank(value: str, order: Sequence[str]) -> int:
        return order.index(value) if value in order else len(order)

    natural = tuple((0, int(part), "") if part.isdigit() else (1, 0, part) for part in re.split(r"(\d+)", name))
    return rank(group, _GROUP_ORDER), group, rank(name, _NAME_ORDER), natural


def auto_log_interval(num_batches: int | None, max_epochs: int, accumulate_grad_batches: int,
                      max_steps: int | None) -> int:
    """Optimizer steps between scalar writes for a run of this length: every step up to
    :data:`AUTO_LOG_POINTS` planned steps, else about that many points in all; every step when the length is
    unknown (a loader without ``len`` and no ``max_steps``)."""
    total = None
    if num_batches is not None:
        total = optimizer_steps_per_epoch(num_batches, accumulate_grad_batches) * max_epochs
    if max_steps is not None:
        total = max_steps if total is None else min(total, max_steps)
    if total is None:
        return 1
    return max(1, -(-total // AUTO_LOG_POINTS))


def hparam_names(keys: Sequence[str]) -> dict[str, str]:
    """Short, distinct VisualDL names for hyper-parameter keys: the last part of a dotted (or ``/``) key, with
    more parts, joined by ``/``, only where two keys would share a name; a trailing ``name`` names its group.

    ``optim.lr`` -> ``lr``, ``model.name`` -> ``model``, ``trainer.seed`` and ``data.shapes.seed`` ->
    ``trainer/seed`` and ``shapes/seed``.
    """
    parts = {}
    for key in keys:
        split = [p for p in re.split(r"[./]", key) if p]
        parts[key] = split[:-1] if len(split) > 1 and split[-1] == "name" else split

    def suffix(key: str, n: int) -> str:
        return "/".join(parts[key][-n:])

    names = {}
    for key in keys:
        n = 1
        while n < len(parts[key]) and any(suffix(other, n) == suffix(key, n) for other in keys if other != key):
            n += 1
        names[key] = suffix(key, n)
    if len(set(names.values())) < len(names):  # e.g. "model.name" beside a key "model": keep whole paths
        names = {key: "/".join(re.split(r"[./]", key)) for key in keys}
    return names


def _axes_fit(names: Sequence[str]) -> bool:
    """Whether VisualDL's parallel-coordinates view can draw axes with these names in a 1280 px window."""
    axis = max((_PLOT_WIDTH_PX - _AXIS_MARGIN_PX) / len(names), _AXIS_MIN_PX)
    return max(len(name) for name in names) * _PX_PER_CHAR <= axis - _NAME_MARGIN_PX


def _hparam_value(value: Any) -> int | float | str:
    # VisualDL accepts only int, float and str (and rejects bool as an int).
    if isinstance(value, bool) or not isinstance(value, (int, float, str)):
        return str(value)
    return value


def select_hparams(hparams: Mapping[str, Any], metrics: Sequence[str],
                   limit: int = MAX_HPARAMS) -> tuple[dict[str, int | float | str], list[str]]:
    """The hyper-parameters to log, by VisualDL name, and the keys left out.

    ``hparams`` come most important first (e.g. ``paddletrain.build.run_hparams``); ``None`` values are skipped.
    Each key is taken, in order, while at most ``limit`` are taken and every name, the ``metrics``' included,
    still fits its axis in the parallel-coordinates view.
    """
    keys = [key for key, value in hparams.items() if value is not None]
    names = hparam_names(keys)
    chosen: dict[str, int | float | str] = {}
    left_out: list[str] = []
    for key in keys:
        if len(chosen) < limit and _axes_fit([*chosen, names[key], *metrics]):
            chosen[names[key]] = _hparam_value(hparams[key])
        else:
            left_out.append(key)
    return chosen, left_out


def run_display_name(logdir: str) -> str:
    """The name VisualDL lists a run under: its directory's name first, which tells runs apart where the list
    cuts long names, then its parent's: ``outputs/resnet20-shapes/2026-11-23_13-37-00`` ->
    ``2026-11-23_13-37-00 resnet20-shapes``; a sweep job ``multirun/<name>/<time>/3`` -> ``#3 <time> <name>``.
    A log directory named ``visualdl`` stands for the run directory that holds it."""
    path = Path(os.path.abspath(logdir))
    if path.name == "visualdl":
        path = path.parent
    if path.name.isdigit():
        return " ".join([f"#{path.name}", path.parent.name, path.parent.parent.name]).strip()
    return f"{path.name} {path.parent.name}".strip()


def denormalize_images(images: Any, mean: Sequence[float] | None = None,
                       std: Sequence[float] | None = None, max_images: int = 16) -> np.ndarray:
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


# Colours of a row share of 0 and of 1 (white to the dark end of matplotlib's "Blues").
_EMPTY_RGB = np.array([255, 255, 255], np.float64)
_FULL_RGB = np.array([8, 48, 107], np.float64)


def render_confusion_matrix(matrix: Any, class_names: Sequence[str] | None = None,
                            max_named: int = MAX_NAMED_CLASSES, max_pixels: int = MAX_MATRIX_PIXELS) -> np.ndarray:
    """An HWC ``uint8`` image of a confusion matrix (rows: true class, columns: predicted), row-normalised: a
    cell's colour is the share of its true class predicted as that column (a class without samples stays white).

    Cells are square, at most 32 px and together at most about ``max_pixels`` wide (at least 1 px each). Up to
    ``max_named`` classes the names label the rows (true) and columns (predicted, written upwards), and up to
    :data:`MAX_VALUED_CLASSES` each cell shows its share.
    """
    counts = np.asarray(matrix, dtype=np.float64)
    n = counts.shape[0]
    if counts.ndim != 2 or counts.shape[1] != n or n == 0:
        raise ValueError(f"expected a square, non-empty confusion matrix; got shape {counts.shape}")
    totals = counts.sum(axis=1, keepdims=True)
    shares = np.divide(counts, totals, out=np.zeros_like(counts), where=totals > 0)
    cell = max(1, min(32, max_pixels // n))
    rgb = np.rint(_EMPTY_RGB + shares[..., None] * (_FULL_RGB - _EMPTY_RGB)).astype(np.uint8)
    cells = Image.fromarray(np.repeat(np.repeat(rgb, cell, axis=0), cell, axis=1), "RGB")
    if n > max_named:
        return np.asarray(cells)
    return np.asarray(_label_matrix(cells, shares, cell, list(class_names or range(n))[:n]))


def _label_matrix(cells: Image.Image, shares: np.ndarray, cell: int, names: list[Any]) -> Image.Image:
    """``cells`` with the class names on both axes and, for few classes, each cell's share written in it."""
    font = ImageFont.load_default()
    names = [str(name) for name in names] + [str(k) for k in range(len(names), len(shares))]
    measure = ImageDraw.Draw(Image.new("RGB", (1, 1)))
    widths = [measure.textbbox((0, 0), name, font=font)[2] for name in names + ["predicted"]]
    line = measure.textbbox((0, 0), "Ag", font=font)[3] + 2
    left, top = max(widths) + 8, max(widths) + line + 8
    canvas = Image.new("RGB", (left + cells.width + 4, top + cells.height + 4), "white")
    canvas.paste(cells, (left, top))
    draw = ImageDraw.Draw(canvas)
    draw.text((2, 2), "true \\ predicted", fill="black", font=font)
    for k, name in enumerate(names):
        middle = k * cell + cell // 2
        draw.text((left - 4 - measure.textbbox((0, 0), name, font=font)[2], top + middle - line // 2), name,
                  fill="black", font=font)
        label = Image.new("RGB", (measure.textbbox((0, 0), name, font=font)[2] + 2, line), "white")
        ImageDraw.Draw(label).text((1, 0), name, fill="black", font=font)
        label = label.rotate(90, expand=True)  # column names read upwards
        canvas.paste(label, (left + middle - label.width // 2, top - 4 - label.height))
    if len(shares) <= MAX_VALUED_CLASSES and cell >= 28:
        for (row, col), share in np.ndenumerate(shares):
            colour = "white" if share > 0.5 else "black"
            draw.text((left + col * cell + 2, top + row * cell + cell // 2 - line // 2), f"{share:.2f}"[1:]
                      if share < 1 else "1.0", fill=colour, font=font)
    return canvas


def _batch_images(batch: Any) -> Any:
    """The image tensor of a batch: ``(images, labels, ...)``, ``{"image": ...}`` or the tensor itself."""
    if isinstance(batch, (list, tuple)):
        images = batch[0]
    elif isinstance(batch, dict):
        images = batch.get("image", batch.get("images"))
    else:
        images = batch
    return images.numpy() if hasattr(images, "numpy") else images


def _is_number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


class _Interval:
    """Sums over the batches since the last scalar write."""

    def __init__(self) -> None:
        self.batches = 0
        self.loss_sum = 0.0
        self.loss_count = 0
        self.throughput = Throughput()

    def update(self, output: StepOutput) -> None:
        self.batches += 1
        self.throughput.add(output.batch_size, output.data_time, output.compute_time)
        if output.finite and math.isfinite(output.loss):
            self.loss_sum += output.loss
            self.loss_count += 1

    def scalars(self) -> dict[str, float]:
        values: dict[str, float] = {}
        if self.loss_count:
            values["train/loss"] = self.loss_sum / self.loss_count
        if self.throughput.seconds > 0:
            values["system/throughput"] = self.throughput.images_per_second
            values["system/data_time_share"] = self.throughput.data_share
        return values


@CALLBACKS.register("visualdl")
class VisualDLLogger(Callback):
    """Writes scalars, hyper-parameters and a grid of sample training images with ``visualdl.LogWriter``.

    Scalars, at ``trainer.global_step``, every ``log_every_n_steps`` optimizer steps and at the last step of every
    epoch (VisualDL groups charts by the tag's first part):

    - ``train/loss`` (mean over the interval), then once per epoch the trainer's epoch aggregates such as
      ``train/top1``; any other ``train/*`` number a callback publishes in ``trainer.metrics`` at each step;
    - ``val/*``: every validation metric, after each validation;
    - ``lr/lr`` (the rate the last batch trained with) and ``lr/group{i}`` (from ``train/lr_group{i}``, see
      :class:`~paddletrain.callbacks.LearningRateMonitor`);
    - ``system/throughput`` (training img/s over the interval), ``system/data_time_share``, and with AMP
      ``system/loss_scale`` (when a loss scaler is active) and ``system/nonfinite_steps`` (also in float32 once
      a step was skipped).

    Hyper-parameters (``trainer.hparams``, most important first; see :func:`select_hparams`) and the image grid
    are written at the first training batch, once the log file is known (a resumed run appends).

    Args:
        logdir: Log directory; ``None`` uses ``<trainer.run_dir>/visualdl``.
        log_every_n_steps: Interval of the training scalars, in optimizer steps; ``None`` chooses from the run's
            length (:func:`auto_log_interval`: every step up to 1000 steps).
        log_images: Write up to ``max_images`` images of the first batch as one grid.
        mean, std: Per-channel normalisation of the images (in [0, 1] pixel scale), undone for display.
        hparam_metrics: Metric tags VisualDL's hyper-parameter view compares runs by.
        log_confusion_matrix: Write the row-normalised confusion matrix of each validation as an image
            (``val/confusion_matrix``; :func:`render_confusion_matrix`), when the trainer kept one.
        display_name: The run's name in VisualDL's runs list; ``None``: :func:`run_display_name` of the logdir.
    """

    main_process_only = True

    option_rules = {"log_every_n_steps": dict(ge=1), "max_images": dict(ge=1)}

    def __init__(
        self,
        logdir: str | None = None,
        log_every_n_steps: int | None = None,
        log_images: bool = True,
        mean: Sequence[float] | None = None,
        std: Sequence[float] | None = None,
        max_images: int = 16,
        hparam_metrics: Sequence[str] = ("val/top1", "val/loss"),
        display_name: str | None = None,
        log_confusion_matrix: bool = True,
    ) -> None:
        self.check_options({"log_every_n_steps": log_every_n_steps, "max_images": max_images})
        self.logdir = logdir
        self.log_every_n_steps = log_every_n_steps
        self.log_images = log_images
        self.mean = list(mean) if mean is not None else None
        self.std = list(std) if std is not None else None
        self.max_images = max_images
        self.hparam_metrics = list(dict.fromkeys(hparam_metrics))  # monitor=val/loss names the loss twice
        self.display_name = display_name
        self.log_confusion_matrix = log_confusion_matrix
        self.last_step: int | None = None
        self.every_n_steps = log_every_n_steps or 1  # the steps between writes, resolved at fit start
        self._writer: LogWriter | None = None
        self._file_name: str | None = None
        self._resume_size: int | None = None
        self._header_pending = True
        self._pending = _Interval()
        self._last_lr: float | None = None
        self._train_step: int | None = None  # the step the training scalars were last written at
        self._step_keys: set[str] = set()
        self._epoch_keys: set[str] = set()

    @property
    def file_path(self) -> str | None:
        """Path of the log file being written (None before the first write)."""
        return self._writer.file_name if self._writer is not None else None

    def run_files(self) -> dict[str, Path]:
        return {"visualdl": Path(self.logdir)} if self.logdir else {}

    def on_fit_start(self, trainer: Trainer) -> None:
        self._resolve_logdir(trainer)
        self._header_pending = True
        self._pending = _Interval()
        self.every_n_steps = self.log_every_n_steps or auto_log_interval(
            trainer.num_train_batches, trainer.limits.max_epochs, trainer.limits.accumulate_grad_batches,
            trainer.limits.max_steps)

    def on_train_batch_start(self, trainer: Trainer, batch: Any, batch_idx: int) -> None:
        if not self._header_pending:
            return
        self._header_pending = False
        # Opening here, not at fit start, lets a resume (load_state_dict) pick the file to append to.
        resumed = self._open(trainer)
        if resumed:  # hyper-parameters and samples are in the file already
            return
        if trainer.hparams:
            hparams, left_out = select_hparams(trainer.hparams, self.hparam_metrics)
            if left_out:
                trainer.logger.info("VisualDL: %d hyper-parameters logged; left out so that its comparison views "
                                    "stay usable: %s", len(hparams), ", ".join(left_out))
            if hparams:
                self._writer.add_hparams(hparams, self.hparam_metrics)
        if self.log_images:
            self._log_samples(trainer, batch)

    def on_train_batch_end(self, trainer: Trainer, output: StepOutput, batch: Any, batch_idx: int) -> None:
        self._pending.update(output)
        self._last_lr = output.lr
        if not output.stepped:
            return
        last_of_epoch = trainer.num_train_batches is not None and batch_idx + 1 >= trainer.num_train_batches
        if trainer.global_step % self.every_n_steps == 0 or last_of_epoch:
            self._write_training(trainer)

    def on_train_epoch_end(self, trainer: Trainer, metrics: dict[str, float]) -> None:
        # An epoch cut short (max_steps, a stop) or of unknown length still ends with a point.
        if self._pending.batches and trainer.global_step != self._train_step:
            self._write_training(trainer)
        self._epoch_keys.update(k for k in metrics if k.startswith("train/")
                                and k not in self._step_keys and k not in _OWN_TRAIN_TAGS)
        self._write_scalars(trainer, {scalar_tag(k): metrics[k] for k in self._epoch_keys
                                      if _is_number(metrics.get(k))})

    def on_validation_end(self, trainer: Trainer, metrics: dict[str, float]) -> None:
        values = {**trainer.metrics, **metrics}
        self._write_scalars(trainer, {k: v for k, v in values.items() if k.startswith("val/") and _is_number(v)})
        report = getattr(trainer, "val_report", None)
        if self.log_confusion_matrix and report is not None and report.confusion is not None \
                and self._writer is not None:
            image = render_confusion_matrix(report.confusion, report.class_names)
            self._writer.add_image(CONFUSION_TAG, image, step=trainer.global_step, dataformats="HWC")

    def on_fit_end(self, trainer: Trainer) -> None:
        self.close()

    def on_exception(self, trainer: Trainer, exception: BaseException) -> None:
        self.close()

    def close(self) -> None:
        """Flushes and closes the log file (the next write opens it again, appending)."""
        if self._writer is not None:
            self._writer.close()
            self._writer = None
            self._header_pending = False

    def state_dict(self) -> dict[str, Any]:
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

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Take the log file and size to continue from a checkpoint.

        The record is untrusted (anyone can hand over a run directory): one of the wrong types (a size or step
        that is not a non-negative integer) is ignored with a warning and the run starts a new log file. Where
        the file lies is checked when it is opened (:meth:`_resumable_file`), so resuming never writes to or
        cuts a file outside the log directory.
        """
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

    def _write_training(self, trainer: Trainer) -> None:
        """The training scalars of the interval that ends at this step."""
        published = {k: v for k, v in trainer.metrics.items() if k.startswith("train/") and _is_number(v)
                     and k not in self._epoch_keys and k not in _OWN_TRAIN_TAGS}
        self._step_keys.update(published)
        scalars = {scalar_tag(k): v for k, v in published.items()}
        scalars.update(self._pending.scalars())
        if self._last_lr is not None:
            scalars["lr/lr"] = self._last_lr
        loss_scale = trainer.precision.loss_scale
        if loss_scale is not None:
            scalars["system/loss_scale"] = loss_scale
        if trainer.precision.enabled or trainer.nonfinite_steps:
            scalars["system/nonfinite_steps"] = trainer.nonfinite_steps
        self._write_scalars(trainer, scalars)
        self._train_step = trainer.global_step
        self._pending = _Interval()

    def _resolve_logdir(self, trainer: Trainer) -> None:
        if self.logdir is None:
            if trainer.run_dir is None:
                raise ValueError("VisualDLLogger needs a logdir: pass logdir=... or give the Trainer a run_dir")
            self.logdir = os.path.join(trainer.run_dir, "visualdl")

    def _new_writer(self, file_name: str = "") -> LogWriter:
        """A LogWriter for ``file_name`` (a new file when empty) that names the run."""
        display_name = self.display_name if self.display_name is not None else run_display_name(self.logdir)
        # VisualDL prints "`<file>` is exists, VisualDL will add logs to it." when it appends to a file: that is
        # what a resume means to do, so the line goes to the debug log instead of the terminal.
        with contextlib.redirect_stdout(io.StringIO()) as printed:
            writer = LogWriter(logdir=self.logdir, file_name=file_name, display_name=display_name)
        for line in printed.getvalue().splitlines():
            log.debug("VisualDL: %s", line)
        return writer

    def _open(self, trainer: Trainer) -> bool:
        """Opens the writer; True when it appends to the file of a resumed run."""
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
            self._writer = self._new_writer(self._file_name)
            return True
        self._writer = self._new_writer()
        self._file_name = os.path.basename(self._writer.file_name)
        return False

    def _resumable_file(self) -> str | None:
        """The log file a resumed run appends to, if it is safe to: a regular file with a single link, inside
        the log directory once every symlink is resolved; otherwise None (with a warning) for a new file."""
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

    def _log_samples(self, trainer: Trainer, batch: Any) -> None:
        try:
            images = denormalize_images(_batch_images(batch), self.mean, self.std, self.max_images)
        except (ValueError, TypeError) as error:
            # A picture is not worth stopping a run for: say why it is missing.
            trainer.logger.warning("VisualDLLogger: not logging sample images: %s", error)
            return
        # VisualDL tiles an NCHW batch into one HWC grid (8 per row).
        self._writer.add_image(SAMPLES_TAG, images, step=trainer.global_step, dataformats="NCHW")

    def _write_scalars(self, trainer: Trainer, scalars: dict[str, float]) -> None:
        if not scalars:
            return
        if self._writer is None:
            self._header_pending = False
            self._open(trainer)
        step = trainer.global_step
        for tag in sorted(scalars, key=tag_sort_key):  # VisualDL orders a group's charts by first appearance
            self._writer.add_scalar(tag, float(scalars[tag]), step)
        self.last_step = step if self.last_step is None else max(self.last_step, step)
