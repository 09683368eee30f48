"""The end of a training run: ``summary.json`` in the run directory and a short table in the log.

Both come from one dict (:func:`run_summary`), so the table and the file always agree. The training throughput
is the Trainer's :class:`~paddletrain.metrics.Throughput` over this fit, the figure the epoch lines show per
epoch; the wall time is reported beside it, never mixed into it.
"""
from __future__ import annotations

import json
import logging
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from paddletrain.checkpoint import CheckpointError
from paddletrain.checkpoint.manifest import read_manifest
from paddletrain.console import format_duration

log = logging.getLogger("paddletrain")

SUMMARY_FILE = "summary.json"
# Metrics on the "last" line of the table, in this order, when the run has them (val/mAP, val/f1: multi-label).
LAST_METRICS = ("train/loss", "val/loss", "val/top1", "val/top5", "val/balanced_accuracy", "val/mAP", "val/f1")


@dataclass(frozen=True)
class TrainingArithmetic:
    """A run's training FLOPs an image (:func:`paddletrain.models.flops.training_flops_per_image`) and the images
    an epoch trains on all ranks (None: a stream of unknown length)."""

    flops_per_image: int
    images_per_epoch: int | None

    def pflop(self, epochs: int) -> float | None:
        """The arithmetic of ``epochs`` whole epochs, in PFLOP (10^15)."""
        if self.images_per_epoch is None:
            return None
        return self.flops_per_image * self.images_per_epoch * epochs / 1e15


def run_summary(run_dir: Path, metrics: dict[str, float], trainer: Any,
                arithmetic: TrainingArithmetic | None = None) -> dict[str, Any]:
    """What ``summary.json`` holds.

    Flat keys (read by tests and tools): ``epochs``, ``global_step``, ``nonfinite_steps``, ``world_size``, every
    final metric, ``train/throughput`` and ``train/data_time_share`` of the whole fit (this process's: per rank),
    ``train/images`` and ``train/step_seconds`` (what the throughput divides), ``wall_seconds`` (the fit's wall
    time, validation and checkpoints included), and with ``arithmetic`` ``train/mflop_per_image`` and
    ``train/pflop`` (that times the images of the epochs trained: the training arithmetic of the run). Nested:
    ``best`` (monitored metric, its value, 1-based epoch, global step and checkpoint), ``last_checkpoint``,
    ``paths`` (run directory, log file, VisualDL directory), and from the last validation ``val/classes`` (the
    class names, in class order), ``val/per_class`` (``{class name: {precision, recall, f1, support}}``) and
    ``val/confusion_matrix`` (rows: true class, columns: predicted, in class order; up to
    :data:`~paddletrain.metrics.MAX_CONFUSION_CLASSES` classes).
    """
    throughput = trainer.run_throughput
    summary: dict[str, Any] = {"epochs": trainer.epoch, "global_step": trainer.global_step,
                               "nonfinite_steps": trainer.nonfinite_steps, "world_size": trainer.world_size,
                               **metrics}
    if throughput.images:
        summary["train/throughput"] = throughput.images_per_second
        summary["train/data_time_share"] = throughput.data_share
    summary["train/images"] = throughput.images
    summary["train/step_seconds"] = throughput.seconds
    summary["wall_seconds"] = trainer.fit_seconds
    if arithmetic is not None:
        summary["train/mflop_per_image"] = round(arithmetic.flops_per_image / 1e6, 3)
        pflop = arithmetic.pflop(trainer.epoch)
        if pflop is not None:
            summary["train/pflop"] = pflop
    if getattr(trainer, "resumed_from", None):
        summary["resumed_from"] = str(trainer.resumed_from)
    best, last = _checkpoints(trainer)
    if best is not None:
        summary["best"] = best
    if last is not None:
        summary["last_checkpoint"] = last
    summary["paths"] = _paths(run_dir, trainer)
    report = getattr(trainer, "val_report", None)
    if report is not None:
        summary.update({f"val/{key}": value for key, value in report.to_dict().items()})
    return summary


def _checkpoints(trainer: Any) -> tuple[dict[str, Any] | None, str | None]:
    """The best checkpoint (from its own manifest: metric, epoch, step) and the newest one, from the first
    checkpointing callback of the run that kept one."""
    saver = next((cb for cb in trainer.checkpoint_callbacks if cb.newest_checkpoint() or cb.best_checkpoint()), None)
    if saver is None:
        return None, None
    last = saver.newest_checkpoint()
    best_path = saver.best_checkpoint()
    if best_path is None:
        return None, str(last) if last else None
    try:
        meta = read_manifest(best_path).get("metadata") or {}
    except CheckpointError as error:
        log.warning("cannot read the best checkpoint's record: %s", error)
        return None, str(last) if last else None
    epoch, value = meta.get("epoch"), meta.get("metric")
    best = {"monitor": meta.get("monitor", saver.monitor), "value": value,
            "epoch": epoch + 1 if isinstance(epoch, int) else None,  # 1-based, as the epoch lines count
            "global_step": meta.get("global_step"), "checkpoint": str(best_path)}
    return best, str(last) if last else None


def _paths(run_dir: Path, trainer: Any) -> dict[str, str]:
    paths = {"run_dir": str(run_dir)}
    logs = [Path(h.baseFilename) for h in logging.getLogger().handlers if isinstance(h, logging.FileHandler)]
    # The run's own log (Hydra's <job>.log) first, else wherever this process logs to.
    logs.sort(key=lambda path: Path(run_dir).resolve() not in path.resolve().parents)
    if logs:
        paths["log"] = str(logs[0])
    for callback in trainer.callbacks:
        for name, path in callback.run_files().items():
            paths.setdefault(name, str(path))
    return paths


def _duration(seconds: float) -> str:
    return f"{seconds:.1f} s" if seconds < 60 else format_duration(seconds)


def _flop(count: float) -> str:
    """``count`` FLOPs with the largest unit that keeps it at least 1 (PFLOP at most)."""
    for unit, scale in (("PFLOP", 1e15), ("TFLOP", 1e12), ("GFLOP", 1e9)):
        if count >= scale:
            return f"{count / scale:.3g} {unit}"
    return f"{count / 1e6:.3g} MFLOP"


def summary_table(summary: dict[str, Any]) -> list[str]:
    """The lines of the end-of-run table, from :func:`run_summary`'s dict."""
    steps = summary["global_step"]
    lines = [f"Summary: {summary['epochs']} epoch(s), {steps} optimizer step(s), "
             f"wall time {_duration(summary['wall_seconds'])}"]
    rows: list[tuple[str, str]] = []
    if "resumed_from" in summary:
        rows.append(("resumed from", summary["resumed_from"]))
    if "train/throughput" in summary:
        world, figure = summary.get("world_size", 1), summary["train/throughput"]
        detail = (f"{summary['train/images']} images in {_duration(summary['train/step_seconds'])} of training "
                  f"steps, data wait {summary['train/data_time_share']:.0%}")
        if world > 1:  # each rank measures its own steps
            rows.append(("training", f"{figure:.1f} img/s per rank (about {figure * world:.1f} for the {world} "
                                     f"ranks; {detail})"))
        else:
            rows.append(("training", f"{figure:.1f} img/s ({detail})"))
    if "train/pflop" in summary:
        rows.append(("arithmetic", f"{_flop(summary['train/pflop'] * 1e15)} ({summary['train/mflop_per_image']:.1f} "
                                   f"MFLOP an image, {summary['epochs']} epoch(s))"))
    best = summary.get("best")
    if best is not None:
        value = best["value"]
        shown = f"{value:.4f}" if isinstance(value, float) and math.isfinite(value) else str(value)
        epoch = f" at epoch {best['epoch']}" if best.get("epoch") else ""
        rows.append(("best", f"{best['monitor']} {shown}{epoch}: {best['checkpoint']}"))
    if summary.get("last_checkpoint") and (best is None or best["checkpoint"] != summary["last_checkpoint"]):
        rows.append(("last checkpoint", summary["last_checkpoint"]))
    last = [f"{key} {summary[key]:.4g}" for key in LAST_METRICS if isinstance(summary.get(key), (int, float))]
    if last:
        rows.append(("last metrics", " | ".join(last)))
    paths = summary["paths"]
    rows.append(("run dir", f"{paths['run_dir']} ({SUMMARY_FILE})"))
    if "log" in paths:
        rows.append(("log", paths["log"]))
    if "visualdl" in paths:
        rows.append(("VisualDL", f"visualdl --logdir {paths['visualdl']}"))
    width = max(len(label) for label, _ in rows)
    return lines + [f"  {label:<{width}}  {text}" for label, text in rows]


def summary_json(summary: dict[str, Any]) -> str:
    """``summary`` as indented JSON, top-level keys sorted (nested ones keep their order: ``val/per_class`` is in
    class order), each row of the confusion matrix on one line (indenting it would give one line per count: a
    million lines for 1000 classes)."""
    ordered = dict(sorted(summary.items()))
    matrix = summary.get("val/confusion_matrix")
    if matrix is None:
        return json.dumps(ordered, indent=2)
    marker = "@@confusion-matrix@@"
    text = json.dumps({**ordered, "val/confusion_matrix": marker}, indent=2)
    rows = ",\n".join("    " + json.dumps(row, separators=(",", ":")) for row in matrix)
    return text.replace(json.dumps(marker), "[\n" + rows + "\n  ]" if matrix else "[]", 1)


def write_summary(run_dir: Path, metrics: dict[str, float], trainer: Any,
                  arithmetic: TrainingArithmetic | None = None) -> dict[str, Any]:
    """Write ``summary.json`` and log the end-of-run table; returns the summary."""
    summary = run_summary(run_dir, metrics, trainer, arithmetic)
    (Path(run_dir) / SUMMARY_FILE).write_text(summary_json(summary))
    for line in summary_table(summary):
        log.info("%s", line)
    return summary
