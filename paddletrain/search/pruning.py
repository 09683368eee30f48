"""Pruning through the Trainer: every validation is reported to the run's Optuna trial, and a trial the pruner
judges poor stops cleanly.

The sweeper adds this callback to each trial's config by its class (``callbacks.optuna_pruning._target_``: no
registry entry, so nothing below the search wing imports it), with the study's storage and name, the trial's id
and the pruner. Rank 0 reports and asks; its verdict reaches every rank, which stop at the same
epoch's end. A pruned run keeps its checkpoints (the epoch's checkpoint is written after the verdict, at the
epoch's end), and says so in ``<run dir>/pruned.json`` (the epochs it trained, the global step it stopped at and the
value it was judged on), which the sweeper reads to count the trial as pruned, not failed.
"""
from __future__ import annotations

import json
import logging
import math
from pathlib import Path
from typing import Any

from paddletrain.engine.callback import Callback, TrainerView
from paddletrain.job import distributed

log = logging.getLogger("paddletrain")

PRUNED_FILE = "pruned.json"


def make_pruner(spec: dict[str, Any] | None) -> Any:
    """The Optuna pruner ``spec`` names (``{"name": "median", <its options>}``); ``none``/None: no pruning."""
    import optuna

    spec = dict(spec or {"name": "none"})
    name = str(spec.pop("name", "none")).lower()
    pruners = {"none": optuna.pruners.NopPruner, "median": optuna.pruners.MedianPruner,
               "hyperband": optuna.pruners.HyperbandPruner,
               "successive_halving": optuna.pruners.SuccessiveHalvingPruner,
               "percentile": optuna.pruners.PercentilePruner, "threshold": optuna.pruners.ThresholdPruner}
    if name not in pruners:
        raise ValueError(f"hydra.sweeper.pruner.name={name!r} is not one of {', '.join(pruners)}")
    return pruners[name](**spec)


class OptunaPruning(Callback):
    """Report ``monitor`` after every validation to trial ``trial_id`` of study ``study_name`` in ``storage``;
    stop the run when the pruner says so."""

    option_rules = {"trial_id": dict(ge=0)}

    def __init__(self, storage: str, study_name: str, trial_id: int, monitor: str = "val/top1",
                 pruner: dict[str, Any] | None = None) -> None:
        self.check_options({"trial_id": trial_id})
        self.storage, self.study_name, self.trial_id = storage, study_name, int(trial_id)
        self.monitor = monitor
        self.pruner_spec = dict(pruner or {})
        self._trial: Any = None

    def _optuna_trial(self) -> Any:
        if self._trial is None:
            import optuna

            from paddletrain.search.storage import open_storage

            study = optuna.load_study(study_name=self.study_name, storage=open_storage(self.storage),
                                      pruner=make_pruner(self.pruner_spec))
            self._trial = optuna.trial.Trial(study, self.trial_id)
        return self._trial

    def on_validation_end(self, trainer: TrainerView, metrics: dict[str, float]) -> None:
        verdict: dict[str, Any] | None = None
        if trainer.is_main:
            value = metrics.get(self.monitor)
            if value is not None and math.isfinite(value):
                trial = self._optuna_trial()
                epochs = trainer.epoch + 1  # the report's step: epochs trained (a pruner's resource)
                trial.report(float(value), step=epochs)
                if trial.should_prune():
                    verdict = {"pruned": True, "epochs": epochs, "global_step": trainer.global_step,
                               "monitor": self.monitor, "value": float(value)}
        if trainer.world_size > 1:
            verdict = distributed.broadcast_object(verdict)
        if verdict is None:
            return
        trainer.should_stop = True
        log.info("Optuna pruned this trial after epoch %d (%s=%.4f)", verdict["epochs"], self.monitor,
                 verdict["value"])
        if trainer.is_main and trainer.run_dir:
            (Path(trainer.run_dir) / PRUNED_FILE).write_text(json.dumps(verdict) + "\n")


def pruned_record(run_dir: Path) -> dict[str, Any] | None:
    """What ``pruned.json`` of a trial's run directory says, None when the trial was not pruned."""
    path = Path(run_dir) / PRUNED_FILE
    try:
        record = json.loads(path.read_text())
    except (OSError, ValueError):
        return None
    return record if isinstance(record, dict) and record.get("pruned") is True else None
