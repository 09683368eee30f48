import io
import logging
import types

import pytest

from paddletrain.callbacks import ProgressBar, StepOutput
from paddletrain.metrics import Throughput


def make_trainer(**overrides):
    state = dict(
        epoch=0,
        max_epochs=3,
        global_step=0,
        num_train_batches=4,
        nonfinite_steps=0,
        precision=types.SimpleNamespace(loss_scale=None),
        metrics={},
        logger=logging.getLogger("paddletrain.test.progress"),
        epoch_throughput=Throughput(),
    )
    state.update(overrides)
    return types.SimpleNamespace(**state)


def step(loss, lr=0.1, batch_size=8, data_time=0.01, compute_time=0.03, finite=True):
    return StepOutput(loss=loss, batch_size=batch_size, lr=lr, stepped=True,
                      data_time=data_time, compute_time=compute_time, finite=finite)


def run_epoch(bar, trainer, losses, **step_kwargs):
    bar.on_train_epoch_start(trainer)
    trainer.epoch_throughput = Throughput()
    for i, loss in enumerate(losses):
        trainer.global_step += 1
        output = step(loss, **step_kwargs)
        trainer.epoch_throughput.add(output.batch_size, output.data_time, output.compute_time)  # as the Trainer does
        bar.on_train_batch_end(trainer, output, batch=None, batch_idx=i)


def test_bar_shows_epoch_step_loss_and_lr():
    out = io.StringIO()
    trainer = make_trainer(epoch=1)
    bar = ProgressBar(refresh_every=1, enabled=True, file=out, mininterval=0)
    run_epoch(bar, trainer, [2.0, 1.0, 1.0, 1.0], lr=0.05)
    text = out.getvalue()
    assert "Epoch 2/3" in text
    assert "step=4" in text
    assert "lr=0.05" in text
    assert "img/s=" in text and "data=25%" in text
    # The first displayed loss is exactly the first batch's (bias-corrected EMA, not pulled to 0).
    assert "loss=2 " in text


def test_epoch_summary_is_logged_with_val_metrics(caplog):
    trainer = make_trainer(metrics={"val/top1": 0.8125, "val/top5": 1.0})
    bar = ProgressBar(enabled=False)
    run_epoch(bar, trainer, [1.0, 3.0], data_time=0.1, compute_time=0.3)
    with caplog.at_level(logging.INFO, logger="paddletrain.test.progress"):
        bar.on_train_epoch_end(trainer, {"val/loss": 0.5})
    [record] = caplog.records
    line = record.getMessage()
    assert line.startswith("Epoch 1/3 | ")
    # Train loss falls back to the epoch mean of the batch losses when the trainer gives none.
    assert "train/loss 2 " in line
    assert "val/loss 0.5 " in line and "val/top1 0.8125" in line and "val/top5 1 " in line
    assert "img/s" in line and "data wait 25%" in line


def test_summary_prefers_trainer_train_loss_and_ignores_nonfinite_batches(caplog):
    trainer = make_trainer(nonfinite_steps=1)
    bar = ProgressBar(enabled=False)
    run_epoch(bar, trainer, [1.0, float("nan"), 3.0])
    assert "train/loss 2 " in bar.epoch_summary(trainer, {})
    with caplog.at_level(logging.INFO, logger="paddletrain.test.progress"):
        bar.on_train_epoch_end(trainer, {"train/loss": 0.25})
    assert "train/loss 0.25 " in caplog.records[0].getMessage()
    assert "skipped non-finite steps 1" in caplog.records[0].getMessage()


def test_no_tty_disables_bar_but_still_logs(caplog):
    out = io.StringIO()  # not a terminal
    trainer = make_trainer()
    bar = ProgressBar(refresh_every=1, file=out, mininterval=0)
    with caplog.at_level(logging.INFO, logger="paddletrain.test.progress"):
        run_epoch(bar, trainer, [1.0, 1.0])
        bar.on_train_epoch_end(trainer, {})
        bar.on_fit_end(trainer)
    assert out.getvalue() == ""
    assert len(caplog.records) == 1


def test_bar_resumed_mid_epoch_counts_from_the_batch_position():
    out = io.StringIO()
    trainer = make_trainer(num_train_batches=4)
    bar = ProgressBar(enabled=True, file=out, mininterval=0)
    bar.on_train_epoch_start(trainer)
    bar.on_train_batch_end(trainer, step(1.0), batch=None, batch_idx=2)
    assert "3/4" in out.getvalue()


def test_bar_closes_on_exception_and_unknown_length():
    out = io.StringIO()
    trainer = make_trainer(num_train_batches=None)
    bar = ProgressBar(enabled=True, file=out, mininterval=0)
    run_epoch(bar, trainer, [1.0])
    bar.on_exception(trainer, RuntimeError("boom"))
    assert bar._bar is None


@pytest.mark.parametrize("kwargs", [{"refresh_every": 0}, {"smoothing": 1.0}])
def test_bad_arguments_name_the_value(kwargs):
    with pytest.raises(ValueError, match=str(next(iter(kwargs.values())))):
        ProgressBar(**kwargs)


def test_summary_reports_loss_scale_and_skipped_steps(caplog):
    trainer = make_trainer(precision=types.SimpleNamespace(loss_scale=32768.0), nonfinite_steps=2)
    bar = ProgressBar(enabled=False)
    with caplog.at_level(logging.INFO, logger="paddletrain.test.progress"):
        run_epoch(bar, trainer, [1.0, 0.5])
        bar.on_train_epoch_end(trainer, {"train/loss": 0.75})
    line = caplog.records[-1].getMessage()
    assert "loss scale 32768" in line and "skipped non-finite steps 2" in line
