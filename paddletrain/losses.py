"""Classification losses on hard labels or soft targets, registered in :data:`paddletrain.registry.LOSSES`.

Every loss takes ``(logits, targets)`` where ``targets`` are either class indices (``[batch]`` or
``[batch, 1]`` integers) or soft targets (``[batch, classes]`` floats, e.g. from Mixup/CutMix). Validation
always passes hard labels, so every loss accepts both.

Label smoothing (Szegedy et al. 2016, "Rethinking the Inception Architecture") replaces a one-hot target by
``(1 - eps) * one_hot + eps / num_classes``. It is applied here to hard labels only: soft targets are used as
given, because whoever mixes them (timm's ``Mixup(label_smoothing=...)`` contract) smooths them while mixing,
and smoothing them again here would count it twice. :func:`one_hot` is the one definition both use.

Registered names (``loss.name``): ``cross_entropy``, ``soft_target_cross_entropy`` (timm's name for the same
loss), ``binary_cross_entropy`` (timm's ``BinaryCrossEntropy``, as in "ResNet strikes back") and ``focal``
(softmax focal loss, Lin et al. 2017, "Focal Loss for Dense Object Detection").

Class weights (``loss.class_weights``; :func:`resolve_class_weights`) make every loss a *weighted mean*, so only
the ratios of the weights matter and weights of 1 give the unweighted loss:

- softmax losses (cross-entropy, focal), with per-class terms ``l_ic`` and targets ``q_ic`` (one-hot, smoothed
  or mixed): ``sum_i sum_c w_c q_ic l_ic / sum_i sum_c w_c q_ic``. For hard labels this is PyTorch's weighted
  mean ``sum_i w_{y_i} l_i / sum_i w_{y_i}``. A smoothed or mixed target weighs its sample by the target's
  expected class weight ``sum_c w_c q_ic``, so one definition covers hard, smoothed and mixed targets (a Mixup
  with lambda 1 equals the hard label). PyTorch differs there: with label smoothing it divides by
  ``sum_i w_{y_i}``, and for probability targets by the batch size;
- ``binary_cross_entropy``: each class's one-vs-all term is multiplied by ``w_c / mean(w)`` (PyTorch's per-class
  ``weight``, rescaled to mean 1), then reduced as without weights.

Focal loss: ``-sum_c q_c (1 - p_c)^gamma log p_c`` per sample, which for a hard label ``y`` is the paper's
``-(1 - p_y)^gamma log p_y``; its ``alpha_t`` are the class weights; ``gamma = 0`` is cross-entropy.

Left null, ``loss.name`` is the task's loss (:func:`loss_name`): ``cross_entropy``, or ``binary_cross_entropy``
for multi-label data.

Multi-label targets are multi-hot rows (or Mixup/CutMix mixtures of them). Each class is then a binary problem of
its own, so label smoothing gives each one the two-class smoothing ``y * (1 - eps) + eps / 2`` (Keras's
``BinaryCrossentropy(label_smoothing=eps)`` definition). The multi-label loss applies it to whatever targets it
gets: smoothing is linear, so smoothing a mixture equals mixing smoothed targets, and Mixup leaves multi-hot
targets unsmoothed (:func:`smooth_multi_hot` is the one definition).
"""
from __future__ import annotations

import functools
import inspect
import logging
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import numpy as np
import paddle
import paddle.nn.functional as F

from paddletrain.config import LossConfig, check_field
from paddletrain.errors import ConfigError
from paddletrain.registry import LOSSES

log = logging.getLogger("paddletrain")

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


def _check(key: str, value: Any) -> None:
    """``loss.<key>=value`` against the schema's declaration (the range's one home, :class:`LossConfig`): the entry
    point validated a config already; this is for the Python API's hand-made configs."""
    check_field(LossConfig, key, value, context="loss.")


# ---------------------------------------------------------------------------------------------- functions
def _target_mean(per_class: paddle.Tensor, targets: paddle.Tensor,
                 class_weights: paddle.Tensor | None = None) -> paddle.Tensor:
    """``mean_i sum_c q_ic l_ic``, or with weights the weighted mean ``sum w_c q_ic l_ic / sum w_c q_ic``."""
    targets = targets.astype("float32")
    if class_weights is None:
        return (targets * per_class).sum(axis=-1).mean()
    weighted = targets * class_weights
    return (weighted * per_class).sum() / weighted.sum()


def soft_target_cross_entropy(logits: paddle.Tensor, targets: paddle.Tensor,
                              class_weights: paddle.Tensor | None = None) -> paddle.Tensor:
    """``mean_batch(-sum_classes targets * log_softmax(logits))`` for soft targets (weighted: see the module
    notes)."""
    log_probs = F.log_softmax(logits.astype("float32"), axis=-1)
    return _target_mean(-log_probs, targets, class_weights)


def cross_entropy(logits: paddle.Tensor, targets: paddle.Tensor, label_smoothing: float = 0.0,
                  class_weights: paddle.Tensor | None = None) -> paddle.Tensor:
    """Softmax cross-entropy, mean over the batch (a weighted mean with ``class_weights``, ``[classes]``).

    Hard labels are smoothed by ``label_smoothing``; soft targets are used as given (see the module notes).
    """
    logits = logits.astype("float32")
    if is_soft(logits, targets):
        return soft_target_cross_entropy(logits, targets, class_weights)
    labels = targets.reshape([-1]).astype("int64")
    if label_smoothing:
        return soft_target_cross_entropy(logits, one_hot(labels, logits.shape[-1], label_smoothing), class_weights)
    if class_weights is not None:  # Paddle's weighted mean: sum_i w_{y_i} l_i / sum_i w_{y_i}
        return F.cross_entropy(logits, labels, weight=class_weights)
    return F.cross_entropy(logits, labels)


# The smallest normal float32: (1 - p) is kept at least this, so that (1 - p)^gamma with gamma < 1 has a finite
# gradient when a softmax probability rounds to exactly 1 (the value changes by less than float32 can show).
_TINY = float(np.finfo(np.float32).tiny)


def focal_loss(logits: paddle.Tensor, targets: paddle.Tensor, gamma: float = 2.0, label_smoothing: float = 0.0,
               class_weights: paddle.Tensor | None = None) -> paddle.Tensor:
    """Softmax focal loss (Lin et al. 2017): ``-sum_c q_c (1 - p_c)^gamma log p_c``, mean over the batch.

    ``q`` is the one-hot label (smoothed by ``label_smoothing``) or the soft target as given, so a hard label
    gives the paper's ``-(1 - p_t)^gamma log p_t``; ``class_weights`` are its ``alpha_t`` (a weighted mean, as
    for cross-entropy). ``gamma = 0`` is cross-entropy.
    """
    logits = logits.astype("float32")
    if not is_soft(logits, targets):
        targets = one_hot(targets, logits.shape[-1], label_smoothing)
    log_probs = F.log_softmax(logits, axis=-1)
    per_class = -log_probs
    if gamma:
        per_class = per_class * (1.0 - log_probs.exp()).clip(min=_TINY) ** gamma
    return _target_mean(per_class, targets, class_weights)


def binary_cross_entropy(
    logits: paddle.Tensor,
    targets: paddle.Tensor,
    label_smoothing: float = 0.0,
    target_threshold: float | None = None,
    sum_classes: bool = False,
    class_weights: paddle.Tensor | None = None,
    multilabel: bool = False,
) -> paddle.Tensor:
    """One-vs-all sigmoid cross-entropy per class (timm's ``BinaryCrossEntropy``, "ResNet strikes back").

    Hard labels become one-hot targets smoothed to ``label_smoothing / C`` off and ``1 - label_smoothing +
    label_smoothing / C`` on; soft targets are used as given. ``multilabel``: targets are multi-hot rows or
    mixtures of them, each smoothed by :func:`smooth_multi_hot`. With ``target_threshold`` every target (after
    smoothing, as timm does) above it becomes 1 and the rest 0 (so both classes of a Mixup/CutMix pair count as
    present). The per-element loss is averaged over batch and classes (timm's default), or summed over classes
    and averaged over the batch with ``sum_classes``. ``class_weights`` (``[classes]``) multiply each class's term
    by ``w_c / mean(w)``.
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
    if class_weights is not None:
        loss = loss * (class_weights / class_weights.mean())
    return loss.sum(axis=-1).mean() if sum_classes else loss.mean()


# ---------------------------------------------------------------------------------------------- class weights
CLASS_WEIGHTS_KEY = "loss.class_weights"


def balanced_class_weights(counts: Sequence[int] | np.ndarray, classes: Sequence[str] | None = None) -> np.ndarray:
    """sklearn's ``class_weight="balanced"``: ``n_samples / (n_classes * count_c)`` from per-class sample counts.

    Raises:
        ConfigError: a class without samples (its weight would be infinite), named by ``classes``.
    """
    counts = np.asarray(counts, dtype=np.float64)
    empty = np.flatnonzero(counts == 0)
    if len(empty):
        k = int(empty[0])
        name = f"{classes[k]!r} (class {k})" if classes is not None and k < len(classes) else f"class {k}"
        raise ConfigError(f"{CLASS_WEIGHTS_KEY}=balanced: {name} has no training samples, so its weight "
                          f"n_samples / (n_classes * 0) is undefined; {len(empty)} class(es) have none. Give "
                          f"{CLASS_WEIGHTS_KEY} as a list, or add samples of that class")
    return counts.sum() / (len(counts) * counts)


def resolve_class_weights(setting: Any, num_classes: int | None = None,
                          class_counts: Sequence[int] | np.ndarray | None = None,
                          classes: Sequence[str] | None = None) -> np.ndarray | None:
    """The per-class weights ``loss.class_weights`` asks for, as float64 ``[classes]`` (None when unset).

    ``balanced`` needs ``class_counts`` (the training split's, one per class of the model); a list must have
    ``num_classes`` positive, finite values when ``num_classes`` is known.
    """
    if setting is None:
        return None
    if isinstance(setting, str):
        if setting != "balanced":
            raise ConfigError(f"{CLASS_WEIGHTS_KEY}={setting!r} is not allowed; choose balanced, or a list with one "
                              "weight per class")
        if class_counts is None:
            raise ConfigError(f"{CLASS_WEIGHTS_KEY}=balanced needs the training split's class counts "
                              "(build_loss(..., class_counts=...))")
        return balanced_class_weights(class_counts, classes)
    try:
        weights = np.asarray(list(setting), dtype=np.float64)
    except (TypeError, ValueError):
        raise ConfigError(f"{CLASS_WEIGHTS_KEY}={setting!r} must be balanced or a list of numbers") from None
    if weights.ndim != 1 or not np.all(np.isfinite(weights)) or not np.all(weights > 0):
        raise ConfigError(f"{CLASS_WEIGHTS_KEY}={weights.tolist()} must be a list of finite numbers > 0")
    if num_classes is not None and len(weights) != num_classes:
        raise ConfigError(f"{CLASS_WEIGHTS_KEY} has {len(weights)} values but the model has {num_classes} classes: "
                          "give one weight per class, in class order")
    return weights


def takes_class_weights(factory: Callable[..., Any]) -> bool:
    """Whether a registered loss factory accepts ``class_weights`` (the built-ins do; a plugin's may not)."""
    try:
        parameters = inspect.signature(factory).parameters
    except (TypeError, ValueError):
        return False
    return "class_weights" in parameters or any(p.kind is p.VAR_KEYWORD for p in parameters.values())


def _weights_tensor(class_weights: Sequence[float] | np.ndarray | None) -> paddle.Tensor | None:
    # Made once, when the loss is built: the step only multiplies by it.
    return None if class_weights is None else paddle.to_tensor(np.asarray(class_weights, dtype=np.float32))


# ---------------------------------------------------------------------------------------------- factories
# Keys of the binary cross-entropy only (validation.py refuses them with the other built-in losses).
BCE_ONLY_KEYS = ("target_threshold", "bce_sum")
# The loss of multi-label data, and the one that takes BCE_ONLY_KEYS.
MULTILABEL_LOSS = "binary_cross_entropy"


@LOSSES.register("cross_entropy")
@LOSSES.register("soft_target_cross_entropy")
def build_cross_entropy(cfg: LossConfig, class_weights: np.ndarray | None = None) -> LossFn:
    """Softmax cross-entropy on hard labels (smoothed by ``loss.label_smoothing``) or soft targets."""
    _check("label_smoothing", cfg.label_smoothing)
    if class_weights is None:  # the unweighted loss exactly as before: no extra argument on the hot path
        return functools.partial(cross_entropy, label_smoothing=float(cfg.label_smoothing))
    return functools.partial(cross_entropy, label_smoothing=float(cfg.label_smoothing),
                             class_weights=_weights_tensor(class_weights))


@LOSSES.register("binary_cross_entropy")
def build_binary_cross_entropy(cfg: LossConfig, class_weights: np.ndarray | None = None,
                               multilabel: bool = False) -> LossFn:
    """timm's BCE: ``loss.label_smoothing``, ``loss.target_threshold``, ``loss.bce_sum``; ``multilabel`` for
    multi-hot targets (see :func:`binary_cross_entropy`)."""
    _check("label_smoothing", cfg.label_smoothing)
    if cfg.target_threshold is not None:
        _check("target_threshold", cfg.target_threshold)
    return functools.partial(
        binary_cross_entropy,
        label_smoothing=float(cfg.label_smoothing),
        target_threshold=None if cfg.target_threshold is None else float(cfg.target_threshold),
        sum_classes=bool(cfg.bce_sum),
        class_weights=_weights_tensor(class_weights),
        multilabel=bool(multilabel),
    )


@LOSSES.register("focal")
def build_focal(cfg: LossConfig, class_weights: np.ndarray | None = None) -> LossFn:
    """Softmax focal loss: ``loss.focal_gamma``, ``loss.label_smoothing``; ``loss.class_weights`` are its alpha."""
    _check("label_smoothing", cfg.label_smoothing)
    gamma = float(cfg.focal_gamma)
    _check("focal_gamma", gamma)
    return functools.partial(focal_loss, gamma=gamma, label_smoothing=float(cfg.label_smoothing),
                             class_weights=_weights_tensor(class_weights))


# Losses of one class per sample (softmax): multi-label data cannot train with them.
SINGLE_LABEL_LOSSES = ("cross_entropy", "soft_target_cross_entropy", "focal")


def loss_name(name: str | None, multilabel: bool = False) -> str:
    """The registered name ``loss.name`` selects: itself, or when null the task's loss (``binary_cross_entropy``
    for multi-label data, else ``cross_entropy``).

    Raises:
        ConfigError: a single-label (softmax) loss chosen for multi-label data.
    """
    if name is None:
        return MULTILABEL_LOSS if multilabel else "cross_entropy"
    name = str(name).lower()
    if multilabel and name in SINGLE_LABEL_LOSSES:
        raise ConfigError(f"loss.name={name} is a single-label (softmax) loss but data.multilabel=true: use "
                          "loss.name=binary_cross_entropy, or leave loss.name unset for the task's loss")
    return name


def check_loss_config(loss: Any, multilabel: bool = False) -> str:
    """The ``loss.*`` rules beyond each key's declared range: the binary cross-entropy keys are not set with a
    built-in softmax loss (a plugin's loss may take them), and ``loss.class_weights`` suits the loss (a list's
    length is checked against the classes once the data is open). Returns the registered name the loss selects
    (:func:`loss_name`)."""
    name = loss_name(loss.get("name"), multilabel)
    if name in SINGLE_LABEL_LOSSES:
        for key in BCE_ONLY_KEYS:
            if loss.get(key) not in (None, False):
                raise ConfigError(f"loss.{key} applies to loss.name={MULTILABEL_LOSS} only, not {name!r}")
    weights = loss.get("class_weights")
    if weights is None:
        return name
    if not takes_class_weights(LOSSES.get(name)):
        raise ConfigError(f"{CLASS_WEIGHTS_KEY} is not supported by loss.name={name} (its factory takes no "
                          "class_weights)")
    if not isinstance(weights, str):
        resolve_class_weights(weights)  # numbers > 0
    return name


def build_loss(cfg: LossConfig, num_classes: int | None = None,
               class_counts: Sequence[int] | np.ndarray | None = None,
               classes: Sequence[str] | None = None, multilabel: bool = False,
               dataset: str | None = None, options: Mapping[str, Any] | None = None) -> LossFn:
    """The loss :func:`loss_name` selects (registered names are case-insensitive), built from ``cfg``.

    With ``loss.class_weights`` set, the factory also gets ``class_weights`` (:func:`resolve_class_weights`:
    ``balanced`` needs ``class_counts``, the training split's samples per class, named by ``classes``).
    ``multilabel``: the targets are multi-hot rows; the built-in BCE then smooths them per class, a plugin's loss
    gets them as they are. ``dataset`` (e.g. ``data.name=mine``) is named when ``balanced`` weights have no
    counts to come from. ``options``: the factory's own keyword arguments (on the command line, the ``loss`` keys
    the schema does not declare: :func:`paddletrain.config.factory_options`).
    """
    if dataset is not None and getattr(cfg, "class_weights", None) == "balanced" and class_counts is None:
        raise ConfigError(f"{CLASS_WEIGHTS_KEY}=balanced needs the label of every training sample, but {dataset} "
                          "exposes no `targets`: give loss.class_weights as a list")
    name = loss_name(cfg.name, multilabel)
    factory = LOSSES.get(name)
    setting = getattr(cfg, "class_weights", None)
    weights = None
    if setting is not None:
        if not takes_class_weights(factory):
            raise ConfigError(f"{CLASS_WEIGHTS_KEY} is not supported by loss.name={name} (its factory takes no "
                              "class_weights)")
        weights = resolve_class_weights(setting, num_classes, class_counts, classes)
        shown = ", ".join(f"{w:.4g}" for w in weights[:10]) + (", ..." if len(weights) > 10 else "")
        log.info("%s=%s: %s", CLASS_WEIGHTS_KEY, setting if isinstance(setting, str) else "list", shown)
    options = {**({"multilabel": True} if multilabel and name == "binary_cross_entropy" else {}), **(options or {})}
    return factory(cfg, **options) if weights is None else factory(cfg, class_weights=weights, **options)
