from __future__ import annotations

import types

import paddle

from paddletrain.callbacks import LearningRateMonitor
from paddletrain.callbacks.lr_monitor import group_lr_multipliers


def make_trainer(optimizer, lr):
    return types.SimpleNamespace(optimizer=optimizer, current_lr=lr, metrics={})


def two_layers():
    return paddle.nn.Linear(2, 2), paddle.nn.Linear(2, 2)


def test_publishes_each_group_lr_when_multipliers_differ():
    backbone, head = two_layers()
    optimizer = paddle.optimizer.SGD(
        learning_rate=0.1, parameters=[{"params": backbone.parameters(), "learning_rate": 0.1},
                                       {"params": head.parameters()}])
    assert group_lr_multipliers(optimizer) == [0.1, 1.0]
    monitor = LearningRateMonitor()
    trainer = make_trainer(optimizer, lr=0.2)
    monitor.on_fit_start(trainer)
    monitor.on_before_optimizer_step(trainer, optimizer)
    assert trainer.metrics == {"train/lr_group0": 0.2 * 0.1, "train/lr_group1": 0.2}
    trainer.current_lr = 0.05  # the scheduler moved: the next step publishes the new values
    monitor.on_before_optimizer_step(trainer, optimizer)
    assert trainer.metrics["train/lr_group1"] == 0.05


def test_adds_nothing_when_all_groups_share_the_lr():
    backbone, head = two_layers()
    grouped = paddle.optimizer.SGD(
        learning_rate=0.1, parameters=[{"params": backbone.parameters()}, {"params": head.parameters()}])
    flat = paddle.optimizer.SGD(learning_rate=0.1, parameters=backbone.parameters())
    assert group_lr_multipliers(flat) == []
    for optimizer in (grouped, flat):
        trainer = make_trainer(optimizer, lr=0.1)
        monitor = LearningRateMonitor()
        monitor.on_fit_start(trainer)
        monitor.on_before_optimizer_step(trainer, optimizer)
        assert trainer.metrics == {}
