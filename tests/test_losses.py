"""Losses against their definitions in numpy: cross-entropy (hard, smoothed, soft targets), timm's binary
cross-entropy (smoothing, target threshold, reductions), the softmax focal loss, class weights in each (the
weighted mean of paddletrain.losses' notes); the registry and configuration errors."""
from __future__ import annotations

import numpy as np
import paddle
import pytest

from paddletrain.errors import ConfigError
from paddletrain.losses import (
    LossConfig,
    balanced_class_weights,
    binary_cross_entropy,
    build_loss,
    cross_entropy,
    focal_loss,
    one_hot,
    resolve_class_weights,
    soft_target_cross_entropy,
)
from paddletrain.registry import LOSSES, UnknownNameError

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
    "options, error, match",
    [
        (dict(name="dice"), UnknownNameError, r"unknown loss loss\.name='dice'"),
        (dict(name="focall"), UnknownNameError, r"did you mean focal"),
        (dict(name="cross_entropi"), UnknownNameError, r"did you mean cross_entropy"),
        (dict(label_smoothing=1.0), ValueError, r"loss\.label_smoothing=1\.0 must be >= 0 and < 1"),
        (dict(name="binary_cross_entropy", target_threshold=1.5), ValueError, r"loss\.target_threshold"),
    ],
)
def test_config_errors_name_the_key(options, error, match):
    # A LossConfig is checked when constructed, a name when the loss is built: both name the key.
    with pytest.raises(error, match=match):
        build_loss(LossConfig(**options))


# ---------------------------------------------------------------------------------------------- class weights
WEIGHTS = np.array([0.5, 2.0, 1.0, 4.0, 0.25])


def np_weighted_mean(per_class, targets, weights):
    """sum_i sum_c w_c q_ic l_ic / sum_i sum_c w_c q_ic: the one definition of a weighted softmax loss."""
    weighted = targets * weights
    return (weighted * per_class).sum() / weighted.sum()


def test_weighted_cross_entropy_on_hard_labels_is_pytorchs_weighted_mean():
    nll = -log_softmax(LOGITS)[np.arange(6), LABELS]
    expected = (WEIGHTS[LABELS] * nll).sum() / WEIGHTS[LABELS].sum()
    got = value(cross_entropy(tensor(LOGITS), tensor(LABELS), class_weights=tensor(WEIGHTS, "float32")))
    assert got == pytest.approx(expected, rel=1e-6)
    assert got != pytest.approx(nll.mean(), rel=1e-3)  # the weights do change this batch's loss


@pytest.mark.parametrize("targets", ["smoothed", "mixed"])
def test_weighted_cross_entropy_on_smoothed_and_mixed_targets_weighs_each_sample_by_its_target(targets):
    q = np_one_hot(LABELS, 5, 0.1) if targets == "smoothed" else soft_targets().astype("float64")
    expected = np_weighted_mean(-log_softmax(LOGITS), q, WEIGHTS)
    w = tensor(WEIGHTS, "float32")
    if targets == "smoothed":
        got = cross_entropy(tensor(LOGITS), tensor(LABELS), label_smoothing=0.1, class_weights=w)
    else:
        got = cross_entropy(tensor(LOGITS), tensor(q, "float32"), class_weights=w)
    assert value(got) == pytest.approx(expected, rel=1e-6)


def test_one_hot_soft_targets_give_the_hard_label_weighted_loss_and_only_ratios_matter():
    w = tensor(WEIGHTS, "float32")
    hard = value(cross_entropy(tensor(LOGITS), tensor(LABELS), class_weights=w))
    assert value(cross_entropy(tensor(LOGITS), one_hot(tensor(LABELS), 5), class_weights=w)) == pytest.approx(
        hard, rel=1e-6)
    assert value(cross_entropy(tensor(LOGITS), tensor(LABELS), class_weights=w * 7.5)) == pytest.approx(hard, rel=1e-6)
    ones = value(cross_entropy(tensor(LOGITS), tensor(soft_targets()), class_weights=paddle.ones([5])))
    assert ones == pytest.approx(value(cross_entropy(tensor(LOGITS), tensor(soft_targets()))), rel=1e-6)


@pytest.mark.parametrize("sum_classes", [False, True])
def test_weighted_bce_scales_each_class_term_by_its_weight_over_the_mean_weight(sum_classes):
    targets = soft_targets(2)
    per_element = np_bce(LOGITS, targets) * (WEIGHTS / WEIGHTS.mean())
    expected = per_element.sum(axis=1).mean() if sum_classes else per_element.mean()
    got = binary_cross_entropy(tensor(LOGITS), tensor(targets), sum_classes=sum_classes,
                               class_weights=tensor(WEIGHTS, "float32"))
    assert value(got) == pytest.approx(expected, rel=1e-6)


# ---------------------------------------------------------------------------------------------- focal
def np_focal_terms(logits, gamma):
    log_p = log_softmax(logits)
    return -((1 - np.exp(log_p)) ** gamma) * log_p


def test_focal_loss_on_hard_labels_is_the_papers_formula():
    log_p = log_softmax(LOGITS)[np.arange(6), LABELS]
    expected = (-(1 - np.exp(log_p)) ** 2 * log_p).mean()
    assert value(focal_loss(tensor(LOGITS), tensor(LABELS))) == pytest.approx(expected, rel=1e-5)
    assert value(focal_loss(tensor(LOGITS), tensor(LABELS))) < value(cross_entropy(tensor(LOGITS), tensor(LABELS)))


@pytest.mark.parametrize("gamma", [0.5, 2.0, 3.0])
def test_focal_loss_on_soft_targets_and_with_alpha_weights(gamma):
    q = soft_targets(4).astype("float64")
    terms = np_focal_terms(LOGITS, gamma)
    got = focal_loss(tensor(LOGITS), tensor(q, "float32"), gamma=gamma)
    assert value(got) == pytest.approx((q * terms).sum(axis=1).mean(), rel=1e-5)
    weighted = focal_loss(tensor(LOGITS), tensor(LABELS), gamma=gamma, label_smoothing=0.1,
                          class_weights=tensor(WEIGHTS, "float32"))
    assert value(weighted) == pytest.approx(np_weighted_mean(terms, np_one_hot(LABELS, 5, 0.1), WEIGHTS), rel=1e-5)


@pytest.mark.parametrize("smoothing, weights", [(0.0, None), (0.1, None), (0.0, WEIGHTS), (0.2, WEIGHTS)])
def test_focal_loss_with_gamma_zero_is_cross_entropy(smoothing, weights):
    w = None if weights is None else tensor(weights, "float32")
    for targets in (tensor(LABELS), tensor(soft_targets(5))):
        focal = focal_loss(tensor(LOGITS), targets, gamma=0.0, label_smoothing=smoothing, class_weights=w)
        ce = cross_entropy(tensor(LOGITS), targets, label_smoothing=smoothing, class_weights=w)
        assert value(focal) == pytest.approx(value(ce), rel=1e-6)


def test_focal_gradient_stays_finite_for_a_certain_prediction_with_gamma_below_one():
    logits = paddle.to_tensor([[60.0, 0.0, 0.0], [0.0, 1.0, 0.0]])  # softmax of row 0 rounds to exactly 1
    logits.stop_gradient = False
    loss = focal_loss(logits, paddle.to_tensor([0, 1]), gamma=0.5)
    loss.backward()
    assert np.isfinite(value(loss)) and np.all(np.isfinite(logits.grad.numpy()))


def test_focal_is_registered_with_its_gamma():
    loss = build_loss(LossConfig(name="focal", focal_gamma=1.5, label_smoothing=0.1))
    expected = focal_loss(tensor(LOGITS), tensor(LABELS), gamma=1.5, label_smoothing=0.1)
    assert value(loss(tensor(LOGITS), tensor(LABELS))) == pytest.approx(value(expected), rel=1e-6)
    with pytest.raises(ConfigError, match=r"loss\.focal_gamma=-1\.0 must be >= 0"):
        build_loss(LossConfig(name="focal", focal_gamma=-1.0))


# ---------------------------------------------------------------------------------------------- resolving weights
def test_balanced_weights_are_sklearns_rule():
    counts = np.array([100, 10, 1])
    expected = counts.sum() / (3 * counts)
    np.testing.assert_allclose(balanced_class_weights(counts), expected, rtol=1e-12)
    # Each class then carries the same total weight: count_c * w_c = n / C.
    np.testing.assert_allclose(counts * balanced_class_weights(counts), counts.sum() / 3, rtol=1e-12)


def test_balanced_weights_name_a_class_without_training_samples():
    with pytest.raises(ConfigError, match=r"^loss\.class_weights=balanced: 'bee' \(class 1\) has no training "
                                          r"samples"):
        resolve_class_weights("balanced", 3, class_counts=[4, 0, 2], classes=["ant", "bee", "wasp"])


def test_an_explicit_list_must_have_one_weight_per_class():
    np.testing.assert_array_equal(resolve_class_weights([1, 2.5], 2), [1.0, 2.5])
    with pytest.raises(ConfigError, match=r"^loss\.class_weights has 2 values but the model has 3 classes"):
        resolve_class_weights([1, 2], 3)
    with pytest.raises(ConfigError, match=r"^loss\.class_weights=\[1\.0, 0\.0\] must be a list of finite numbers > 0"):
        resolve_class_weights([1, 0], 2)


@pytest.mark.parametrize("name", ["cross_entropy", "soft_target_cross_entropy", "binary_cross_entropy", "focal"])
def test_every_builtin_loss_takes_balanced_weights_from_the_class_counts(name):
    counts = np.array([1, 2, 1, 4, 8])
    loss = build_loss(LossConfig(name=name, class_weights="balanced"), num_classes=5, class_counts=counts)
    weights = tensor(balanced_class_weights(counts), "float32")
    functions = {"binary_cross_entropy": binary_cross_entropy, "focal": focal_loss}
    expected = functions.get(name, cross_entropy)(tensor(LOGITS), tensor(LABELS), class_weights=weights)
    assert value(loss(tensor(LOGITS), tensor(LABELS))) == pytest.approx(value(expected), rel=1e-6)


def test_a_plugin_loss_without_class_weights_is_refused_naming_the_key():
    LOSSES.register("plain_test_loss")(lambda cfg: cross_entropy)
    try:
        with pytest.raises(ConfigError, match=r"loss\.class_weights is not supported by loss\.name=plain_test_loss"):
            build_loss(LossConfig(name="plain_test_loss", class_weights=[1.0, 2.0]), num_classes=2)
        assert build_loss(LossConfig(name="plain_test_loss")) is cross_entropy
    finally:
        LOSSES.unregister("plain_test_loss")
