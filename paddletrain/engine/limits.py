"""The training loop's limits: how long it runs, how many batches it takes, how it steps.

One frozen object instead of eight constructor arguments, so the Trainer, ``build.py`` and the callbacks that
plan around the loop (progress bar, VisualDL's log interval) read the same values from one place::

    Trainer(model, optimizer, limits=Limits(max_epochs=10, accumulate_grad_batches=2))

Field names are the ``trainer.*`` config keys of the same meaning (``paddletrain.config.TrainerConfig``), so
``Limits.from_config`` fills them by name. The command lines' schema checks those keys with their ranges before
anything is built; ``__post_init__`` guards the Python API with plain ``ValueError``s.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, fields
from typing import Any


@dataclass(frozen=True)
class Limits:
    """When the loop stops and how it turns batches into optimizer steps.

    Args:
        max_epochs: epochs to train (0: ``fit`` trains nothing, e.g. to run only its hooks).
        max_steps: stop after this many optimizer steps, whichever of the two comes first; ``None``: no cap.
        accumulate_grad_batches: micro-batches per optimizer step, counted by batch index (the epoch's last batch
            always steps).
        grad_clip_norm: clip gradients by their global norm (on unscaled gradients); ``None``: no clipping.
        limit_train_batches / limit_val_batches: cap batches per epoch (smoke tests, debugging); ``None``: all.
        val_every_n_epochs: validate after every N-th epoch (and after the last); 0: no validation during fit.
        max_consecutive_nonfinite: stop with :class:`~paddletrain.errors.NonFiniteLossError` after this many
            skipped (non-finite) optimizer steps in a row.
    """

    max_epochs: int = 1
    max_steps: int | None = None
    accumulate_grad_batches: int = 1
    grad_clip_norm: float | None = None
    limit_train_batches: int | None = None
    limit_val_batches: int | None = None
    val_every_n_epochs: int = 1
    max_consecutive_nonfinite: int = 20

    @classmethod
    def from_config(cls, trainer: Any) -> Limits:
        """The limits of a ``trainer`` config node (``paddletrain.config.TrainerConfig``): each field from the key
        of the same name."""
        return cls(**{field.name: trainer[field.name] for field in fields(cls)})

    def __post_init__(self) -> None:
        _check_int("max_epochs", self.max_epochs, minimum=0)
        _check_int("max_steps", self.max_steps, minimum=1, optional=True)
        _check_int("accumulate_grad_batches", self.accumulate_grad_batches, minimum=1)
        _check_int("limit_train_batches", self.limit_train_batches, minimum=1, optional=True)
        _check_int("limit_val_batches", self.limit_val_batches, minimum=1, optional=True)
        _check_int("val_every_n_epochs", self.val_every_n_epochs, minimum=0)
        _check_int("max_consecutive_nonfinite", self.max_consecutive_nonfinite, minimum=1)
        clip = self.grad_clip_norm
        if clip is not None and (isinstance(clip, bool) or not isinstance(clip, (int, float))
                                 or not math.isfinite(clip) or clip <= 0):
            raise ValueError(f"grad_clip_norm must be a finite number > 0 or None, got {clip!r}")

    def validates_after(self, epoch: int, last_epoch: bool) -> bool:
        """Whether validation runs after ``epoch`` (0-based): every ``val_every_n_epochs``-th and the last one."""
        if not self.val_every_n_epochs:
            return False
        return (epoch + 1) % self.val_every_n_epochs == 0 or last_epoch

    def steps_exhausted(self, global_step: int) -> bool:
        """Whether ``max_steps`` optimizer steps have been taken."""
        return self.max_steps is not None and global_step >= self.max_steps


def _check_int(name: str, value: object, minimum: int, optional: bool = False) -> None:
    if value is None and optional:
        return
    # bool is an int to Python, but `max_epochs=True` is a mistake, not 1.
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        allowed = f"an int >= {minimum}" + (" or None" if optional else "")
        raise ValueError(f"{name} must be {allowed}, got {value!r}")
