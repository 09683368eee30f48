"""Putting a trainer back where a checkpoint left it: every saved value is checked, then loaded.

:func:`restore_checkpoint` is what ``Trainer.fit(ckpt_path=...)`` runs before its first epoch (and ``Trainer.restore``);
:func:`load_trainer_state` is ``Trainer.load_state_dict``. Which checkpoint a run resumes from, and whether it
fits the run's config, is :mod:`paddletrain.engine.resume`'s business; the state's layout is ``Trainer.state_dict``'s.
"""
from __future__ import annotations

import contextlib
import logging
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

from paddletrain.checkpoint import Checkpoint, load_checkpoint, set_rng_state
from paddletrain.checkpoint.rng import check_rng_state
from paddletrain.checkpoint.storage import STATE
from paddletrain.checkpoint.untrusted import StateValueError, checked_mapping, required
from paddletrain.engine.hooks import Stateful, batch_sampler_of
from paddletrain.engine.state_checks import (
    check_optimizer_state,
    check_scheduler_state,
    check_state_matches,
    checked_metrics,
    checked_progress,
)
from paddletrain.errors import UserError
from paddletrain.job.runtime import seed_everything

if TYPE_CHECKING:  # pragma: no cover
    from paddletrain.engine.trainer import Trainer

log = logging.getLogger("paddletrain")


def restore_checkpoint(trainer: Trainer, checkpoint: Any) -> None:
    """Load a checkpoint (a directory, or a :class:`~paddletrain.checkpoint.Checkpoint`) into ``trainer``.

    Callbacks' ``on_load_checkpoint`` see the state first. A value that does not fit is reported in one line
    naming the checkpoint's ``state.json`` and the key.
    """
    if not isinstance(checkpoint, Checkpoint):
        checkpoint = load_checkpoint(checkpoint)
    try:
        trainer.call_hook("on_load_checkpoint", checkpoint.state)
        load_trainer_state(trainer, checkpoint.state)
    except StateValueError as error:
        raise error.in_file(checkpoint.path / STATE) from error
    except UserError as error:
        raise UserError(f"cannot resume from {checkpoint.path}: {error}") from error
    trainer.resumed_from = str(checkpoint.path)
    log.info("Resumed from %s at epoch %d, batch %d, global step %d", trainer.resumed_from, trainer.epoch,
             trainer.batch_in_epoch, trainer.global_step)


def load_trainer_state(trainer: Trainer, state: dict[str, Any]) -> None:
    """Restore what ``Trainer.state_dict`` produced (callbacks by their ``state_key``).

    The model, optimizer, scheduler, progress counters, metrics and this rank's RNG state are checked before
    anything changes; a value that does not fit raises :class:`StateValueError` naming its key.
    """
    checked_mapping(state, "(the whole state)")
    check_state_matches(trainer.module, required(state, "model", "model"))
    if trainer.optimizer is not None:  # an evaluating trainer has none and takes only the rest
        check_optimizer_state(trainer.optimizer, trainer.module, required(state, "optimizer", "optimizer"))
    if trainer.scheduler is not None and "scheduler" in state:
        check_scheduler_state(trainer.scheduler, state["scheduler"])
    progress = checked_progress(required(state, "progress", "progress"))
    metrics = checked_metrics(state.get("metrics", {}))
    saved_rngs = required(state, "rng", "rng")
    if not isinstance(saved_rngs, list) or not saved_rngs:
        raise StateValueError("rng", "is not a list of per-rank random states")
    if len(saved_rngs) == trainer.world_size:
        check_rng_state(saved_rngs[trainer.rank], f"rng[{trainer.rank}]")

    trainer.module.set_state_dict(state["model"])
    if trainer.optimizer is not None:
        trainer.optimizer.set_state_dict(state["optimizer"])
    if trainer.scheduler is not None and "scheduler" in state:
        trainer.scheduler.set_state_dict(state["scheduler"])
    with _restoring("precision"):
        trainer.precision.load_state_dict(state.get("precision", {}))
    _load_progress(trainer, progress, metrics, state.get("train_meter"))
    _load_loop_state(trainer, state, saved_rngs)


def _load_progress(trainer: Trainer, progress: dict[str, Any], metrics: dict[str, float],
                   train_meter: Any) -> None:
    """The position to continue from, and the interrupted epoch's meter when the epoch continues."""
    trainer.global_step = progress["global_step"]
    trainer.nonfinite_steps = progress["nonfinite_steps"]
    if progress["epoch_finished"]:
        trainer.epoch, trainer.batch_in_epoch = progress["epoch"] + 1, 0
    else:
        trainer.epoch, trainer.batch_in_epoch = progress["epoch"], progress["batch_in_epoch"]
    trainer.metrics.update(metrics)
    trainer.resumed_train_meter = train_meter if trainer.batch_in_epoch else None
    if trainer.resumed_train_meter is not None:
        with _restoring("train_meter"):  # loaded when the epoch continues: check it now
            trainer.new_meter("train").load_state_dict(trainer.resumed_train_meter)


def _load_loop_state(trainer: Trainer, state: dict[str, Any], saved_rngs: list) -> None:
    """Callbacks, the sampler's position, the batch transform's draws and the RNG streams."""
    saved_callbacks = checked_mapping(state.get("callbacks", {}), "callbacks")
    for cb in trainer.callbacks:
        if cb.state_key in saved_callbacks:
            with _restoring(f"callbacks.{cb.state_key}"):
                cb.load_state_dict(saved_callbacks[cb.state_key])
    sampler = batch_sampler_of(trainer.train_loader)
    # After a finished epoch the next one starts from its first batch: only a mid-epoch position matters.
    if "sampler" in state and isinstance(sampler, Stateful) and trainer.batch_in_epoch:
        with _restoring("sampler"):
            sampler.load_state_dict(state["sampler"])
    rank, world_size = trainer.rank, trainer.world_size
    saved_transform = state.get("batch_transform")
    if isinstance(trainer.batch_transform, Stateful) and isinstance(saved_transform, list):
        if len(saved_transform) == world_size:
            with _restoring(f"batch_transform[{rank}]"):
                trainer.batch_transform.load_state_dict(saved_transform[rank])
        else:
            log.warning("The checkpoint holds batch-transform states for %d rank(s), this run has %d: "
                        "Mixup/CutMix draws start afresh", len(saved_transform), world_size)
    if len(saved_rngs) == world_size:
        set_rng_state(saved_rngs[rank], f"rng[{rank}]")
    else:
        # Another world size: there is no saved stream for this rank, so derive a deterministic one.
        seed_everything(hash((len(saved_rngs), rank, trainer.global_step)) % (2**31))
        log.warning("The checkpoint holds RNG states for %d rank(s), this run has %d: random streams are "
                    "reseeded from (rank, global step)", len(saved_rngs), world_size)


@contextlib.contextmanager
def _restoring(key: str) -> Iterator[None]:
    """Name ``key`` in any error a part's ``load_state_dict`` raises on a malformed saved value.

    A part that checks its input raises ``StateValueError`` with its own key (prefixed here); any other
    ``TypeError``/``ValueError``/``KeyError``... from a value of the wrong shape becomes one too, so a crafted or
    damaged checkpoint never ends in a traceback. ``UserError`` (e.g. a sampler that refuses another batch
    size) passes unchanged.
    """
    try:
        yield
    except StateValueError as error:
        raise error.under(key) from error
    except UserError:
        raise
    except (TypeError, ValueError, KeyError, IndexError, AttributeError) as error:
        raise StateValueError(key, f"cannot be restored ({type(error).__name__}: {error})") from error
