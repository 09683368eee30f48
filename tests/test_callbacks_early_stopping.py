from __future__ import annotations

import json
import logging
import types

import pytest

from paddletrain.callbacks import EarlyStopping


def make_trainer(**overrides):
    state = dict(epoch=0, is_main=True, should_stop=False, metrics={},
                 logger=logging.getLogger("paddletrain.test.early_stopping"))
    state.update(overrides)
    return types.SimpleNamespace(**state)


def feed(callback, trainer, values, key="val/top1"):
    """Validate once per value; return the 0-based index of the validation that asked to stop, or None."""
    for epoch, value in enumerate(values):
        trainer.epoch = epoch
        callback.on_validation_end(trainer, {key: value})
        if trainer.should_stop:
            return epoch
    return None


def test_stops_after_patience_validations_without_improvement(caplog):
    callback = EarlyStopping(monitor="val/top1", mode="max", patience=2)
    trainer = make_trainer()
    with caplog.at_level(logging.INFO, logger="paddletrain.test.early_stopping"):
        stopped_at = feed(callback, trainer, [0.5, 0.6, 0.6, 0.55, 0.9])
    assert stopped_at == 3
    assert callback.best == 0.6 and callback.best_epoch == 1
    message = caplog.records[-1].getMessage()
    assert "val/top1" in message and "0.6 (epoch 2)" in message


def test_improvement_resets_the_wait_count():
    callback = EarlyStopping(patience=2)
    trainer = make_trainer()
    assert feed(callback, trainer, [0.5, 0.4, 0.6, 0.5, 0.7, 0.6]) is None
    assert callback.wait == 1 and callback.best == 0.7


def test_min_delta_requires_a_large_enough_gain():
    callback = EarlyStopping(patience=2, min_delta=0.05)
    trainer = make_trainer()
    # +0.03 and +0.04 over the best are too small; the count keeps running.
    assert feed(callback, trainer, [0.50, 0.53, 0.54]) == 2
    assert callback.best == 0.50


def test_mode_min_tracks_decreasing_loss():
    callback = EarlyStopping(monitor="val/loss", mode="min", patience=1)
    trainer = make_trainer()
    assert feed(callback, trainer, [1.0, 0.8, 0.7, 0.9], key="val/loss") == 3
    assert callback.best == 0.7


def test_nan_never_improves():
    callback = EarlyStopping(patience=2)
    trainer = make_trainer()
    assert feed(callback, trainer, [float("nan"), float("nan")]) == 1
    assert callback.best is None


def test_state_round_trip_survives_resume():
    callback = EarlyStopping(patience=3)
    trainer = make_trainer()
    feed(callback, trainer, [0.7, 0.6, 0.65])
    state = json.loads(json.dumps(callback.state_dict()))  # checkpoints store it as JSON
    restored = EarlyStopping(patience=3)
    restored.load_state_dict(state)
    assert (restored.best, restored.best_epoch, restored.wait) == (0.7, 0, 2)
    # One more non-improving validation reaches the patience only if the count survived.
    restored.on_validation_end(trainer, {"val/top1": 0.69})
    assert trainer.should_stop


def test_state_of_another_monitor_is_ignored():
    callback = EarlyStopping(monitor="val/top1")
    callback.load_state_dict({"monitor": "val/loss", "mode": "min", "best": 0.1, "best_epoch": 3, "wait": 5})
    assert callback.best is None and callback.wait == 0


def test_missing_monitor_names_key_and_available_metrics():
    callback = EarlyStopping(monitor="val/acc")
    trainer = make_trainer(metrics={"train/loss": 1.0})
    with pytest.raises(KeyError, match=r"'val/acc'.*\['train/loss', 'val/loss', 'val/top1'\]"):
        callback.on_validation_end(trainer, {"val/loss": 0.3, "val/top1": 0.9})


@pytest.mark.parametrize("kwargs, needle", [({"mode": "maximum"}, "maximum"), ({"patience": 0}, "patience"),
                                            ({"min_delta": -1.0}, "min_delta")])
def test_bad_arguments_are_rejected_with_their_name(kwargs, needle):
    with pytest.raises(ValueError, match=needle):
        EarlyStopping(**kwargs)
