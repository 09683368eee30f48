"""ProgressBar: bars on a terminal, timed progress lines in the log, one line per epoch."""
from __future__ import annotations

import io
import logging
import re
import types

import pytest

from paddletrain.callbacks import ProgressBar, StepOutput
from paddletrain.engine.limits import Limits
from paddletrain.metrics import Throughput

LOGGER = "paddletrain.test.progress"


class FakeClock:
    """A clock the test advances by hand."""

    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def make_trainer(**overrides):
    state = dict(
        epoch=0,
        limits=Limits(max_epochs=3),
        global_step=0,
        batch_in_epoch=0,
        num_train_batches=4,
        num_val_batches=None,
        nonfinite_steps=0,
        precision=types.SimpleNamespace(loss_scale=None),
        metrics={},
        logger=logging.getLogger(LOGGER),
        epoch_throughput=Throughput(),
    )
    state.update(overrides)
    return types.SimpleNamespace(**state)


def make_bar(clock=None, **kwargs) -> ProgressBar:
    bar = ProgressBar(**kwargs)
    if clock is not None:
        bar.clock = clock
    return bar


def step(loss, lr=0.1, batch_size=8, data_time=0.01, compute_time=0.03, finite=True):
    return StepOutput(loss=loss, batch_size=batch_size, lr=lr, stepped=True,
                      data_time=data_time, compute_time=compute_time, finite=finite)


def run_epoch(bar, trainer, losses, clock=None, seconds_per_batch=0.0, **step_kwargs):
    bar.on_train_epoch_start(trainer)
    trainer.epoch_throughput = Throughput()
    for i, loss in enumerate(losses):
        if clock is not None:
            clock.now += seconds_per_batch
        trainer.global_step += 1
        output = step(loss, **step_kwargs)
        trainer.epoch_throughput.add(output.batch_size, output.data_time, output.compute_time)  # as the Trainer does
        bar.on_train_batch_end(trainer, output, batch=None, batch_idx=i)


def test_bar_shows_epoch_step_loss_and_lr():
    out = io.StringIO()
    trainer = make_trainer(epoch=1)
    bar = make_bar(enabled=True, file=out, mininterval=0)
    run_epoch(bar, trainer, [2.0, 1.0, 1.0, 1.0], lr=0.05)
    text = out.getvalue()
    assert "Epoch 2/3" in text
    assert "step=4" in text
    assert "lr=0.05" in text
    assert "img/s=" in text and "data=25%" in text
    # The first displayed loss is exactly the first batch's (bias-corrected EMA, not pulled to 0).
    assert "loss=2 " in text


def test_bar_numbers_refresh_by_time_not_by_batch_count():
    out = io.StringIO()
    clock = FakeClock()
    trainer = make_trainer(num_train_batches=100)
    bar = make_bar(clock, enabled=True, file=out, mininterval=0.5)
    bar.on_train_epoch_start(trainer)
    bar._bar.mininterval = 0  # tqdm redraws on every update here, so the text shows every postfix that was set
    shown = []
    for i in range(100):  # 100 batches of 0.1 s
        clock.now += 0.1
        trainer.global_step += 1
        bar.on_train_batch_end(trainer, step(1.0), batch=None, batch_idx=i)
        shown.append(int(re.findall(r"step=(\d+)", out.getvalue())[-1]))
    assert shown[0] == 1  # the first batch is shown at once
    # The numbers change every 0.5 s (every 5th batch here), never staler than that.
    assert len(set(shown)) == 20
    assert all(i + 1 - s < 5 for i, s in enumerate(shown))


def test_epoch_summary_is_logged_with_val_metrics(caplog):
    trainer = make_trainer(metrics={"val/top1": 0.8125, "val/top5": 1.0})
    bar = make_bar(enabled=False)
    run_epoch(bar, trainer, [1.0, 3.0], data_time=0.1, compute_time=0.3)
    with caplog.at_level(logging.INFO, logger=LOGGER):
        bar.on_train_epoch_end(trainer, {"val/loss": 0.5})
    [record] = caplog.records
    line = record.getMessage()
    assert line.startswith("Epoch 1/3 | ")
    # Train loss falls back to the epoch mean of the batch losses when the trainer gives none.
    assert "train/loss 2 " in line
    assert "val/loss 0.5 " in line and "val/top1 0.8125" in line and "val/top5 1 " in line
    # The training img/s is the Trainer's epoch throughput (16 images in 0.8 s of steps), wall time apart.
    assert "train 20.0 img/s" in line and "wall " in line and "data wait 25%" in line


def test_summary_prefers_trainer_train_loss_and_ignores_nonfinite_batches(caplog):
    trainer = make_trainer(nonfinite_steps=1)
    bar = make_bar(enabled=False)
    run_epoch(bar, trainer, [1.0, float("nan"), 3.0])
    assert "train/loss 2 " in bar.epoch_summary(trainer, {})
    with caplog.at_level(logging.INFO, logger=LOGGER):
        bar.on_train_epoch_end(trainer, {"train/loss": 0.25})
    assert "train/loss 0.25 " in caplog.records[0].getMessage()
    assert "skipped non-finite steps 1" in caplog.records[0].getMessage()


def test_no_tty_disables_bar_but_still_logs(caplog):
    out = io.StringIO()  # not a terminal
    trainer = make_trainer()
    bar = make_bar(file=out, mininterval=0)
    with caplog.at_level(logging.INFO, logger=LOGGER):
        run_epoch(bar, trainer, [1.0, 1.0])
        bar.on_train_epoch_end(trainer, {})
        bar.on_fit_end(trainer)
    assert out.getvalue() == ""
    assert len(caplog.records) == 1


def test_progress_lines_every_n_seconds_without_a_terminal(caplog):
    clock = FakeClock()
    trainer = make_trainer(num_train_batches=40)
    bar = make_bar(clock, file=io.StringIO(), log_every_seconds=1.0)
    with caplog.at_level(logging.INFO, logger=LOGGER):
        bar.on_fit_start(trainer)
        run_epoch(bar, trainer, [1.0] * 40, clock=clock, seconds_per_batch=0.25)  # 10 s
    lines = [r for r in caplog.records if r.getMessage().startswith("Train:")]
    assert len(lines) == 10  # one per second
    first = lines[0].getMessage()
    # timm's layout: position, percentage, then the numbers.
    assert first.startswith("Train: epoch 1/3 [ 4/40 ( 10%)] loss 1 | lr 0.1 | 200.0 img/s | data 25%"), first
    assert "elapsed 0:00:01 | ETA 0:00:09" in first
    # No bar on the console: the lines are for the console as well as the log file.
    assert all(getattr(r, "paddletrain_console", True) for r in lines)


def test_progress_lines_go_to_the_log_file_only_while_a_bar_is_shown(caplog):
    clock = FakeClock()
    trainer = make_trainer(num_train_batches=8)
    bar = make_bar(clock, enabled=True, file=io.StringIO(), log_every_seconds=1.0)
    with caplog.at_level(logging.INFO, logger=LOGGER):
        bar.on_fit_start(trainer)
        run_epoch(bar, trainer, [1.0] * 8, clock=clock, seconds_per_batch=0.5)
    lines = [r for r in caplog.records if r.getMessage().startswith("Train:")]
    assert len(lines) == 4 and all(r.paddletrain_console is False for r in lines)


def test_validation_has_its_own_bar_and_progress_lines(caplog):
    out = io.StringIO()
    clock = FakeClock()
    trainer = make_trainer(num_val_batches=6)
    bar = make_bar(clock, enabled=True, file=out, mininterval=0, log_every_seconds=2.0)
    with caplog.at_level(logging.INFO, logger=LOGGER):
        bar.on_fit_start(trainer)
        run_epoch(bar, trainer, [1.0, 1.0])
        bar.on_validation_start(trainer)
        for i in range(6):
            clock.now += 1.0
            bar.on_validation_batch_end(trainer, batch=None, batch_idx=i)
        assert "Validation 1/3" in out.getvalue() and "6/6" in out.getvalue()
        bar.on_validation_end(trainer, {"val/loss": 1.0})
        assert bar._val_bar is None
        bar.on_train_epoch_end(trainer, {"val/loss": 1.0})
    lines = [r.getMessage() for r in caplog.records if r.getMessage().startswith("Validation:")]
    assert lines == ["Validation: epoch 1/3 [2/6 ( 33%)] elapsed 0:00:02 | ETA 0:00:04",
                     "Validation: epoch 1/3 [4/6 ( 67%)] elapsed 0:00:04 | ETA 0:00:02",
                     "Validation: epoch 1/3 [6/6 (100%)] elapsed 0:00:06 | ETA 0:00:00"]
    # The epoch line says how much of the epoch's wall time validation took.
    assert "(validation 6.0s)" in caplog.records[-1].getMessage()


def test_bar_resumed_mid_epoch_counts_from_the_batch_position():
    out = io.StringIO()
    trainer = make_trainer(num_train_batches=4, batch_in_epoch=2)
    bar = make_bar(enabled=True, file=out, mininterval=0)
    bar.on_train_epoch_start(trainer)
    bar.on_train_batch_end(trainer, step(1.0), batch=None, batch_idx=2)
    assert "3/4" in out.getvalue()


def test_bar_closes_on_exception_and_unknown_length():
    out = io.StringIO()
    trainer = make_trainer(num_train_batches=None)
    bar = make_bar(enabled=True, file=out, mininterval=0)
    run_epoch(bar, trainer, [1.0])
    bar.on_exception(trainer, RuntimeError("boom"))
    assert bar._bar is None and bar._output is None


@pytest.mark.parametrize("kwargs", [{"log_every_seconds": 0}, {"smoothing": 1.0}, {"mininterval": -1}])
def test_bad_arguments_name_the_value(kwargs):
    name, value = next(iter(kwargs.items()))
    with pytest.raises(ValueError, match=name):
        ProgressBar(**kwargs)


def test_summary_reports_loss_scale_and_skipped_steps(caplog):
    trainer = make_trainer(precision=types.SimpleNamespace(loss_scale=32768.0), nonfinite_steps=2)
    bar = make_bar(enabled=False)
    with caplog.at_level(logging.INFO, logger=LOGGER):
        run_epoch(bar, trainer, [1.0, 0.5])
        bar.on_train_epoch_end(trainer, {"train/loss": 0.75})
    line = caplog.records[-1].getMessage()
    assert "loss scale 32768" in line and "skipped non-finite steps 2" in line
