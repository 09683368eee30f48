"""Losses against their definitions in numpy: cross-entropy (hard, smoothed, soft targets) and timm's binary
cross-entropy (smoothing, target threshold, reductions); the registry and configuration errors."""
from __future__ import annotations

import numpy as np
import paddle
import pytest

from paddletrain.losses import (
    LossConfig,
    binary_cross_entropy,
    build_loss,
    cross_entropy,
    one_hot,
    soft_target_cross_entropy,
)
from paddletrain.registries import LOSSES
from paddletrain.registry import UnknownNameError

paddle.set_device("cpu")

RNG = np.random.default_rng(0)
LOGITS = RNG.standard_normal((6, 5)).astype("float32") * 2
LABELS = np.array([0, 4, 2, 2, 1, 3])


def log_softmax(x):
    x = x.astype("float64")
    shifted = x - x.max(axis=1, keepdims=True)
    return shifted - np.log(np.exp(shifted).sum(axis=1, keepdims=True))


def np_one_hot(labels, classes, eps=0.0):
    hot = np.eye(classes)[labels]
    return hot * (1 - eps) + eps / classes


def np_bce(logits, targets):
    x = logits.astype("float64")
    return np.maximum(x, 0) - x * targets + np.log1p(np.exp(-np.abs(x)))  # stable log(1 + e^x) - x t


def tensor(array, dtype=None):
    return paddle.to_tensor(array if dtype is None else array.astype(dtype))


def value(loss):
    return float(loss.numpy())


def soft_targets(seed=1):
    raw = np.random.default_rng(seed).random(LOGITS.shape)
    return (raw / raw.sum(axis=1, keepdims=True)).astype("float32")


# ---------------------------------------------------------------------------------------------- cross-entropy
def test_cross_entropy_on_hard_labels_is_the_mean_negative_log_likelihood():
    expected = -log_softmax(LOGITS)[np.arange(6), LABELS].mean()
    assert value(cross_entropy(tensor(LOGITS), tensor(LABELS))) == pytest.approx(expected, rel=1e-6)
    # [batch, 1] labels, as some datasets yield them, mean the same.
    assert value(cross_entropy(tensor(LOGITS), tensor(LABELS[:, None]))) == pytest.approx(expected, rel=1e-6)


def test_label_smoothing_is_cross_entropy_against_the_smoothed_one_hot():
    eps = 0.1
    expected = -(np_one_hot(LABELS, 5, eps) * log_softmax(LOGITS)).sum(axis=1).mean()
    got = value(cross_entropy(tensor(LOGITS), tensor(LABELS), label_smoothing=eps))
    assert got == pytest.approx(expected, rel=1e-6)
    confident = np.eye(5, dtype="float32")[LABELS] * 20  # right and very sure: smoothing penalises it
    assert value(cross_entropy(tensor(confident), tensor(LABELS), eps)) > 10 * value(
        cross_entropy(tensor(confident), tensor(LABELS)))


def test_soft_targets_are_used_as_given_and_the_gradient_is_softmax_minus_target():
    targets = soft_targets()
    expected = -(targets * log_softmax(LOGITS)).sum(axis=1).mean()
    logits = tensor(LOGITS)
    logits.stop_gradient = False
    loss = cross_entropy(logits, tensor(targets), label_smoothing=0.3)  # smoothing applies to hard labels only
    assert value(loss) == pytest.approx(expected, rel=1e-6)
    loss.backward()
    softmax = np.exp(log_softmax(LOGITS))
    np.testing.assert_allclose(logits.grad.numpy(), (softmax - targets) / len(LOGITS), rtol=1e-4, atol=1e-7)
    assert value(soft_target_cross_entropy(tensor(LOGITS), tensor(targets))) == pytest.approx(expected, rel=1e-6)


def test_one_hot_targets_equal_hard_labels_and_smoothed_rows_sum_to_one():
    hot = one_hot(tensor(LABELS), 5, smoothing=0.2).numpy()
    np.testing.assert_allclose(hot, np_one_hot(LABELS, 5, 0.2), rtol=1e-6)
    np.testing.assert_allclose(hot.sum(axis=1), 1.0, rtol=1e-6)
    assert value(cross_entropy(tensor(LOGITS), one_hot(tensor(LABELS), 5))) == pytest.approx(
        value(cross_entropy(tensor(LOGITS), tensor(LABELS))), rel=1e-6)


def test_soft_targets_of_the_wrong_shape_are_refused():
    with pytest.raises(ValueError, match=r"soft targets of shape \[6, 4\] do not match the logits' \[6, 5\]"):
        cross_entropy(tensor(LOGITS), tensor(np.full((6, 4), 0.25, "float32")))


# ---------------------------------------------------------------------------------------------- BCE
def test_bce_on_hard_labels_uses_timms_smoothed_one_vs_all_targets():
    eps, classes = 0.1, 5
    # timm: off = eps / C, on = 1 - eps + eps / C (the same row as smoothed one-hot cross-entropy targets).
    targets = np.full((6, classes), eps / classes)
    targets[np.arange(6), LABELS] = 1 - eps + eps / classes
    expected = np_bce(LOGITS, targets).mean()  # timm's default reduction: mean over samples and classes
    got = binary_cross_entropy(tensor(LOGITS), tensor(LABELS), label_smoothing=eps)
    assert value(got) == pytest.approx(expected, rel=1e-6)


def test_bce_sum_over_classes_is_the_number_of_classes_times_the_elementwise_mean():
    targets = soft_targets()
    per_element = np_bce(LOGITS, targets)
    assert value(binary_cross_entropy(tensor(LOGITS), tensor(targets))) == pytest.approx(per_element.mean(), rel=1e-6)
    summed = binary_cross_entropy(tensor(LOGITS), tensor(targets), sum_classes=True)
    assert value(summed) == pytest.approx(per_element.sum(axis=1).mean(), rel=1e-6)


def test_bce_target_threshold_marks_both_mixed_classes_present():
    # A Mixup pair with lambda 0.7 plus smoothing residue: classes above 0.2 become 1, the rest 0.
    mixed = np.full((2, 5), 0.02, "float32")
    mixed[0, [1, 3]] = [0.7, 0.26]
    mixed[1, [0, 2]] = [0.9, 0.06]
    binarised = np.zeros((2, 5))
    binarised[0, [1, 3]] = 1
    binarised[1, 0] = 1
    logits = LOGITS[:2]
    got = binary_cross_entropy(tensor(logits), tensor(mixed), target_threshold=0.2)
    assert value(got) == pytest.approx(np_bce(logits, binarised).mean(), rel=1e-6)


def test_bce_gradient_is_sigmoid_minus_target_over_the_elements():
    targets = soft_targets(3)
    logits = tensor(LOGITS)
    logits.stop_gradient = False
    binary_cross_entropy(logits, tensor(targets)).backward()
    sigmoid = 1 / (1 + np.exp(-LOGITS.astype("float64")))
    np.testing.assert_allclose(logits.grad.numpy(), (sigmoid - targets) / LOGITS.size, rtol=1e-4, atol=1e-8)


# ---------------------------------------------------------------------------------------------- registry
def test_registry_builds_each_loss_from_its_config():
    assert {"cross_entropy", "soft_target_cross_entropy", "binary_cross_entropy"} <= set(LOSSES.names())
    ce = build_loss(LossConfig(name="cross_entropy", label_smoothing=0.1))
    assert value(ce(tensor(LOGITS), tensor(LABELS))) == pytest.approx(
        value(cross_entropy(tensor(LOGITS), tensor(LABELS), 0.1)))
    soft = build_loss(LossConfig(name="Soft_Target_Cross_Entropy"))
    targets = soft_targets()
    assert value(soft(tensor(LOGITS), tensor(targets))) == pytest.approx(
        value(soft_target_cross_entropy(tensor(LOGITS), tensor(targets))))
    bce = build_loss(LossConfig(name="binary_cross_entropy", label_smoothing=0.1, target_threshold=0.2, bce_sum=True))
    expected = binary_cross_entropy(tensor(LOGITS), tensor(LABELS), 0.1, 0.2, sum_classes=True)
    assert value(bce(tensor(LOGITS), tensor(LABELS))) == pytest.approx(value(expected))


@pytest.mark.parametrize(
    "cfg, error, match",
    [
        (LossConfig(name="focal"), UnknownNameError, r"unknown loss loss\.name='focal'"),
        (LossConfig(name="cross_entropi"), UnknownNameError, r"did you mean cross_entropy"),
        (LossConfig(label_smoothing=1.0), ValueError, r"loss\.label_smoothing must be in \[0, 1\), got 1\.0"),
        (LossConfig(target_threshold=0.2), ValueError, r"loss\.target_threshold applies to .*binary_cross_entropy"),
        (LossConfig(bce_sum=True), ValueError, r"loss\.bce_sum applies to"),
        (LossConfig(name="binary_cross_entropy", target_threshold=1.5), ValueError, r"loss\.target_threshold"),
    ],
)
def test_config_errors_name_the_key(cfg, error, match):
    with pytest.raises(error, match=match):
        build_loss(cfg)
