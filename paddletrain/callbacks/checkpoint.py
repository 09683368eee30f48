"""ModelCheckpoint: writes the trainer's full state at epoch ends and every N steps, with retention."""
from __future__ import annotations

import hashlib
import json
import logging
from pathlib import Path
from typing import TYPE_CHECKING, Any, Dict, Optional

import paddle

from paddletrain import distributed
from paddletrain.callbacks.base import Callback, StepOutput

if TYPE_CHECKING:  # pragma: no cover
    from paddletrain.trainer import Trainer

log = logging.getLogger("paddletrain")


def _params_finite(model: paddle.nn.Layer) -> bool:
    flags = [paddle.isfinite(p).all() for p in model.parameters()]
    return bool(paddle.stack(flags).all()) if flags else True


class ModelCheckpoint(Callback):
    """Save complete, verifiable checkpoints of the trainer into ``dirpath``.

    Args:
        dirpath: directory holding one sub-directory per checkpoint.
        monitor / mode: metric ranking the best checkpoints (``val/top1``, ``max``).
        keep_last / keep_best: how many of the newest and of the best to keep.
        every_n_steps: also save mid-epoch every N optimizer steps.
        every_n_epochs: save at the end of every N-th epoch.
        extra_state: JSON-serialisable data stored alongside (e.g. the resolved config).
    """

    # Every rank takes part (the trainer's state gathers all ranks' RNG streams); only rank 0 writes.
    main_process_only = False
    run_last = True
    # Writes a checkpoint when a signal stops training (on_exception): the trainer's stop message says so.
    saves_on_interrupt = True

    def __init__(self, dirpath: str | Path, monitor: Optional[str] = "val/top1", mode: str = "max",
                 keep_last: int = 1, keep_best: int = 1, every_n_steps: Optional[int] = None,
                 every_n_epochs: int = 1, extra_state: Optional[Dict[str, Any]] = None) -> None:
        from paddletrain.checkpoint import CheckpointManager

        self.dirpath = Path(dirpath)
        self.monitor = monitor
        self.every_n_steps = every_n_steps
        self.every_n_epochs = every_n_epochs
        self.extra_state = extra_state or {}
        self.config_hash = hashlib.sha256(json.dumps(self.extra_state, sort_keys=True, default=str)
                                          .encode()).hexdigest()[:16]
        self.manager = CheckpointManager(self.dirpath, keep_last=keep_last, keep_best=keep_best,
                                         monitor=monitor, mode=mode)
        self.last_path: Optional[Path] = None
        self._warned_missing_monitor = False

    def on_fit_start(self, trainer: "Trainer") -> None:
        from paddletrain.checkpoint import check_writable
        from paddletrain.checkpoint.untrusted import check_inside

        if trainer.run_dir is not None:
            # Old checkpoints are deleted here: <run_dir>/checkpoints must not be a symlink out of the run.
            check_inside(self.dirpath, trainer.run_dir, "checkpoint directory")
        if trainer.is_main:
            check_writable(self.dirpath)
        resumed = getattr(trainer, "resumed_from", None)
        if resumed is not None:
            self.manager.protect(Path(resumed))

    def on_train_batch_end(self, trainer: "Trainer", output: StepOutput, batch: Any, batch_idx: int) -> None:
        if self.every_n_steps and output.stepped and trainer.global_step % self.every_n_steps == 0:
            self.save(trainer, metric=None)

    def on_train_epoch_end(self, trainer: "Trainer", metrics: Dict[str, float]) -> None:
        if (trainer.epoch + 1) % self.every_n_epochs == 0:
            metric = metrics.get(self.monitor) if self.monitor else None
            if self.monitor and metric is None and not self._warned_missing_monitor:
                log.warning("ModelCheckpoint: monitored metric %r is not among %s; checkpoints are ranked as worst",
                            self.monitor, sorted(metrics))
                self._warned_missing_monitor = True
            self.save(trainer, metric=metric)

    def on_exception(self, trainer: "Trainer", exception: BaseException) -> None:
        from paddletrain.errors import TrainingInterrupted

        # A signal stops training on a step boundary: save there so `trainer.resume=auto` continues exactly.
        if isinstance(exception, TrainingInterrupted):
            self.save(trainer, metric=None)

    def save(self, trainer: "Trainer", metric: Optional[float]) -> Optional[Path]:
        """Write one checkpoint now; refuses (and logs) when a parameter is NaN/inf so good ones survive."""
        if not _params_finite(trainer.module):
            log.error("Not saving a checkpoint at global step %d: the model has non-finite parameters; "
                      "the existing checkpoints are kept", trainer.global_step)
            return None
        state = trainer.state_dict()
        if not trainer.is_main:
            distributed.barrier()  # rank 0 writes; the others wait so no rank runs ahead of a checkpoint
            return None
        state.update(self.extra_state)
        for cb in trainer.callbacks:
            cb.on_save_checkpoint(trainer, state)
        metadata = {"epoch": trainer.epoch, "global_step": trainer.global_step,
                    "batch_in_epoch": trainer.batch_in_epoch, "epoch_finished": trainer.epoch_finished,
                    "monitor": self.monitor, "metric": metric, "config_hash": self.config_hash}
        # No "=" in the name: Hydra would read it as an override when the path is passed on the command line.
        name = f"epoch{trainer.epoch:04d}-step{trainer.global_step:07d}"
        try:
            self.last_path = self.manager.save(state, name=name, metadata=metadata, metric=metric)
        finally:
            if trainer.world_size > 1:
                distributed.barrier()
        log.info("Saved checkpoint %s%s", self.last_path,
                 f" ({self.monitor}={metric:.4f})" if metric is not None else "")
        return self.last_path

    def state_dict(self) -> Dict[str, Any]:
        return self.manager.state_dict()

    def load_state_dict(self, state: Dict[str, Any]) -> None:
        self.manager.load_state_dict(state)
