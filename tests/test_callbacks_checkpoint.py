"""ModelCheckpoint (paddletrain.callbacks.checkpoint): what it says when its monitored metric is missing."""
from __future__ import annotations

import logging

import pytest

from paddletrain.callbacks import ModelCheckpoint
from paddletrain.engine.callback import Callback
from paddletrain.engine.limits import Limits
from paddletrain.engine.trainer import Trainer
from tests.test_engine_trainer import linear_model, make_batches, sgd


def fit(tmp_path, caplog, monitor: str, val_every: int, validate: bool = True) -> list[str]:
    model = linear_model()
    saver = ModelCheckpoint(tmp_path / "ckpt", monitor=monitor, mode="max")
    trainer = Trainer(model, sgd(model), callbacks=[saver], limits=Limits(max_epochs=3, val_every_n_epochs=val_every))
    with caplog.at_level(logging.WARNING, logger="paddletrain"):
        trainer.fit(make_batches(2, 4), make_batches(2, 4, seed=1) if validate else None)
    return [r.getMessage() for r in caplog.records if "ModelCheckpoint" in r.getMessage()]


def test_epochs_without_validation_are_not_a_missing_metric(tmp_path, caplog):
    # Validated after epoch 2 and the last: epoch 1 has no val/ metric, which is what the user asked for.
    assert fit(tmp_path, caplog, "val/top1", val_every=2) == []
    assert (tmp_path / "ckpt" / "best.json").exists()


@pytest.mark.parametrize("val_every", [1, 2])
def test_a_misnamed_monitor_is_said_once_at_the_first_validation(tmp_path, caplog, val_every):
    said = fit(tmp_path, caplog, "val/accuracy", val_every=val_every)
    assert len(said) == 1
    assert "'val/accuracy' is not among this epoch's" in said[0] and "'val/top1'" in said[0]


def test_a_run_that_never_reports_its_monitor_says_so_at_its_end(tmp_path, caplog):
    said = fit(tmp_path, caplog, "val/top1", val_every=1, validate=False)
    assert said == ["ModelCheckpoint: monitored metric 'val/top1' was not reported by any epoch of this run "
                    "(no validation?); no checkpoint is ranked best by it"]


def test_an_epoch_that_does_not_validate_reports_no_validation_figures_and_is_not_ranked_by_them(tmp_path, caplog):
    # Validated after epochs 2 and 4 (val_every=2): epoch 3's weights were never scored, so neither its epoch-end
    # metrics nor its checkpoint may carry epoch 2's val/top1 as their own.
    model = linear_model()
    reported: list[dict[str, float]] = []

    class Record(Callback):
        def on_train_epoch_end(self, trainer, metrics):
            reported.append(dict(metrics))

    saver = ModelCheckpoint(tmp_path / "ckpt", monitor="val/top1", mode="max")
    trainer = Trainer(model, sgd(model), callbacks=[Record(), saver], limits=Limits(max_epochs=4, val_every_n_epochs=2))
    with caplog.at_level(logging.INFO, logger="paddletrain"):
        final = trainer.fit(make_batches(2, 4), make_batches(2, 4, seed=1))
    assert [any(key.startswith("val/") for key in epoch) for epoch in reported] == [False, True, False, True]
    assert all("train/loss" in epoch for epoch in reported)
    saved = [r.getMessage() for r in caplog.records if r.getMessage().startswith("Saved checkpoint")]
    assert [("val/top1=" in line) for line in saved] == [False, True, False, True]
    assert "val/top1" in final  # the last epoch validates, and the fit returns its figures
