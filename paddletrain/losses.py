"""Classification losses on hard labels or soft targets, registered in :data:`paddletrain.registries.LOSSES`.

Every loss takes ``(logits, targets)`` where ``targets`` are either class indices (``[batch]`` or
``[batch, 1]`` integers) or soft targets (``[batch, classes]`` floats, e.g. from Mixup/CutMix). Validation
always passes hard labels, so every loss accepts both.

Label smoothing (Szegedy et al. 2016, "Rethinking the Inception Architecture") replaces a one-hot target by
``(1 - eps) * one_hot + eps / num_classes``. It is applied here to hard labels only: soft targets are used as
given, because whoever mixes them (timm's ``Mixup(label_smoothing=...)`` contract) smooths them while mixing,
and smoothing them again here would count it twice. :func:`one_hot` is the one definition both use.

Registered names (``loss.name``): ``cross_entropy``, ``soft_target_cross_entropy`` (timm's name for the same
loss) and ``binary_cross_entropy`` (timm's ``BinaryCrossEntropy``, as in "ResNet strikes back"). Left null,
``loss.name`` is the task's loss (:func:`loss_name`): ``cross_entropy``, or ``binary_cross_entropy`` for
multi-label data.

Multi-label targets are multi-hot rows (or Mixup/CutMix mixtures of them). Each class is then a binary problem of
its own, so label smoothing gives each one the two-class smoothing ``y * (1 - eps) + eps / 2`` (Keras's
``BinaryCrossentropy(label_smoothing=eps)`` definition). The multi-label loss applies it to whatever targets it
gets: smoothing is linear, so smoothing a mixture equals mixing smoothed targets, and Mixup leaves multi-hot
targets unsmoothed (:func:`smooth_multi_hot` is the one definition).
"""
from __future__ import annotations

import functools
from collections.abc import Callable

import paddle
import paddle.nn.functional as F

from paddletrain.config import LossConfig
from paddletrain.errors import ConfigError
from paddletrain.registries import LOSSES

LossFn = Callable[[paddle.Tensor, paddle.Tensor], paddle.Tensor]


# ---------------------------------------------------------------------------------------------- targets
def is_soft(logits: paddle.Tensor, targets: paddle.Tensor) -> bool:
    """True for soft targets (float ``[batch, classes]`` like the logits), False for class indices.

    Raises:
        ValueError: float 2-D targets whose shape differs from the logits'.
    """
    if targets.ndim == 2 and paddle.is_floating_point(targets):
        if list(targets.shape) != list(logits.shape):
            raise ValueError(f"soft targets of shape {list(targets.shape)} do not match the logits' "
                             f"{list(logits.shape)}")
        return True
    return False


def one_hot(labels: paddle.Tensor, num_classes: int, smoothing: float = 0.0) -> paddle.Tensor:
    """Float32 ``[batch, num_classes]`` targets: ``(1 - smoothing) * one_hot + smoothing / num_classes``."""
    hot = F.one_hot(labels.reshape([-1]).astype("int64"), num_classes).astype("float32")
    if smoothing:
        hot = hot * (1.0 - smoothing) + smoothing / num_classes
    return hot


def smooth_multi_hot(targets: paddle.Tensor, smoothing: float) -> paddle.Tensor:
    """Float32 multi-hot (or mixed) targets smoothed per class towards 1/2: ``y * (1 - smoothing) + smoothing / 2``."""
    targets = targets.astype("float32")
    return targets * (1.0 - smoothing) + smoothing / 2 if smoothing else targets


def _check_fraction(key: str, value: float) -> None:
    if not 0.0 <= value < 1.0:
        raise ConfigError(f"{key} must be in [0, 1), got {value!r}")


# ---------------------------------------------------------------------------------------------- functions
def soft_target_cross_entropy(logits: paddle.Tensor, targets: paddle.Tensor) -> paddle.Tensor:
    """``mean_batch(-sum_classes targets * log_softmax(logits))`` for soft targets."""
    log_probs = F.log_softmax(logits.astype("float32"), axis=-1)
    return -(targets.astype("float32") * log_probs).sum(axis=-1).mean()


def cross_entropy(logits: paddle.Tensor, targets: paddle.Tensor, label_smoothing: float = 0.0) -> paddle.Tensor:
    """Softmax cross-entropy, mean over the batch.

    Hard labels are smoothed by ``label_smoothing``; soft targets are used as given (see the module notes).
    """
    logits = logits.astype("float32")
    if is_soft(logits, targets):
        return soft_target_cross_entropy(logits, targets)
    labels = targets.reshape([-1]).astype("int64")
    if label_smoothing:
        return soft_target_cross_entropy(logits, one_hot(labels, logits.shape[-1], label_smoothing))
    return F.cross_entropy(logits, labels)


def binary_cross_entropy(
    logits: paddle.Tensor,
    targets: paddle.Tensor,
    label_smoothing: float = 0.0,
    target_threshold: float | None = None,
    sum_classes: bool = False,
    multilabel: bool = False,
) -> paddle.Tensor:
    """One-vs-all sigmoid cross-entropy per class (timm's ``BinaryCrossEntropy``, "ResNet strikes back").

    Hard labels become one-hot targets smoothed to ``label_smoothing / C`` off and ``1 - label_smoothing +
    label_smoothing / C`` on; soft targets are used as given. ``multilabel``: targets are multi-hot rows or
    mixtures of them, each smoothed by :func:`smooth_multi_hot`. With ``target_threshold`` every target (after
    smoothing, as timm does) above it becomes 1 and the rest 0 (so both classes of a Mixup/CutMix pair count as
    present). The per-element loss is averaged over batch and classes (timm's default), or summed over classes
    and averaged over the batch with ``sum_classes``.
    """
    logits = logits.astype("float32")
    if multilabel:
        if not is_soft(logits, targets):
            raise ValueError(f"multi-label targets must be float [batch, classes] rows, got shape "
                             f"{list(targets.shape)} ({targets.dtype})")
        targets = smooth_multi_hot(targets, label_smoothing)
    elif is_soft(logits, targets):
        targets = targets.astype("float32")
    else:
        targets = one_hot(targets, logits.shape[-1], label_smoothing)
    if target_threshold is not None:
        targets = (targets > target_threshold).astype("float32")
    loss = F.binary_cross_entropy_with_logits(logits, targets, reduction="none")
    return loss.sum(axis=-1).mean() if sum_classes else loss.mean()


# ---------------------------------------------------------------------------------------------- factories
def _reject_bce_options(cfg: LossConfig) -> None:
    name = cfg.name
    if cfg.target_threshold is not None:
        raise ConfigError(f"loss.target_threshold applies to loss.name=binary_cross_entropy only, not {name!r}")
    if cfg.bce_sum:
        raise ConfigError(f"loss.bce_sum applies to loss.name=binary_cross_entropy only, not {name!r}")


@LOSSES.register("cross_entropy")
@LOSSES.register("soft_target_cross_entropy")
def build_cross_entropy(cfg: LossConfig) -> LossFn:
    """Softmax cross-entropy on hard labels (smoothed by ``loss.label_smoothing``) or soft targets."""
    _check_fraction("loss.label_smoothing", cfg.label_smoothing)
    _reject_bce_options(cfg)
    return functools.partial(cross_entropy, label_smoothing=float(cfg.label_smoothing))


@LOSSES.register("binary_cross_entropy")
def build_binary_cross_entropy(cfg: LossConfig, multilabel: bool = False) -> LossFn:
    """timm's BCE: ``loss.label_smoothing``, ``loss.target_threshold``, ``loss.bce_sum``; ``multilabel`` for
    multi-hot targets (see :func:`binary_cross_entropy`)."""
    _check_fraction("loss.label_smoothing", cfg.label_smoothing)
    if cfg.target_threshold is not None:
        _check_fraction("loss.target_threshold", cfg.target_threshold)
    return functools.partial(
        binary_cross_entropy,
        label_smoothing=float(cfg.label_smoothing),
        target_threshold=None if cfg.target_threshold is None else float(cfg.target_threshold),
        sum_classes=bool(cfg.bce_sum),
        multilabel=bool(multilabel),
    )


# Losses of one class per sample (softmax): multi-label data cannot train with them.
SINGLE_LABEL_LOSSES = ("cross_entropy", "soft_target_cross_entropy")


def loss_name(name: str | None, multilabel: bool = False) -> str:
    """The registered name ``loss.name`` selects: itself, or when null the task's loss (``binary_cross_entropy``
    for multi-label data, else ``cross_entropy``).

    Raises:
        ConfigError: a single-label (softmax) loss chosen for multi-label data.
    """
    if name is None:
        return "binary_cross_entropy" if multilabel else "cross_entropy"
    name = str(name).lower()
    if multilabel and name in SINGLE_LABEL_LOSSES:
        raise ConfigError(f"loss.name={name} is a single-label (softmax) loss but data.multilabel=true: use "
                          "loss.name=binary_cross_entropy, or leave loss.name unset for the task's loss")
    return name


def build_loss(cfg: LossConfig, multilabel: bool = False) -> LossFn:
    """The loss :func:`loss_name` selects (registered names are case-insensitive), built from ``cfg``.

    ``multilabel``: the targets are multi-hot rows; the built-in BCE then smooths them per class, a plugin's loss
    gets them as they are.
    """
    name = loss_name(cfg.name, multilabel)
    if multilabel and name == "binary_cross_entropy":
        return build_binary_cross_entropy(cfg, multilabel=True)
    return LOSSES.get(name)(cfg)
