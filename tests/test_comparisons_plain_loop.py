"""The plain loop the overhead comparisons race the Trainer against, and the ratios they report."""
from __future__ import annotations

import paddle
import pytest

from comparisons.plain_loop import compare_with_trainer, hand_loop


def test_the_ratios_are_the_other_arms_time_over_the_trainers():
    trainer = [0.50, 0.60, 0.55, 0.50, 0.52, 0.58]
    summary, goals = compare_with_trainer({"trainer": trainer, "hand": [t * 0.97 for t in trainer],
                                           "model_fit": [t * 1.10 for t in trainer]})
    assert summary["trainer_vs_hand"] == pytest.approx(0.97) and summary["trainer_vs_model_fit"] == pytest.approx(1.1)
    assert summary["trainer_overhead_ms_per_step"] == pytest.approx(1e3 * 0.03 * 0.535)  # median of t - 0.97 t
    assert [(g["goal"], g["met"]) for g in goals] == [("trainer_vs_hand >= 0.98", False),
                                                     ("trainer_vs_model_fit >= 1.0", True)]
    assert goals[0]["interval"] == pytest.approx([0.97, 0.97])
    assert compare_with_trainer({"hand": trainer}) == ({}, [])  # nothing to compare without the trainer


def test_the_hand_loop_trains_and_steps_its_schedule_once_a_step():
    paddle.seed(0)
    model = paddle.nn.Linear(4, 3)
    scheduler = paddle.optimizer.lr.StepDecay(0.1, step_size=1, gamma=0.5)
    optimizer = paddle.optimizer.SGD(scheduler, parameters=model.parameters())
    images, labels = paddle.randn([8, 4]), paddle.to_tensor([0, 1, 2, 0, 1, 2, 0, 1])
    loss_fn = paddle.nn.CrossEntropyLoss()
    before = float(loss_fn(model(images), labels))
    run = hand_loop(model, optimizer, loss_fn, 3, lambda steps: [(images, labels)] * steps, scheduler=scheduler)
    assert run(3) > 0
    assert scheduler.last_epoch == 3 and float(loss_fn(model(images), labels)) < before
