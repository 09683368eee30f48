"""A run's state, saved and loaded side by side: what a checkpoint holds, and every saved value checked before it
is put back.

:func:`save_state` is ``Trainer.state_dict``, :func:`load_state` is ``Trainer.load_state_dict`` and
:func:`restore` is ``Trainer.restore`` (a checkpoint opened, then loaded). They take the run's objects as
:class:`StateParts` and its position as :class:`Progress`, and none touches the trainer: it hands its parts over
and sets its own position from what they return. Which checkpoint a run resumes from, and whether it fits the
run's config, is :mod:`paddletrain.engine.resume`'s business; what "fits" means for each saved value,
:mod:`paddletrain.engine.state_checks`.
"""
from __future__ import annotations

import contextlib
import dataclasses
import logging
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from paddletrain.checkpoint import Checkpoint, load_checkpoint, rng_state, set_rng_state
from paddletrain.checkpoint.rng import check_rng_state
from paddletrain.checkpoint.storage import STATE
from paddletrain.checkpoint.untrusted import StateValueError
from paddletrain.engine.hooks import Stateful
from paddletrain.engine.optimizer_state import load_optimizer_state, optimizer_state, quiet_scheduler_restore
from paddletrain.engine.state_checks import check_optimizer_state, check_state_matches, training_state
from paddletrain.errors import UserError
from paddletrain.job import distributed
from paddletrain.job.runtime import seed_everything

log = logging.getLogger("paddletrain")


@dataclass
class Progress:
    """Where a run stands: the position to continue from is (epoch, batch_in_epoch); ``epoch_finished`` marks
    that the epoch's validation and end hooks have run."""

    epoch: int = 0
    batch_in_epoch: int = 0
    epoch_finished: bool = False
    global_step: int = 0
    nonfinite_steps: int = 0


@dataclass
class StateParts:
    """The objects whose state a checkpoint holds (``optimizer`` and ``scheduler`` are None when evaluating)."""

    module: Any
    optimizer: Any
    scheduler: Any
    precision: Any
    callbacks: Sequence[Any]
    # The training loader's batch sampler and the batch transform (Mixup/CutMix): saved when Stateful.
    sampler: Any
    batch_transform: Any
    rank: int
    world_size: int
    # A fresh meter for a stage ("train"), to check a saved mid-epoch meter before it is used.
    new_meter: Callable[[str], Any]


@dataclass
class Loaded:
    """What :func:`load_state` gives back for the trainer to set: its position, metrics and, when the epoch
    continues, the interrupted epoch's training meter."""

    progress: Progress
    metrics: dict[str, float]
    train_meter: dict[str, Any] | None


def save_state(parts: StateParts, progress: Progress, metrics: dict[str, float],
               train_meter: Any | None) -> dict[str, Any]:
    """Everything needed to continue exactly: weights, optimizer, scheduler, precision, callbacks (by their
    ``state_key``), progress, every rank's RNG, the sampler's position and the batch transform's draws.

    ``train_meter``: the running epoch's meter, saved when the epoch is not finished. With several ranks this
    gathers from all of them, so every rank calls it.
    """
    state: dict[str, Any] = {
        "model": parts.module.state_dict(),
        "precision": parts.precision.state_dict(),
        "progress": dataclasses.asdict(progress),
        # Every rank's RNG (dropout differs per rank), gathered so rank 0 can save them all.
        "rng": _gathered(rng_state(), parts.world_size),
        "callbacks": {cb.state_key: cb.state_dict() for cb in parts.callbacks},
        "metrics": dict(metrics),
    }
    if train_meter is not None and not progress.epoch_finished:
        state["train_meter"] = train_meter.state_dict()
    if parts.optimizer is not None:  # keyed by structured parameter names, which any process gives alike
        state["optimizer"] = optimizer_state(parts.optimizer, parts.module)
    if parts.scheduler is not None:
        state["scheduler"] = parts.scheduler.state_dict()
    if isinstance(parts.sampler, Stateful):
        state["sampler"] = parts.sampler.state_dict()
    if isinstance(parts.batch_transform, Stateful):  # each rank draws its own stream, like the RNGs
        state["batch_transform"] = _gathered(parts.batch_transform.state_dict(), parts.world_size)
    return state


def _gathered(value: Any, world_size: int) -> list[Any]:
    return distributed.all_gather_object(value) if world_size > 1 else [value]


def load_state(parts: StateParts, state: dict[str, Any]) -> Loaded:
    """Put back what :func:`save_state` produced into ``parts``; return the position to continue from.

    The model, optimizer, scheduler, progress counters, metrics and this rank's RNG state are checked before
    anything changes; a value that does not fit raises :class:`StateValueError` naming its key.
    """
    # Every part's type in one pass (an evaluating trainer has no optimizer and takes only the rest), then each
    # part against its object.
    state = training_state(parts.optimizer, parts.scheduler)(state, "")
    check_state_matches(parts.module, state["model"])
    if parts.optimizer is not None:
        check_optimizer_state(parts.optimizer, parts.module, state["optimizer"])
    saved, metrics, saved_rngs = state["progress"], state["metrics"], state["rng"]
    if len(saved_rngs) == parts.world_size:
        check_rng_state(saved_rngs[parts.rank], f"rng[{parts.rank}]")

    parts.module.set_state_dict(state["model"])
    if parts.optimizer is not None:
        load_optimizer_state(parts.optimizer, parts.module, state["optimizer"])
    if parts.scheduler is not None and "scheduler" in state:
        with quiet_scheduler_restore(parts.scheduler, state["scheduler"]):
            parts.scheduler.set_state_dict(state["scheduler"])
    with _restoring("precision"):
        parts.precision.load_state_dict(state.get("precision", {}))
    loaded = Loaded(_continued(saved), metrics, None)
    if loaded.progress.batch_in_epoch and state.get("train_meter") is not None:
        with _restoring("train_meter"):  # used when the epoch continues: check it now
            parts.new_meter("train").load_state_dict(state["train_meter"])
        loaded.train_meter = state["train_meter"]
    _load_loop_state(parts, state, saved_rngs, loaded.progress)
    return loaded


def _continued(saved: dict[str, Any]) -> Progress:
    """The position to continue from: after a finished epoch, the next one's first batch."""
    progress = Progress(global_step=saved["global_step"], nonfinite_steps=saved["nonfinite_steps"])
    if saved["epoch_finished"]:
        progress.epoch = saved["epoch"] + 1
    else:
        progress.epoch, progress.batch_in_epoch = saved["epoch"], saved["batch_in_epoch"]
    return progress


def _load_loop_state(parts: StateParts, state: dict[str, Any], saved_rngs: list, progress: Progress) -> None:
    """Callbacks, the sampler's position, the batch transform's draws and the RNG streams."""
    saved_callbacks = state["callbacks"]
    for cb in parts.callbacks:
        if cb.state_key in saved_callbacks:
            with _restoring(f"callbacks.{cb.state_key}"):
                cb.load_state_dict(saved_callbacks[cb.state_key])
    # After a finished epoch the next one starts from its first batch: only a mid-epoch position matters.
    if "sampler" in state and isinstance(parts.sampler, Stateful) and progress.batch_in_epoch:
        with _restoring("sampler"):
            parts.sampler.load_state_dict(state["sampler"])
    rank, world_size = parts.rank, parts.world_size
    saved_transform = state.get("batch_transform")
    if isinstance(parts.batch_transform, Stateful) and isinstance(saved_transform, list):
        if len(saved_transform) == world_size:
            with _restoring(f"batch_transform[{rank}]"):
                parts.batch_transform.load_state_dict(saved_transform[rank])
        else:
            log.warning("The checkpoint holds batch-transform states for %d rank(s), this run has %d: "
                        "Mixup/CutMix draws start afresh", len(saved_transform), world_size)
    if len(saved_rngs) == world_size:
        set_rng_state(saved_rngs[rank], f"rng[{rank}]")
    else:
        # Another world size: there is no saved stream for this rank, so derive a deterministic one.
        seed_everything(hash((len(saved_rngs), rank, progress.global_step)) % (2**31))
        log.warning("The checkpoint holds RNG states for %d rank(s), this run has %d: random streams are "
                    "reseeded from (rank, global step)", len(saved_rngs), world_size)


def restore(checkpoint: Any, parts: StateParts,
            before: Callable[[dict[str, Any]], None]) -> tuple[Path, Loaded]:
    """Open ``checkpoint`` (a directory, read and checked, or a loaded
    :class:`~paddletrain.checkpoint.Checkpoint`), hand its state to ``before`` (the callbacks'
    ``on_load_checkpoint``), then put it back into ``parts`` (:func:`load_state`); returns its path and what to
    continue from.

    Errors in one line: a value that does not fit names the checkpoint's ``state.json`` and its key; any other
    user error says which checkpoint could not be resumed from.
    """
    checkpoint = checkpoint if isinstance(checkpoint, Checkpoint) else load_checkpoint(checkpoint)
    try:
        before(checkpoint.state)
        return checkpoint.path, load_state(parts, checkpoint.state)
    except StateValueError as error:
        raise error.in_file(checkpoint.path / STATE) from error
    except UserError as error:
        raise UserError(f"cannot resume from {checkpoint.path}: {error}") from error


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
