"""Trainer behaviour on tiny models: learning, accumulation, clipping, hooks, non-finite guards, metrics."""
from __future__ import annotations

import logging
import os
import signal
import subprocess
import sys
import time

import numpy as np
import paddle
import pytest

from paddletrain.callbacks import ModelCheckpoint
from paddletrain.checkpoint import find_latest
from paddletrain.data.transforms.mixup import Mixup
from paddletrain.engine.callback import Callback, CheckpointCallback
from paddletrain.engine.limits import Limits
from paddletrain.engine.precision import Precision
from paddletrain.engine.trainer import NonFiniteLossError, Trainer
from paddletrain.errors import TrainingInterrupted, UserError
from paddletrain.job.processes import REPEAT_WINDOW
from paddletrain.losses import cross_entropy
from paddletrain.testing import FakeGradScaler


def make_batches(n_batches: int, batch_size: int, seed: int = 0, dim: int = 8, classes: int = 3):
    """Linearly separable blobs as a list of (x, y) batches."""
    rng = np.random.RandomState(seed)
    centers = rng.randn(classes, dim).astype("float32") * 3
    batches = []
    for _ in range(n_batches):
        y = rng.randint(0, classes, batch_size)
        x = centers[y] + rng.randn(batch_size, dim).astype("float32")
        batches.append((paddle.to_tensor(x), paddle.to_tensor(y.astype("int64"))))
    return batches


def linear_model(seed: int = 0, dim: int = 8, classes: int = 3) -> paddle.nn.Layer:
    paddle.seed(seed)
    return paddle.nn.Linear(dim, classes)


def sgd(model, lr=0.1):
    return paddle.optimizer.SGD(learning_rate=lr, parameters=model.parameters())


def params(model):
    return [p.numpy().copy() for p in model.parameters()]


def test_loss_decreases_and_accuracy_rises():
    model = linear_model()
    data = make_batches(10, 16)
    trainer = Trainer(model, sgd(model), limits=Limits(max_epochs=5), num_classes=3)
    first = trainer.validate(data)
    trainer.fit(data, data)
    last = trainer.metrics
    assert last["val/loss"] < first["val/loss"] * 0.5
    assert last["val/top1"] > 0.9
    assert "val/top5" not in last  # only 3 classes
    assert trainer.global_step == 50 and trainer.epoch == 5


def test_accumulation_equals_larger_batch():
    small = make_batches(8, 4, seed=1)
    pairs = zip(small[::2], small[1::2], strict=True)
    large = [(paddle.concat([a[0], b[0]]), paddle.concat([a[1], b[1]])) for a, b in pairs]
    m1, m2 = linear_model(3), linear_model(3)
    Trainer(m1, sgd(m1), limits=Limits(max_epochs=2, accumulate_grad_batches=2)).fit(small)
    t2 = Trainer(m2, sgd(m2), limits=Limits(max_epochs=2))
    t2.fit(large)
    for a, b in zip(params(m1), params(m2), strict=True):
        np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-6)
    assert t2.global_step == 8


def test_partial_accumulation_group_steps_at_epoch_end():
    model = linear_model()
    trainer = Trainer(model, sgd(model), limits=Limits(max_epochs=1, accumulate_grad_batches=4))
    trainer.fit(make_batches(6, 4))
    assert trainer.global_step == 2  # after batch 4 and after the last (6th) batch


def test_gradient_clipping_bounds_the_update():
    model = linear_model()
    before = params(model)
    data = make_batches(1, 16)
    # A huge learning rate makes the update equal lr * clipped gradient; its global norm must be lr * clip.
    trainer = Trainer(model, sgd(model, lr=1.0), limits=Limits(max_epochs=1, grad_clip_norm=0.01))
    trainer.fit(data)
    delta = np.sqrt(sum(((a - b) ** 2).sum() for a, b in zip(params(model), before, strict=True)))
    assert delta == pytest.approx(0.01, rel=1e-3)


@pytest.mark.parametrize("clip", [0.0, -1.0])
def test_a_bad_clip_norm_is_refused_when_the_trainer_is_built_not_at_each_step(clip):
    model = linear_model()
    with pytest.raises(ValueError, match=r"grad_clip_norm must be a finite number > 0 or None"):
        Trainer(model, sgd(model, lr=1.0), limits=Limits(max_epochs=1, grad_clip_norm=clip))


class Recorder(Callback):
    def __init__(self):
        self.events = []

    def on_fit_start(self, trainer):
        self.events.append("fit_start")

    def on_fit_end(self, trainer):
        self.events.append("fit_end")

    def on_train_epoch_start(self, trainer):
        self.events.append(f"epoch_start{trainer.epoch}")

    def on_train_epoch_end(self, trainer, metrics):
        self.events.append(f"epoch_end{trainer.epoch}")

    def on_train_batch_start(self, trainer, batch, batch_idx):
        self.events.append(f"batch_start{batch_idx}")

    def on_before_optimizer_step(self, trainer, optimizer):
        self.events.append("before_step")

    def on_train_batch_end(self, trainer, output, batch, batch_idx):
        self.events.append(f"batch_end{batch_idx}")

    def on_validation_start(self, trainer):
        self.events.append("val_start")

    def on_validation_end(self, trainer, metrics):
        self.events.append("val_end")

    def on_exception(self, trainer, exception):
        self.events.append(f"exception:{type(exception).__name__}")


def test_callback_hook_order():
    rec = Recorder()
    model = linear_model()
    Trainer(model, sgd(model), callbacks=[rec], limits=Limits(max_epochs=2, accumulate_grad_batches=2)).fit(
        make_batches(2, 4), make_batches(1, 4))
    epoch = ["batch_start0", "batch_end0", "batch_start1", "before_step", "batch_end1", "val_start", "val_end"]
    assert rec.events == (["fit_start", "epoch_start0"] + epoch + ["epoch_end0", "epoch_start1"] + epoch
                          + ["epoch_end1", "fit_end"])


def test_exception_hook_runs_and_exception_propagates():
    class Boom(Callback):
        def on_train_batch_end(self, trainer, output, batch, batch_idx):
            raise KeyError("boom")

    rec = Recorder()
    model = linear_model()
    with pytest.raises(KeyError):
        Trainer(model, sgd(model), callbacks=[rec, Boom()], limits=Limits(max_epochs=1)).fit(make_batches(2, 4))
    assert rec.events[-1] == "exception:KeyError"


def poisoned_loss(bad_steps):
    """Cross-entropy that returns inf on the listed calls (0-based)."""
    calls = {"n": 0}

    def loss_fn(logits, labels):
        loss = paddle.nn.functional.cross_entropy(logits, labels)
        n = calls["n"]
        calls["n"] += 1
        return loss * float("inf") if n in bad_steps else loss

    return loss_fn


def test_nonfinite_loss_skips_step_keeps_weights_and_scheduler():
    model = linear_model()
    sched = paddle.optimizer.lr.StepDecay(learning_rate=0.1, step_size=1, gamma=0.5)
    opt = paddle.optimizer.SGD(learning_rate=sched, parameters=model.parameters())
    snapshots = []

    class Snap(Callback):
        def on_train_batch_end(self, trainer, output, batch, batch_idx):
            snapshots.append((params(trainer.module), output.finite, output.stepped, trainer.current_lr))

    trainer = Trainer(model, opt, scheduler=sched, loss_fn=poisoned_loss({1}), callbacks=[Snap()],
                      limits=Limits(max_epochs=1))
    trainer.fit(make_batches(3, 8))
    (p0, f0, s0, lr0), (p1, f1, s1, lr1), (_, f2, s2, lr2) = snapshots
    assert (f0, s0, f1, s1, f2, s2) == (True, True, False, False, True, True)
    for a, b in zip(p0, p1, strict=True):
        np.testing.assert_array_equal(a, b)
    assert lr1 == lr0 == 0.05 and lr2 == 0.025  # the skipped step did not advance the schedule
    assert trainer.nonfinite_steps == 1 and trainer.global_step == 2
    assert all(np.isfinite(p).all() for p in params(model))


def test_consecutive_nonfinite_steps_stop_training():
    model = linear_model()
    trainer = Trainer(model, sgd(model), loss_fn=poisoned_loss(set(range(2, 100))),
                      limits=Limits(max_epochs=1, max_consecutive_nonfinite=3))
    with pytest.raises(NonFiniteLossError, match="3 consecutive"):
        trainer.fit(make_batches(10, 4))
    assert trainer.global_step == 2
    assert all(np.isfinite(p).all() for p in params(model))


def test_validate_top_k_exact():
    class Fixed(paddle.nn.Layer):
        def __init__(self):
            super().__init__()
            self.w = self.create_parameter([1])

        def forward(self, x):
            return x  # the inputs are the logits

    logits = paddle.to_tensor(np.array([[5, 4, 3, 2, 1, 0]] * 4, dtype="float32"))
    labels = paddle.to_tensor(np.array([0, 1, 4, 5], dtype="int64"))  # top1: 1/4; top5: 3/4
    model = Fixed()
    metrics = Trainer(model, sgd(model), num_classes=6).validate([(logits, labels)])
    assert metrics["val/top1"] == 0.25 and metrics["val/top5"] == 0.75


def test_max_steps_and_should_stop():
    model = linear_model()
    trainer = Trainer(model, sgd(model), limits=Limits(max_epochs=10, max_steps=7))
    trainer.fit(make_batches(5, 4))
    assert trainer.global_step == 7

    class StopAfterFirstEpoch(Callback):
        def on_train_epoch_end(self, trainer, metrics):
            trainer.should_stop = True

    model = linear_model()
    trainer = Trainer(model, sgd(model), limits=Limits(max_epochs=10), callbacks=[StopAfterFirstEpoch()])
    trainer.fit(make_batches(5, 4))
    assert trainer.epoch == 1


def test_predict_returns_probabilities():
    model = linear_model()
    trainer = Trainer(model, sgd(model))
    probs = trainer.predict(make_batches(2, 5))
    assert probs.shape == (10, 3)
    np.testing.assert_allclose(probs.sum(axis=1), 1.0, rtol=1e-5)
    logits = trainer.predict(make_batches(2, 5), activation="none")
    # a multi-label model scores each class on its own
    np.testing.assert_allclose(trainer.predict(make_batches(2, 5), activation="sigmoid"), 1 / (1 + np.exp(-logits)),
                               rtol=1e-6, atol=1e-7)
    np.testing.assert_allclose(probs, np.exp(logits) / np.exp(logits).sum(axis=1, keepdims=True), rtol=1e-5)
    with pytest.raises(ValueError, match="activation='tanh' is not one of softmax, sigmoid, none"):
        trainer.predict(make_batches(2, 5), activation="tanh")


def test_custom_training_step_subclass():
    class Doubled(Trainer):
        def training_step(self, batch, batch_idx):
            loss, logits, labels = super().training_step(batch, batch_idx)
            self.seen = getattr(self, "seen", 0) + 1
            return loss * 2, logits, labels

    model = linear_model()
    trainer = Doubled(model, sgd(model), limits=Limits(max_epochs=1))
    trainer.fit(make_batches(3, 4))
    assert trainer.seen == 3


def test_loss_scaler_through_the_trainer():
    """With a scaler that behaves like Paddle's GPU one, an overflow lowers the scale and skips the step."""
    model = linear_model()
    sched = paddle.optimizer.lr.StepDecay(learning_rate=0.1, step_size=1, gamma=0.5)
    opt = paddle.optimizer.SGD(learning_rate=sched, parameters=model.parameters())
    precision = Precision(enabled=True, dtype="float16",
                          scaler=FakeGradScaler(init_loss_scaling=1024.0, incr_every_n_steps=2), device="cpu")
    scales = []

    class Scales(Callback):
        def on_train_batch_end(self, trainer, output, batch, batch_idx):
            scales.append((trainer.precision.loss_scale, output.stepped, trainer.current_lr))

    trainer = Trainer(model, opt, scheduler=sched, precision=precision, loss_fn=poisoned_loss({1}),
                      callbacks=[Scales()], limits=Limits(max_epochs=1))
    trainer.fit(make_batches(4, 8))
    # good (count 1), inf (halve, reset), good (1), good (2 -> double)
    assert [s for s, _, _ in scales] == [1024.0, 512.0, 512.0, 1024.0]
    assert [st for _, st, _ in scales] == [True, False, True, True]
    assert [lr for _, _, lr in scales] == [0.05, 0.05, 0.025, 0.0125]
    assert trainer.nonfinite_steps == 1 and trainer.global_step == 3
    assert precision.state_dict()  # the scaler state is part of every checkpoint


class RecordingSaver(CheckpointCallback):
    """A checkpointing callback of the reader's own: saves (records) at epoch ends and on a stop request."""

    def __init__(self, order):
        self.order = order

    def on_train_epoch_end(self, trainer, metrics):
        self.order.append("saver")

    def on_exception(self, trainer, exception):
        if isinstance(exception, TrainingInterrupted):
            self.last_path = f"step-{trainer.global_step}"


class LooksLikeASaver(Callback):
    """Carries the old undeclared attributes; not a CheckpointCallback, so the trainer treats it as any callback."""

    run_last = runs_last = saves_on_interrupt = True

    def __init__(self, order):
        self.order = order

    def on_train_epoch_end(self, trainer, metrics):
        self.order.append("other")


def test_checkpoint_callbacks_are_found_by_type_and_run_last():
    order = []
    saver, other = RecordingSaver(order), LooksLikeASaver(order)
    model = linear_model()
    trainer = Trainer(model, sgd(model), callbacks=[saver, other], limits=Limits(max_epochs=2), handle_signals=False)
    assert trainer.callbacks == [other, saver] and trainer.checkpoint_callbacks == [saver]
    trainer.fit(make_batches(2, 4))
    assert order == ["other", "saver"] * 2
    assert saver.last_path is None  # declared on the base class: None until a subclass saves


class SignalAfterStep(Callback):
    def on_train_batch_end(self, trainer, output, batch, batch_idx):
        if batch_idx == 1:
            os.kill(os.getpid(), signal.SIGTERM)


@pytest.mark.parametrize("with_saver", [True, False])
def test_a_stop_request_is_announced_and_saved_by_the_checkpoint_callbacks(caplog, with_saver):
    order = []
    saver = RecordingSaver(order)
    model = linear_model()
    callbacks = [SignalAfterStep(), *([saver] if with_saver else [LooksLikeASaver(order)])]
    trainer = Trainer(model, sgd(model), callbacks=callbacks, limits=Limits(max_epochs=3))
    with caplog.at_level(logging.WARNING, logger="paddletrain"), pytest.raises(TrainingInterrupted) as stopped:
        trainer.fit(make_batches(4, 4))
    assert stopped.value.step == trainer.global_step == 2
    if with_saver:
        assert saver.last_path == "step-2"
        assert "saving a checkpoint and stopping" in caplog.text
    else:
        assert "no checkpoint will be saved" in caplog.text


def test_without_an_optimizer_the_trainer_validates_and_predicts_but_does_not_fit():
    model = linear_model()
    data = make_batches(3, 8)
    trained = Trainer(model, sgd(model), limits=Limits(max_epochs=2), num_classes=3, handle_signals=False)
    trained.fit(data)
    evaluator = Trainer(model, num_classes=3)
    assert evaluator.validate(data) == trained.validate(data)
    np.testing.assert_array_equal(evaluator.predict(data), trained.predict(data))
    recorder = Recorder()
    idle = Trainer(linear_model(), callbacks=[recorder])
    with pytest.raises(UserError, match="no optimizer: pass one, Trainer\\(model, optimizer, ...\\), to fit"):
        idle.fit(data)
    assert recorder.events == []  # refused before any hook ran


def test_an_optimizer_less_trainer_loads_a_full_state_and_saves_none():
    model = linear_model()
    trained = Trainer(model, sgd(model), limits=Limits(max_epochs=1), handle_signals=False)
    trained.fit(make_batches(2, 4))
    evaluator = Trainer(linear_model(seed=1))
    evaluator.load_state_dict(trained.state_dict())
    for loaded, saved in zip(params(evaluator.module), params(model), strict=True):
        np.testing.assert_array_equal(loaded, saved)
    assert "optimizer" not in evaluator.state_dict() and "optimizer" in trained.state_dict()


def test_checkpoint_never_saves_nan_weights(tmp_path):
    model = linear_model()
    ckpt = ModelCheckpoint(tmp_path, monitor=None)
    trainer = Trainer(model, sgd(model), callbacks=[ckpt], limits=Limits(max_epochs=1))
    trainer.fit(make_batches(2, 4))
    good = find_latest(tmp_path)
    assert good is not None
    model.weight.set_value(paddle.full(model.weight.shape, float("nan")))
    assert ckpt.save(trainer, metric=None) is None
    assert find_latest(tmp_path) == good


SLOW_STEP_SCRIPT = """
import time, paddle
from paddletrain.engine.trainer import Trainer

class SlowModel(paddle.nn.Layer):
    def __init__(self):
        super().__init__()
        self.fc = paddle.nn.Linear(4, 2)

    def forward(self, x):
        print("STEP", flush=True)
        time.sleep(60)  # a step that would take a minute to finish
        return self.fc(x)

model = SlowModel()
batches = [(paddle.randn([2, 4]), paddle.to_tensor([0, 1]))] * 3
Trainer(model, paddle.optimizer.SGD(0.1, parameters=model.parameters()), num_classes=2).fit(batches)
"""


@pytest.mark.timeout(120)
def test_a_second_signal_exits_at_once_without_finishing_the_step(tmp_path):

    log_file = tmp_path / "out.log"

    def wait_for(text: str, timeout: float = 60.0) -> None:
        deadline = time.time() + timeout
        while text not in log_file.read_text() and time.time() < deadline:
            time.sleep(0.05)
        assert text in log_file.read_text(), log_file.read_text()[-2000:]

    with open(log_file, "w") as out:
        proc = subprocess.Popen([sys.executable, "-c", SLOW_STEP_SCRIPT], stdout=out, stderr=subprocess.STDOUT)
        try:
            wait_for("STEP")  # inside fit, so the handlers are installed
            proc.send_signal(signal.SIGTERM)
            wait_for("send it again")  # the first signal only asks for a stop after the step
            assert proc.poll() is None
            time.sleep(REPEAT_WINDOW + 0.2)  # sooner, it counts as the same request delivered twice
            sent = time.time()
            proc.send_signal(signal.SIGTERM)
            proc.wait(timeout=30)
        finally:
            proc.kill()
    assert proc.returncode == 128 + signal.SIGTERM
    assert time.time() - sent < 10  # not after the 60 s step
    assert "Second SIGTERM: exiting immediately" in log_file.read_text()


def test_a_loader_without_a_length_still_steps_on_its_last_short_group():
    """Five batches with accumulation 2: three optimizer steps per epoch, the same as for a list of the five."""
    data = make_batches(5, 4, seed=2)

    class NoLength:
        def __iter__(self):
            return iter(data)

    m1, m2 = linear_model(4), linear_model(4)
    known = Trainer(m1, sgd(m1), limits=Limits(max_epochs=2, accumulate_grad_batches=2))
    known.fit(data)
    unknown = Trainer(m2, sgd(m2), limits=Limits(max_epochs=2, accumulate_grad_batches=2))
    unknown.fit(NoLength())
    assert known.global_step == unknown.global_step == 6
    for a, b in zip(params(m1), params(m2), strict=True):
        np.testing.assert_array_equal(a, b)


# ------------------------------------------------------------------------------------------ batch transform
def image_batches(n_batches=3, batch_size=4, classes=3, seed=0):
    rng = np.random.default_rng(seed)
    return [(paddle.to_tensor(rng.standard_normal((batch_size, 1, 4, 4)).astype("float32")),
             paddle.to_tensor(rng.integers(0, classes, batch_size).astype("int64"))) for _ in range(n_batches)]


def image_model(classes=3):
    paddle.seed(0)
    return paddle.nn.Sequential(paddle.nn.Flatten(), paddle.nn.Linear(16, classes))


def test_batch_transform_feeds_soft_targets_to_the_loss_and_metrics_keep_the_labels():
    seen = []

    def loss_fn(logits, targets):
        seen.append(targets.numpy())
        return cross_entropy(logits, targets)

    model = image_model()
    batches = image_batches()
    mixup = Mixup(num_classes=3, mixup_alpha=1.0, mode="elem", label_smoothing=0.1, seed=1)
    trainer = Trainer(model, sgd(model), loss_fn=loss_fn, batch_transform=mixup, num_classes=3,
                      handle_signals=False)
    trainer.fit(batches)
    assert len(seen) == 3 and all(t.shape == (4, 3) and t.dtype == np.float32 for t in seen)
    np.testing.assert_allclose([t.sum(axis=1) for t in seen], 1.0, rtol=1e-6)
    assert any(((t > 0.1) & (t < 0.9)).sum() > 4 for t in seen)  # mixed, not just smoothed one-hot rows
    assert 0.0 <= trainer.metrics["train/top1"] <= 1.0  # accuracy is counted on the original labels


def test_batch_transform_state_is_saved_and_restored_so_draws_continue():
    def trainer_with(seed):
        model = image_model()
        mixup = Mixup(num_classes=3, mixup_alpha=0.4, cutmix_alpha=1.0, mode="elem", seed=seed)
        trainer = Trainer(model, sgd(model), batch_transform=mixup, handle_signals=False, limits=Limits(max_steps=2))
        return trainer, mixup

    first, first_mixup = trainer_with(seed=7)
    first.fit(image_batches())
    state = first.state_dict()
    assert state["batch_transform"] == [first_mixup.state_dict()]
    second, second_mixup = trainer_with(seed=99)  # another stream until the checkpoint's is restored
    second.setup()
    second.load_state_dict(state)
    a, b = first_mixup.draw(4, 4, 4), second_mixup.draw(4, 4, 4)
    np.testing.assert_array_equal(a.lam, b.lam)
    np.testing.assert_array_equal(a.boxes, b.boxes)


def _stopped_mid_epoch(data, tmp_path):
    """A run of 2 epochs stopped after batch 3 of epoch 0 (max_steps), with its checkpoint."""
    from paddletrain.callbacks import ModelCheckpoint

    model = linear_model()
    saver = ModelCheckpoint(dirpath=str(tmp_path / "ckpt"), every_n_steps=3)
    Trainer(model, sgd(model), callbacks=[saver], limits=Limits(max_epochs=2, max_steps=3), num_classes=3).fit(data)
    return saver.last_path


def test_a_list_of_batches_continues_mid_epoch_at_the_next_batch_exactly(tmp_path):
    data = make_batches(5, 8)
    straight = linear_model()
    Trainer(straight, sgd(straight), limits=Limits(max_epochs=2), num_classes=3).fit(data)
    checkpoint = _stopped_mid_epoch(data, tmp_path)
    resumed = linear_model(seed=1)
    Trainer(resumed, sgd(resumed), limits=Limits(max_epochs=2), num_classes=3).fit(data, ckpt_path=checkpoint)
    for a, b in zip(params(straight), params(resumed), strict=True):
        np.testing.assert_array_equal(a, b)


def test_a_plain_dataloader_is_refused_mid_epoch_naming_the_loader_that_resumes(tmp_path):
    data = make_batches(5, 8)
    checkpoint = _stopped_mid_epoch(data, tmp_path)
    xs = paddle.concat([x for x, _ in data])
    ys = paddle.concat([y for _, y in data])
    loader = paddle.io.DataLoader(paddle.io.TensorDataset([xs, ys]), batch_size=8, shuffle=True)
    model = linear_model()
    trainer = Trainer(model, sgd(model), limits=Limits(max_epochs=2), num_classes=3)
    with pytest.raises(UserError, match=r"cannot continue epoch 0 at batch 3 exactly: this training loader "
                                        r"\(DataLoader\(batch_sampler=BatchSampler\(sampler=RandomSampler\)\)\).*"
                                        r"paddletrain\.data\.build_loader") as refused:
        trainer.fit(loader, ckpt_path=checkpoint)
    assert "\n" not in str(refused.value)
    assert trainer.global_step == 3  # restored, then refused before any step


def test_the_trainers_state_lives_in_named_objects_and_its_old_names_read_them():
    """settings, progress, results and the loop's own state: a few instance attributes, and trainer.epoch (what
    callbacks read) is trainer.progress.epoch; state_dict hands the progress over whole."""
    model = paddle.nn.Linear(4, 3)
    trainer = Trainer(model, paddle.optimizer.SGD(0.1, parameters=model.parameters()), num_classes=3, rank=0)
    trainer.fit([(paddle.rand([2, 4]), paddle.to_tensor([0, 1]))] * 3)
    assert len(vars(trainer)) <= 25
    assert {"settings", "progress", "results", "loop"} <= set(vars(trainer))
    assert trainer.global_step == trainer.progress.global_step == 3
    trainer.epoch = 5
    assert trainer.progress.epoch == 5 and trainer.settings.num_classes == trainer.num_classes == 3
    assert trainer.metrics is trainer.results.metrics
    assert trainer.state_dict()["progress"]["epoch"] == 5
