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


# ---------------------------------------------------------------------------------------------- per class
def _random_batches(classes=5, batches=4, size=9, seed=0):
    rng = np.random.default_rng(seed)
    return [(rng.standard_normal((size, classes)).astype("float32"), rng.integers(0, classes, size))
            for _ in range(batches)]


def _per_class_meter(batches, classes=5):
    meter = ClassificationMeter(num_classes=classes, per_class=True)
    for logits, labels in batches:
        meter.update(paddle.to_tensor(1.0), paddle.to_tensor(logits), paddle.to_tensor(labels), len(labels))
    return meter


def _numpy_confusion(batches, classes=5):
    matrix = np.zeros((classes, classes), np.int64)
    for logits, labels in batches:
        np.add.at(matrix, (labels, logits.argmax(axis=1)), 1)
    return matrix


def test_confusion_matrix_and_per_class_scores_match_their_definitions():
    batches = _random_batches()
    report = _per_class_meter(batches).report(class_names=["a", "b", "c", "d", "e"])
    matrix = _numpy_confusion(batches)
    np.testing.assert_array_equal(report.confusion, matrix)
    diag, support, predicted = np.diag(matrix), matrix.sum(axis=1), matrix.sum(axis=0)
    np.testing.assert_array_equal(report.support, support)
    np.testing.assert_array_equal(report.predicted, predicted)
    with np.errstate(divide="ignore", invalid="ignore"):
        recall = np.nan_to_num(diag / support)
        precision = np.nan_to_num(diag / predicted)
        f1 = np.nan_to_num(2 * precision * recall / (precision + recall))
    np.testing.assert_allclose(report.recall, recall, rtol=1e-12)
    np.testing.assert_allclose(report.precision, precision, rtol=1e-12)
    np.testing.assert_allclose(report.f1, f1, rtol=1e-12)
    assert report.balanced_accuracy == pytest.approx(recall[support > 0].mean(), rel=1e-12)
    assert list(report.per_class()) == ["a", "b", "c", "d", "e"]
    assert report.per_class()["c"] == {"precision": precision[2], "recall": recall[2], "f1": f1[2],
                                       "support": int(support[2])}
    assert report.to_dict()["confusion_matrix"] == matrix.tolist()


def test_balanced_accuracy_averages_only_the_classes_present_in_the_labels():
    # Class 2 never occurs in the labels (but is predicted once); classes 0 and 1: recall 1/2 and 1.
    logits = _logits([[1, 0, 0], [0, 0, 1], [0, 1, 0], [0, 1, 0]])
    meter = ClassificationMeter(num_classes=3, ks=(1,), per_class=True)
    meter.update(paddle.to_tensor(1.0), logits, paddle.to_tensor([0, 0, 1, 1]), 4)
    metrics = meter.compute("val")
    assert metrics["val/top1"] == 0.75
    assert metrics["val/balanced_accuracy"] == 0.75  # (1/2 + 1) / 2, not (1/2 + 1 + 0) / 3
    report = meter.report()
    assert report.precision.tolist() == [1.0, 1.0, 0.0] and report.support.tolist() == [2, 2, 0]


def test_the_diagonal_counts_exactly_the_top1_hits_even_with_tied_logits():
    logits = _logits([[1, 1, 0], [0, 2, 2], [3, 3, 3]])
    meter = ClassificationMeter(num_classes=3, ks=(1,), per_class=True)
    meter.update(paddle.to_tensor(1.0), logits, paddle.to_tensor([1, 2, 0]), 3)
    assert np.trace(meter.report().confusion) == meter.compute("val")["val/top1"] * 3


def test_per_class_counts_are_added_on_the_device_without_reading_any_value(monkeypatch):
    batches = _random_batches(batches=2)
    meter = ClassificationMeter(num_classes=5, per_class=True)
    tensors = [(paddle.to_tensor(x), paddle.to_tensor(y)) for x, y in batches]

    def no_sync(*args, **kwargs):
        raise AssertionError("a host sync in ClassificationMeter.update")

    for name in ("numpy", "item", "tolist", "__bool__", "__float__", "__int__", "__index__"):
        monkeypatch.setattr(paddle.Tensor, name, no_sync)
    for logits, labels in tensors:
        meter.update(paddle.to_tensor(1.0), logits, labels, 9)
    monkeypatch.undo()
    np.testing.assert_array_equal(meter.report().confusion, _numpy_confusion(batches))


def test_summed_counts_of_two_ranks_give_the_report_of_all_samples():
    batches = _random_batches(batches=4, seed=3)
    rank0, rank1, both = _per_class_meter(batches[:2]), _per_class_meter(batches[2:]), _per_class_meter(batches)
    summed = rank0.sums() + rank1.sums()  # what all_reduce computes
    np.testing.assert_array_equal(rank0.report(summed).confusion, both.report().confusion)
    assert rank0.compute("val", summed) == pytest.approx(both.compute("val"))


def test_above_the_cap_only_the_per_class_counts_are_kept(monkeypatch):
    monkeypatch.setattr("paddletrain.metrics.single_label.MAX_CONFUSION_CLASSES", 4)
    batches = _random_batches()
    report = _per_class_meter(batches).report()
    assert report.confusion is None and "confusion_matrix" not in report.to_dict()
    np.testing.assert_array_equal(report.support, _numpy_confusion(batches).sum(axis=1))
    assert list(report.per_class()) == ["0", "1", "2", "3", "4"]


def test_the_table_has_a_line_per_class_then_the_means():
    lines = _per_class_meter(_random_batches()).report(class_names=["circle", "ring", "a", "b", "c"]).table()
    assert lines[0].split() == ["class", "precision", "recall", "f1", "support"]
    assert [line.split()[0] for line in lines[1:6]] == ["circle", "ring", "a", "b", "c"]
    assert lines[6].startswith("macro avg") and lines[7].startswith("balanced accuracy")


def test_training_meters_count_nothing_per_class():
    meter = ClassificationMeter(num_classes=3)
    meter.update(paddle.to_tensor(1.0), _logits([[0, 1, 0]]), paddle.to_tensor([1]), 1)
    assert meter.report() is None and list(meter.compute("train")) == ["train/loss", "train/top1"]
    assert len(meter.sums()) == 3
