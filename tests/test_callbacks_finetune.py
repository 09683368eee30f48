"""BackboneFreeze and FreezeBatchNorm inside a real Trainer run."""
from __future__ import annotations

import numpy as np
import paddle
import pytest

from paddletrain.callbacks import BackboneFreeze, Callback, FreezeBatchNorm
from paddletrain.callbacks.finetune import head_parameters
from paddletrain.engine.limits import Limits
from paddletrain.engine.trainer import Trainer
from paddletrain.models import BasicBlock, ResNet


def tiny_model() -> ResNet:
    paddle.seed(0)
    return ResNet(BasicBlock, (1, 1), num_classes=3, stem_type="cifar", stem_width=4, stage_widths=(4, 8))


def batches(count: int = 3):
    rng = np.random.default_rng(0)
    return [(paddle.to_tensor(rng.standard_normal((8, 3, 8, 8)).astype("float32")),
             paddle.to_tensor(rng.integers(0, 3, 8).astype("int64"))) for _ in range(count)]


class Snapshots(Callback):
    """Copies of every parameter and BN statistic at the start and end of each epoch."""

    def __init__(self) -> None:
        self.taken: dict = {}

    def _take(self, trainer, when):
        self.taken[(trainer.epoch, when)] = {k: v.numpy().copy() for k, v in trainer.module.state_dict().items()}

    def on_train_epoch_start(self, trainer):
        self._take(trainer, "start")

    def on_train_epoch_end(self, trainer, metrics):
        self._take(trainer, "end")


def optimizer_for(model, name):
    if name == "adamw":
        return paddle.optimizer.AdamW(0.01, parameters=model.parameters(), weight_decay=0.05)
    return paddle.optimizer.Momentum(0.1, momentum=0.9, parameters=model.parameters(), weight_decay=5e-4)


def fit(model, callbacks, epochs=2, optimizer="sgd"):
    Trainer(model, optimizer_for(model, optimizer), callbacks=callbacks,
            limits=Limits(max_epochs=epochs, val_every_n_epochs=0), handle_signals=False).fit(batches())


@pytest.mark.parametrize("optimizer", ["sgd", "adamw"])
def test_backbone_is_unchanged_while_frozen_then_trains(optimizer):
    model = tiny_model()
    head_names = {"fc.weight", "fc.bias"}
    # BatchNorm statistics are not trained parameters (stop_gradient); FreezeBatchNorm is what fixes them.
    trainable = [k for k, p in model.named_parameters() if not p.stop_gradient]
    snapshots = Snapshots()
    fit(model, [BackboneFreeze(1), snapshots], epochs=2, optimizer=optimizer)
    start, frozen_end, end = snapshots.taken[(0, "start")], snapshots.taken[(0, "end")], snapshots.taken[(1, "end")]
    backbone = [k for k in trainable if k not in head_names]
    assert len(backbone) == 18
    for key in backbone:
        np.testing.assert_array_equal(frozen_end[key], start[key], err_msg=f"{key} changed while frozen")
    assert all(not np.array_equal(frozen_end[k], start[k]) for k in head_names), "the head did not train"
    # The optimizer was built over every parameter: after unfreezing it updates the backbone too.
    changed = [k for k in backbone if not np.array_equal(end[k], frozen_end[k])]
    assert changed == backbone
    parameters = dict(model.named_parameters())
    assert not any(parameters[k].stop_gradient for k in trainable), "fit must leave the model unfrozen"


def test_parameters_frozen_by_the_user_stay_frozen():
    model = tiny_model()
    model.conv1.weight.stop_gradient = True
    before = model.conv1.weight.numpy().copy()
    fit(model, [BackboneFreeze(1)], epochs=2)
    assert model.conv1.weight.stop_gradient
    np.testing.assert_array_equal(model.conv1.weight.numpy(), before)


def test_freezing_follows_the_epoch_on_resume():
    callback = BackboneFreeze(2)
    model = tiny_model()
    trainer = Trainer(model, optimizer_for(model, "sgd"), callbacks=[callback], handle_signals=False)
    trainer.epoch = 1
    callback.on_train_epoch_start(trainer)
    assert callback.frozen and model.layer1[0].conv1.weight.stop_gradient and not model.fc.weight.stop_gradient
    trainer.epoch = 2
    callback.on_train_epoch_start(trainer)
    assert not callback.frozen and not model.layer1[0].conv1.weight.stop_gradient


def test_head_parameters_need_a_head():
    assert [p.shape for p in head_parameters(tiny_model())] == [[8, 3], [3]]
    with pytest.raises(ValueError, match="get_classifier"):
        head_parameters(paddle.nn.Sequential(paddle.nn.Linear(2, 2)))
    with pytest.raises(ValueError, match="epochs=-1 must be >= 0"):
        BackboneFreeze(-1)


def test_freeze_batchnorm_keeps_running_statistics_while_the_rest_trains():
    model = tiny_model()
    statistics = [k for k in model.state_dict() if k.endswith(("_mean", "_variance"))]
    snapshots = Snapshots()
    fit(model, [FreezeBatchNorm(), snapshots], epochs=2)
    start, end = snapshots.taken[(0, "start")], snapshots.taken[(1, "end")]
    for key in statistics:
        np.testing.assert_array_equal(end[key], start[key], err_msg=f"{key} moved")
    assert not np.array_equal(end["bn1.weight"], start["bn1.weight"]), "BN affine parameters should still train"
    assert not np.array_equal(end["layer1.0.conv1.weight"], start["layer1.0.conv1.weight"])


def test_without_freeze_batchnorm_the_statistics_move():
    model = tiny_model()
    snapshots = Snapshots()
    fit(model, [snapshots], epochs=1)
    assert not np.array_equal(snapshots.taken[(0, "end")]["bn1._mean"], snapshots.taken[(0, "start")]["bn1._mean"])
