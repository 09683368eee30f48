"""``history.json`` in the run directory: one row per validation, with the wall time the run had spent to get there.

Time-to-accuracy (how many minutes until val/top1 first reached 0.94) needs the metrics of every validation with
the run's elapsed wall time. VisualDL records hold the metrics, but their timestamps count a pause between a kill
and the resume as training time. This callback keeps the rows in its checkpointed state, so a resumed run
continues the history of its checkpoint: rows written after that checkpoint (work the resume repeats) are replaced,
and ``wall_seconds`` adds this process's time to the time the run had spent up to the checkpoint. The minutes a
crash lost are therefore not counted; ``resumes`` says how often the run was continued.

Each row: ``epoch`` (1-based), ``global_step``, ``wall_seconds``, the epoch's ``train/*`` and ``val/*`` numbers, and
where the epoch's time went: ``seconds/train`` (its training loop: data wait, steps, per-step hooks) and
``seconds/validation``; the rest of the time between two rows' ``wall_seconds`` is the epoch-end work
(checkpoint, logs). Only the main rank writes the file; it is replaced whole at each validation.
"""
from __future__ import annotations

import math
import time
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

from paddletrain.checkpoint._fs import replace_json_atomically
from paddletrain.engine.callback import Callback
from paddletrain.registry import CALLBACKS

if TYPE_CHECKING:  # pragma: no cover
    from paddletrain.engine.trainer import Trainer

HISTORY_FILE = "history.json"


@CALLBACKS.register("history")
class MetricsHistory(Callback):
    """Writes ``<run dir>/history.json``: ``{"resumes": n, "rows": [...]}``, one row per validation."""

    @classmethod
    def check_options(cls, options: Mapping[str, Any]) -> None:
        filename = options.get("filename", HISTORY_FILE)
        if not filename or Path(filename).name != filename:
            raise ValueError(f"history filename must be a plain file name in the run directory, got {filename!r}")

    def __init__(self, filename: str = HISTORY_FILE) -> None:
        self.check_options({"filename": filename})
        self.filename = filename
        self.rows: list[dict[str, Any]] = []
        self.resumes = 0
        self._seconds_before = 0.0  # wall time of the run up to the checkpoint this process resumed from
        self._started: float | None = None
        self._epoch_started: float | None = None
        self._validation_started: float | None = None

    def wall_seconds(self) -> float:
        """The run's wall time so far: before the resumed checkpoint, plus this process's."""
        running = time.perf_counter() - self._started if self._started is not None else 0.0
        return self._seconds_before + running

    def on_fit_start(self, trainer: Trainer) -> None:
        self._started = time.perf_counter()

    def on_train_epoch_start(self, trainer: Trainer) -> None:
        self._epoch_started = time.perf_counter()

    def on_validation_start(self, trainer: Trainer) -> None:
        self._validation_started = time.perf_counter()

    def on_validation_end(self, trainer: Trainer, metrics: dict[str, float]) -> None:
        now = time.perf_counter()
        row: dict[str, Any] = {"epoch": trainer.epoch + 1, "global_step": trainer.global_step,
                               "wall_seconds": round(self.wall_seconds(), 3)}
        # The epoch's training metrics are the trainer's by now (validation runs before the epoch-end hooks).
        values = {**trainer.metrics, **metrics}
        row.update({k: float(v) for k, v in values.items() if k.startswith(("train/", "val/")) and _finite(v)})
        if self._epoch_started is not None and self._validation_started is not None:
            row["seconds/train"] = round(self._validation_started - self._epoch_started, 3)
        if self._validation_started is not None:
            row["seconds/validation"] = round(now - self._validation_started, 3)
        self._epoch_started = self._validation_started = None
        self.rows = [r for r in self.rows if r["global_step"] < trainer.global_step] + [row]
        if trainer.is_main and trainer.run_dir is not None:
            replace_json_atomically(Path(trainer.run_dir) / self.filename, self.state_dict())

    def state_dict(self) -> dict[str, Any]:
        return {"resumes": self.resumes, "wall_seconds": self.wall_seconds(), "rows": list(self.rows)}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.rows = [dict(row) for row in state.get("rows", [])]
        self.resumes = int(state.get("resumes", 0)) + 1
        self._seconds_before = float(state.get("wall_seconds", 0.0))
        self._started = time.perf_counter()


def _finite(value: Any) -> bool:
    return isinstance(value, (int, float)) and math.isfinite(value)


def time_to_reach(rows: list[dict[str, Any]], metric: str, target: float) -> float | None:
    """Wall seconds of the first row whose ``metric`` is at least ``target``; None when none is."""
    for row in rows:
        value = row.get(metric)
        if value is not None and value >= target:
            return float(row["wall_seconds"])
    return None
