"""Faults injected into real ranks by the tests, as callbacks given on the command line
(``'+callbacks.fault={_target_:tests.scripts.faults.KillOnce,rank:1,step:5,marker:/tmp/x}'``); the ranks import
this module, so the tests put the repository on their ``PYTHONPATH``."""
from __future__ import annotations

import os
import signal
import time
from pathlib import Path
from typing import Any

from paddletrain.engine.callback import Callback


class KillOnce(Callback):
    """``kill -9`` of rank ``rank`` right after optimizer step ``step``, once per ``marker`` file (a restarted
    job passes that step again and must not die again)."""

    def __init__(self, rank: int, step: int, marker: str) -> None:
        self.rank, self.step, self.marker = rank, step, Path(marker)

    @property
    def state_key(self) -> str:
        return "fault"

    def on_train_batch_end(self, trainer: Any, output: Any, batch: Any, batch_idx: int) -> None:
        if trainer.rank == self.rank and trainer.global_step == self.step and not self.marker.exists():
            self.marker.write_text(str(os.getpid()))
            os.kill(os.getpid(), signal.SIGKILL)


class SleepBeforeStep(Callback):
    """Rank ``rank`` sleeps ``seconds`` before optimizer step ``step``, while the others enter its gradient
    all_reduce."""

    def __init__(self, rank: int, step: int, seconds: float) -> None:
        self.rank, self.step, self.seconds = rank, step, seconds

    @property
    def state_key(self) -> str:
        return "fault"

    def on_train_batch_start(self, trainer: Any, batch: Any, batch_idx: int) -> None:
        if trainer.rank == self.rank and trainer.global_step + 1 == self.step:
            time.sleep(self.seconds)
