"""ModelCheckpoint: writes the trainer's full state at epoch ends and every N steps, with retention."""
from __future__ import annotations

import hashlib
import json
import logging
from pathlib import Path
from typing import TYPE_CHECKING, Any

import paddle

from paddletrain.checkpoint import CheckpointManager, check_writable
from paddletrain.checkpoint.untrusted import check_inside
from paddletrain.engine.callback import MODES, CheckpointCallback, StepOutput
from paddletrain.errors import ConfigError, FaultAfterWhichRunContinues, TrainingInterrupted
from paddletrain.job import distributed
from paddletrain.registry import CALLBACKS

if TYPE_CHECKING:  # pragma: no cover
    from paddletrain.engine.trainer import Trainer

log = logging.getLogger("paddletrain")


def _params_finite(model: paddle.nn.Layer) -> bool:
    flags = [paddle.isfinite(p).all() for p in model.parameters()]
    return bool(paddle.stack(flags).all()) if flags else True


@CALLBACKS.register("checkpoint")
class ModelCheckpoint(CheckpointCallback):
    """Save complete, verifiable checkpoints of the trainer into ``dirpath``.

    What is saved is :meth:`Trainer.checkpoint_state <paddletrain.engine.trainer.Trainer.checkpoint_state>`: the state
    of every stateful object, every callback's included, plus the trainer's ``checkpoint_extras`` (the
    resolved config and run facts under ``fit``) and this callback's ``extra_state``.

    Args:
        dirpath: directory holding one sub-directory per checkpoint; None: ``<trainer.run_dir>/checkpoints``.
        monitor / mode: metric ranking the best checkpoints (``val/top1``, ``max``).
        keep_last / keep_best: how many of the newest and of the best to keep.
        every_n_steps: also save mid-epoch every N optimizer steps.
        every_n_epochs: save at the end of every N-th epoch.
        extra_state: JSON-serialisable data stored alongside.
    """

    # Every rank takes part (the trainer's state gathers all ranks' RNG streams); only rank 0 writes.
    # Runs last and saves on a stop request: see CheckpointCallback.
    main_process_only = False

    option_rules = {"mode": dict(choices=MODES), "keep_last": dict(ge=1), "keep_best": dict(ge=0),
                    "every_n_steps": dict(ge=1), "every_n_epochs": dict(ge=1)}

    def __init__(self, dirpath: str | Path | None = None, monitor: str | None = "val/top1", mode: str = "max",
                 keep_last: int = 1, keep_best: int = 1, every_n_steps: int | None = None,
                 every_n_epochs: int = 1, extra_state: dict[str, Any] | None = None) -> None:
        self.check_options({"mode": mode, "keep_last": keep_last, "keep_best": keep_best,
                            "every_n_steps": every_n_steps, "every_n_epochs": every_n_epochs})
        self.dirpath = Path(dirpath) if dirpath is not None else None
        self.monitor = monitor
        self.mode = mode
        self.keep_last, self.keep_best = keep_last, keep_best
        self.every_n_steps = every_n_steps
        self.every_n_epochs = every_n_epochs
        self.extra_state = extra_state or {}
        self.manager: CheckpointManager | None = None
        self.last_path: Path | None = None
        self._warned_missing_monitor = False
        self._monitor_seen = False
        self._saved_manager_state: dict[str, Any] | None = None

    def setup(self, trainer: Trainer) -> None:
        if self.dirpath is None:
            if trainer.run_dir is None:
                raise ConfigError("ModelCheckpoint needs dirpath when the trainer has no run_dir")
            self.dirpath = Path(trainer.run_dir) / "checkpoints"
        if self.manager is None:
            self.manager = CheckpointManager(self.dirpath, keep_last=self.keep_last, keep_best=self.keep_best,
                                             monitor=self.monitor, mode=self.mode)

    def on_fit_start(self, trainer: Trainer) -> None:
        self.setup(trainer)  # a no-op after Trainer.fit's setup hook; here for callers that drive hooks by hand
        if trainer.run_dir is not None:
            # Old checkpoints are deleted here: <run_dir>/checkpoints must not be a symlink out of the run.
            check_inside(self.dirpath, trainer.run_dir, "checkpoint directory")
        if trainer.is_main:
            check_writable(self.dirpath)
        if trainer.resumed_from is not None:
            self.manager.protect(Path(trainer.resumed_from))

    def on_train_batch_end(self, trainer: Trainer, output: StepOutput, batch: Any, batch_idx: int) -> None:
        if self.every_n_steps and output.stepped and trainer.global_step % self.every_n_steps == 0:
            self.save(trainer, metric=None)

    def on_train_epoch_end(self, trainer: Trainer, metrics: dict[str, float]) -> None:
        if (trainer.epoch + 1) % self.every_n_epochs == 0:
            metric = metrics.get(self.monitor) if self.monitor else None
            # An epoch without validation (trainer.val_every_n_epochs > 1) has no val/ metric: expected, not said.
            # One whose metrics of the monitor's kind lack it has a misnamed monitor: said once, at once.
            kind = self.monitor.split("/")[0] if self.monitor else None
            self._monitor_seen = self._monitor_seen or metric is not None
            if metric is None and kind and any(key.split("/")[0] == kind for key in metrics):
                self._warn_missing_monitor(f"is not among this epoch's {sorted(metrics)}")
            self.save(trainer, metric=metric)

    def on_fit_end(self, trainer: Trainer) -> None:
        # A resumed run's earlier epochs may have reported it: their best checkpoint says so.
        if self.monitor and trainer.is_main and not self._monitor_seen and \
                (self.manager is None or self.manager.best_path is None):
            self._warn_missing_monitor("was not reported by any epoch of this run (no validation?)")

    def _warn_missing_monitor(self, why: str) -> None:
        if not self._warned_missing_monitor:
            log.warning("ModelCheckpoint: monitored metric %r %s; no checkpoint is ranked best by it", self.monitor,
                        why)
            self._warned_missing_monitor = True

    def on_exception(self, trainer: Trainer, exception: BaseException) -> None:
        # A signal stops training on a step boundary: save there so `trainer.resume=auto` continues exactly.
        if isinstance(exception, TrainingInterrupted):
            self.save(trainer, metric=None)
        elif isinstance(exception, FaultAfterWhichRunContinues) and trainer.world_size == 1:
            # A fault between steps (the data source): the steps trained so far are saved as a stop would save
            # them. With several ranks the others are inside a step, so the save could not meet them.
            saved = self.save(trainer, metric=None)
            exception.saved = str(saved) if saved is not None else None

    def save(self, trainer: Trainer, metric: float | None) -> Path | None:
        """Write one checkpoint now; refuses (and logs) when a parameter is NaN/inf so good ones survive."""
        if not _params_finite(trainer.module):
            log.error("Not saving a checkpoint at global step %d: the model has non-finite parameters; "
                      "the existing checkpoints are kept", trainer.global_step)
            return None
        state = trainer.checkpoint_state()
        if not trainer.is_main:
            distributed.barrier()  # rank 0 writes; the others wait so no rank runs ahead of a checkpoint
            return None
        state.update(self.extra_state)
        metadata = {"epoch": trainer.epoch, "global_step": trainer.global_step,
                    "batch_in_epoch": trainer.batch_in_epoch, "epoch_finished": trainer.epoch_finished,
                    "monitor": self.monitor, "metric": metric, "config_hash": config_hash(state)}
        try:
            self.last_path = self.manager.save(state, metadata=metadata, metric=metric)
        finally:
            if trainer.world_size > 1:
                distributed.barrier()
        log.info("Saved checkpoint %s%s", self.last_path,
                 f" ({self.monitor}={metric:.4f})" if metric is not None else "")
        return self.last_path

    def best_checkpoint(self) -> Path | None:
        return self.manager.best_path if self.manager is not None else None

    def newest_checkpoint(self) -> Path | None:
        return self.manager.last_path if self.manager is not None else None

    def state_dict(self) -> dict[str, Any]:
        return self.manager.state_dict() if self.manager is not None else {}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.manager.load_state_dict(state)


def config_hash(state: dict[str, Any]) -> str:
    """A short digest of the config a checkpoint was trained with (its ``config`` entry), to compare runs."""
    return hashlib.sha256(json.dumps(state.get("config"), sort_keys=True, default=str).encode()).hexdigest()[:16]
