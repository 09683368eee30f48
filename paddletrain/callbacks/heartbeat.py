"""The rank side of the launcher's watchdog (:mod:`paddletrain.job.watchdog`): where this rank is, in a file.

The record's layout and the positions are the watchdog's (it reads them); this callback writes them.
"""
from __future__ import annotations

import json
import logging
import os
import time
from pathlib import Path
from typing import Any

from paddletrain.engine.callback import Callback
from paddletrain.job import distributed
from paddletrain.job.watchdog import (
    AFTER_VALIDATION,
    EPOCH_END,
    EPOCH_START,
    RECORD_BYTES,
    REFRESH_SECONDS,
    TRAINING,
    VALIDATION,
    heartbeat_path,
)

log = logging.getLogger("paddletrain")


class Heartbeat(Callback):
    """Writes where this rank is to ``<log_dir>/heartbeat.<rank>.json`` at every boundary of the loop.

    It is added after the configured callbacks (before the checkpointing ones), so work a callback does at a
    boundary counts as part of the phase before it.
    """

    def __init__(self, log_dir: str | Path, rank_id: int) -> None:
        self.path = heartbeat_path(Path(log_dir), rank_id)
        self.rank = rank_id
        self._fd: int | None = None
        self._beat = 0
        self._position: tuple = ()
        self._written_at = 0.0

    def _mark(self, position: tuple, where: str, refresh: bool = False, done: bool = False) -> None:
        now = time.monotonic()
        if refresh and position == self._position and now - self._written_at < REFRESH_SECONDS:
            return
        self._beat += 1
        self._position, self._written_at = position, now
        record = {"rank": self.rank, "beat": self._beat, "position": list(position), "where": where, "done": done}
        data = json.dumps(record).encode()[:RECORD_BYTES].ljust(RECORD_BYTES)  # JSON allows trailing blanks
        try:  # a reader catching a record half-written fails to parse it and reads again at its next poll
            if self._fd is None:
                self._fd = os.open(self.path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
            os.pwrite(self._fd, data, 0)
        except OSError as exc:  # the watchdog then sees no progress: say why here
            log.warning("cannot write heartbeat %s: %s", self.path, exc)

    def on_train_epoch_start(self, trainer: Any) -> None:
        self._mark((trainer.epoch, EPOCH_START, 0, 0), f"the start of epoch {trainer.epoch}")

    def on_train_batch_start(self, trainer: Any, batch: Any, batch_idx: int) -> None:
        self._mark((trainer.epoch, TRAINING, batch_idx, 0),
                   f"step {trainer.global_step + 1} of epoch {trainer.epoch} (batch {batch_idx}: forward, backward "
                   "and the gradient all_reduce)")

    def on_train_batch_end(self, trainer: Any, output: Any, batch: Any, batch_idx: int) -> None:
        self._mark((trainer.epoch, TRAINING, batch_idx, 1),
                   f"after step {trainer.global_step} of epoch {trainer.epoch} (batch {batch_idx}: the stop-check "
                   "all_reduce, then loading the next batch)")

    def on_validation_start(self, trainer: Any) -> None:
        self._mark((trainer.epoch, VALIDATION, 0, 0), f"the validation of epoch {trainer.epoch}")

    def on_validation_batch_end(self, trainer: Any, batch: Any, batch_idx: int) -> None:
        self._mark((trainer.epoch, VALIDATION, 0, 0), f"the validation of epoch {trainer.epoch}", refresh=True)

    def on_validation_end(self, trainer: Any, metrics: dict[str, float]) -> None:
        self._mark((trainer.epoch, AFTER_VALIDATION, 0, 0), f"after the validation of epoch {trainer.epoch}")

    def on_train_epoch_end(self, trainer: Any, metrics: dict[str, float]) -> None:
        self._mark((trainer.epoch, EPOCH_END, 0, 0), f"the end of epoch {trainer.epoch} (saving, then the next epoch)")

    def on_fit_end(self, trainer: Any) -> None:
        self._mark((), "finished", done=True)  # nothing left to watch, and not late either
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None


def heartbeat_callbacks(rank: int) -> list[Callback]:
    """The watchdog's heartbeat for a rank that paddletrain's launcher supervises; none otherwise."""
    log_dir = os.environ.get("PADDLE_LOG_DIR")
    if not (distributed.is_launched() and distributed.under_paddletrain_launcher() and log_dir):
        return []
    return [Heartbeat(log_dir, rank)]
