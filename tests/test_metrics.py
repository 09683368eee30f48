"""ClassificationMeter and topk_correct: device-side sums that give exact epoch accuracies."""
from __future__ import annotations

import numpy as np
import paddle
import pytest

from paddletrain.metrics import ClassificationMeter, topk_correct


def _logits(rows):
    return paddle.to_tensor(np.array(rows, np.float32))


def test_topk_correct_counts_hits_per_k_whatever_the_label_dtype():
    logits = _logits([[0.1, 0.9, 0.0, 0.2], [0.8, 0.1, 0.3, 0.0], [0.0, 0.1, 0.2, 0.7]])
    for dtype in ("int64", "int32"):
        labels = paddle.to_tensor([1, 2, 0], dtype=dtype)  # top-1 hit, top-2 hit, ranked last
        assert topk_correct(logits, labels, (1, 2, 4)).numpy().tolist() == [1.0, 2.0, 3.0]


def test_meter_accumulates_loss_and_accuracy_over_batches():
    meter = ClassificationMeter(num_classes=4, ks=(1, 2))
    meter.update(paddle.to_tensor(2.0), _logits([[1, 0, 0, 0], [0.2, 1, 0, 0]]), paddle.to_tensor([0, 0]), 2)
    meter.update(paddle.to_tensor(0.5), _logits([[0, 0, 1, 0.5]]), paddle.to_tensor([3]), 1)
    metrics = meter.compute("train")
    assert metrics["train/loss"] == pytest.approx((2.0 * 2 + 0.5) / 3)
    assert metrics["train/top1"] == pytest.approx(1 / 3)
    assert metrics["train/top2"] == pytest.approx(3 / 3)


def test_k_above_the_class_count_is_dropped_even_after_the_first_batch():
    meter = ClassificationMeter(ks=(1, 5))  # the class count is not known up front
    meter.update(paddle.to_tensor(1.0), _logits([[0.0, 1.0, 0.5]]), paddle.to_tensor([1]), 1)
    meter.update(paddle.to_tensor(1.0), _logits([[1.0, 0.0, 0.5]]), paddle.to_tensor([2]), 1)
    assert meter.ks == (1,)
    assert meter.compute("val") == {"val/loss": 1.0, "val/top1": 0.5}


def test_a_half_precision_loss_is_summed_in_float32():
    meter = ClassificationMeter(num_classes=2, ks=(1,))
    for _ in range(3):  # 3 x 4 x 1000 = 12000: representable in float32, rounded in float16
        meter.update(paddle.to_tensor(1000.25, dtype="float16"), None, None, 4)
    assert meter.sums().numpy().tolist()[:2] == [12.0, 12000.0]


def test_state_dict_round_trip_continues_the_same_sums():
    meter = ClassificationMeter(num_classes=3, ks=(1,))
    meter.update(paddle.to_tensor(1.5), _logits([[0, 1, 0]]), paddle.to_tensor([1]), 1)
    restored = ClassificationMeter(num_classes=3, ks=(1,))
    restored.load_state_dict(meter.state_dict())
    for m in (meter, restored):
        m.update(paddle.to_tensor(0.5), _logits([[0, 1, 0]]), paddle.to_tensor([0]), 1)
    assert restored.compute("train") == meter.compute("train") == {"train/loss": 1.0, "train/top1": 0.5}


def test_an_empty_meter_reports_nothing():
    assert ClassificationMeter(num_classes=3).compute("val") == {}
