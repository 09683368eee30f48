"""Limits: the loop's limits in one frozen, validated object, filled from the trainer config by name."""
from __future__ import annotations

import dataclasses

import pytest

from paddletrain.config import TrainerConfig
from paddletrain.engine.limits import Limits
from tests.conftest import compose_fit


@pytest.mark.parametrize("field, value", [
    ("max_epochs", -1), ("max_epochs", 1.5), ("max_epochs", True), ("max_steps", 0),
    ("accumulate_grad_batches", 0), ("limit_train_batches", 0), ("limit_val_batches", -1),
    ("val_every_n_epochs", -1), ("max_consecutive_nonfinite", 0), ("grad_clip_norm", 0.0),
    ("grad_clip_norm", float("inf")), ("grad_clip_norm", "1"),
])
def test_rejects_a_bad_value_naming_its_field(field, value):
    with pytest.raises(ValueError, match=f"^{field} must be .*got {value!r}"):
        Limits(**{field: value})


def test_accepts_the_edges_and_is_frozen():
    limits = Limits(max_epochs=0, max_steps=1, val_every_n_epochs=0, grad_clip_norm=1e-3, limit_val_batches=1)
    assert (limits.max_epochs, limits.max_steps, limits.grad_clip_norm) == (0, 1, 1e-3)
    with pytest.raises(dataclasses.FrozenInstanceError):
        limits.max_epochs = 3  # type: ignore[misc]
    assert dataclasses.replace(limits, max_epochs=3).max_epochs == 3


@pytest.mark.parametrize("every, epoch, last, expected", [
    (1, 0, False, True), (2, 0, False, False), (2, 1, False, True), (2, 2, True, True), (0, 4, True, False),
])
def test_validates_every_n_epochs_and_after_the_last(every, epoch, last, expected):
    assert Limits(val_every_n_epochs=every).validates_after(epoch, last_epoch=last) is expected


def test_steps_exhausted_only_with_max_steps():
    assert not Limits().steps_exhausted(10**9)
    assert not Limits(max_steps=5).steps_exhausted(4)
    assert Limits(max_steps=5).steps_exhausted(5)


def test_every_field_is_a_trainer_config_key():
    """Limits.from_config fills Limits by field name: each one must be a key of the trainer schema."""
    keys = {field.name for field in dataclasses.fields(TrainerConfig)}
    assert {field.name for field in dataclasses.fields(Limits)} <= keys


def test_from_config_takes_the_configured_values():
    cfg = compose_fit(["trainer.max_epochs=7", "trainer.max_steps=30", "trainer.accumulate_grad_batches=3",
                       "trainer.grad_clip_norm=2.5", "trainer.limit_train_batches=4", "trainer.limit_val_batches=2",
                       "trainer.val_every_n_epochs=0", "trainer.max_consecutive_nonfinite=5"])
    assert Limits.from_config(cfg.trainer) == Limits(
        max_epochs=7, max_steps=30, accumulate_grad_batches=3, grad_clip_norm=2.5, limit_train_batches=4,
        limit_val_batches=2, val_every_n_epochs=0, max_consecutive_nonfinite=5)
