"""Multi-label metrics: mAP, per-class AP, and precision / recall / F1 at a score threshold.

A multi-label model scores every class on its own (sigmoid of its logit); a sample may have any number of
classes. Top-k accuracy means nothing there, so a multi-label run reports instead:

- ``AP`` per class, defined as scikit-learn's ``average_precision_score``: ``sum_k (R_k - R_{k-1}) * P_k`` over
  the distinct scores taken as thresholds from the highest down (tied scores form one threshold), with
  ``R_0 = 0``. No interpolation (unlike the 11-point VOC AP).
- ``val/mAP``: the mean of AP over the classes with at least one positive in the validation labels (AP is
  undefined for the others).
- at ``threshold`` (a class is predicted when its sigmoid score is above it): ``val/precision``,
  ``val/recall`` and ``val/f1`` counted over every (sample, class) pair (micro, "overall" OP/OR/OF1 in the
  multi-label literature), and ``val/f1_macro``, the mean per-class F1 over the same classes as ``val/mAP``.

:class:`MultiLabelMeter` has the interface of :class:`~paddletrain.metrics.ClassificationMeter` (``update``,
``sums``, ``compute``): the Trainer needs no multi-label knowledge. AP needs every score, so ``update`` keeps
each batch's logits and targets on the device (no host sync per step) and ``compute`` concatenates them once,
gathers them from every rank, and computes on the host in float64.
"""
from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np
import paddle

from paddletrain.metrics.single_label import ClassificationMeter

__all__ = ["LossMeter", "MultiLabelMeter", "MultiLabelReport", "average_precision", "multilabel_report"]

# Scores x classes computed at once by :func:`average_precision` (float64 work arrays of ~32 MB each).
_AP_CHUNK_ELEMENTS = 1 << 22


def average_precision(scores: np.ndarray, targets: np.ndarray) -> np.ndarray:
    """AP of each column of ``scores`` ``[n, classes]`` against 0/1 ``targets`` of the same shape.

    scikit-learn's definition (see the module notes); a class without positives gets NaN.
    """
    scores = np.asarray(scores, np.float64)
    targets = np.asarray(targets) > 0.5
    if scores.shape != targets.shape or scores.ndim != 2:
        raise ValueError(f"scores {scores.shape} and targets {targets.shape} must both be [samples, classes]")
    n, classes = scores.shape
    out = np.full(classes, np.nan)
    if n == 0:
        return out
    step = max(1, _AP_CHUNK_ELEMENTS // n)
    for start in range(0, classes, step):
        out[start:start + step] = _ap_columns(scores[:, start:start + step], targets[:, start:start + step])
    return out


def _ap_columns(scores: np.ndarray, targets: np.ndarray) -> np.ndarray:
    n = scores.shape[0]
    order = np.argsort(-scores, axis=0, kind="stable")
    ranked = np.take_along_axis(scores, order, axis=0)
    hits = np.take_along_axis(targets, order, axis=0).astype(np.float64)
    true_pos = np.cumsum(hits, axis=0)
    precision = true_pos / np.arange(1, n + 1)[:, None]
    # A threshold sits at the last sample of each group of tied scores: every sample of the group is predicted
    # with the precision there, so each positive counts the precision at the end of its group.
    group_end = np.ones_like(ranked, dtype=bool)
    group_end[:-1] = ranked[1:] != ranked[:-1]
    end_index = np.where(group_end, np.arange(n)[:, None], n)
    end_index = np.minimum.accumulate(end_index[::-1], axis=0)[::-1]
    precision_at_end = np.take_along_axis(precision, end_index, axis=0)
    positives = hits.sum(axis=0)
    with np.errstate(invalid="ignore", divide="ignore"):
        return np.where(positives > 0, (hits * precision_at_end).sum(axis=0) / positives, np.nan)


@dataclass
class MultiLabelReport:
    """Per-class results of a validation (arrays of one value per class; NaN where a value is undefined)."""

    threshold: float
    ap: np.ndarray
    precision: np.ndarray
    recall: np.ndarray
    f1: np.ndarray
    positives: np.ndarray
    predicted: np.ndarray
    true_positives: np.ndarray

    def metrics(self, prefix: str) -> dict[str, float]:
        """``{prefix}/mAP``, micro precision / recall / F1 and macro F1 (see the module notes)."""
        out: dict[str, float] = {}
        counted = self.positives > 0
        if counted.any():  # with no positive at all, AP and recall are undefined: nothing to report
            out[f"{prefix}/mAP"] = float(np.mean(self.ap[counted]))
            out[f"{prefix}/f1_macro"] = float(np.mean(self.f1[counted]))
        tp, predicted, positives = (float(a.sum()) for a in (self.true_positives, self.predicted, self.positives))
        out[f"{prefix}/precision"] = tp / predicted if predicted else 0.0
        if positives:
            out[f"{prefix}/recall"] = tp / positives
            out[f"{prefix}/f1"] = 2 * tp / (predicted + positives)
        return out

    def table(self, class_names: Sequence[str] | None = None) -> list[str]:
        """Lines of a per-class table: class, AP, precision, recall, F1, positives (``-`` where undefined)."""
        names = [str(n) for n in class_names] if class_names else [str(i) for i in range(len(self.ap))]
        width = max(5, *(len(n) for n in names))
        lines = [f"{'class':<{width}}  {'AP':>6}  {'prec':>6}  {'recall':>6}  {'F1':>6}  {'positives':>9}"]
        for i, name in enumerate(names):
            cells = [_cell(v[i]) for v in (self.ap, self.precision, self.recall, self.f1)]
            lines.append(f"{name:<{width}}  {'  '.join(cells)}  {int(self.positives[i]):>9}")
        return lines

    def rows(self, class_names: Sequence[str] | None = None) -> list[dict[str, object]]:
        """The table as JSON-ready dicts (None where undefined)."""
        names = list(class_names) if class_names else [str(i) for i in range(len(self.ap))]
        return [{"class": str(names[i]), "ap": _plain(self.ap[i]), "precision": _plain(self.precision[i]),
                 "recall": _plain(self.recall[i]), "f1": _plain(self.f1[i]), "positives": int(self.positives[i])}
                for i in range(len(self.ap))]


def _cell(value: float) -> str:
    return f"{value:6.4f}" if np.isfinite(value) else f"{'-':>6}"


def _plain(value: float) -> float | None:
    return float(value) if np.isfinite(value) else None


def multilabel_report(scores: np.ndarray, targets: np.ndarray, threshold: float = 0.5) -> MultiLabelReport:
    """Per-class AP and precision / recall / F1 of sigmoid ``scores`` against 0/1 ``targets`` at ``threshold``.

    Precision of a class that is never predicted, and recall and F1 of a class without positives, are NaN.
    """
    scores = np.asarray(scores, np.float64)
    positive = np.asarray(targets) > 0.5
    decided = scores > threshold
    true_pos = (decided & positive).sum(axis=0).astype(np.float64)
    predicted = decided.sum(axis=0).astype(np.float64)
    positives = positive.sum(axis=0).astype(np.float64)
    with np.errstate(invalid="ignore", divide="ignore"):
        precision = np.where(predicted > 0, true_pos / predicted, np.nan)
        recall = np.where(positives > 0, true_pos / positives, np.nan)
        # 2TP / (2TP + FP + FN): 0 for a class with positives that is never predicted right.
        f1 = np.where(positives > 0, 2 * true_pos / (predicted + positives), np.nan)
    return MultiLabelReport(float(threshold), average_precision(scores, positive), precision, recall, f1,
                            positives, predicted, true_pos)


class MultiLabelMeter:
    """Loss and the multi-label metrics of one validation (the interface of ClassificationMeter).

    Args:
        num_classes: width of the logits and targets.
        threshold: a class is predicted when its sigmoid score is above it.
        world_size: ranks whose scores :meth:`compute` gathers (it must then run on every rank).
    """

    def __init__(self, num_classes: int, threshold: float = 0.5, world_size: int = 1) -> None:
        if not 0 < threshold < 1:
            raise ValueError(f"threshold={threshold} must be between 0 and 1")
        self.num_classes = int(num_classes)
        self.threshold = float(threshold)
        self.world_size = int(world_size)
        self.report: MultiLabelReport | None = None
        self.reset()

    def reset(self) -> None:
        self._loss_sum: paddle.Tensor | None = None
        self._logits: list[paddle.Tensor] = []
        self._targets: list[paddle.Tensor] = []
        self.count = 0

    def update(self, loss: paddle.Tensor, logits: paddle.Tensor | None, labels: paddle.Tensor | None,
               batch_size: int) -> None:
        """Add a batch: ``loss`` is its mean, ``logits`` and multi-hot ``labels`` are ``[batch, classes]``."""
        loss_sum = loss.detach().astype("float32") * batch_size
        self._loss_sum = loss_sum if self._loss_sum is None else self._loss_sum + loss_sum
        if logits is not None and labels is not None:
            if list(labels.shape) != list(logits.shape):
                raise ValueError(f"multi-label targets of shape {list(labels.shape)} do not match the logits' "
                                 f"{list(logits.shape)}")
            self._logits.append(logits.detach().astype("float32"))
            self._targets.append(labels.detach().astype("uint8"))
        self.count += batch_size

    def sums(self) -> paddle.Tensor:
        """[count, loss_sum] as one float64 tensor: what distributed evaluation all-reduces."""
        loss_sum = self._loss_sum if self._loss_sum is not None else paddle.zeros([])
        return paddle.concat([paddle.to_tensor([float(self.count)], dtype="float64"),
                              loss_sum.astype("float64").reshape([1])])

    def compute(self, prefix: str, sums: paddle.Tensor | None = None) -> dict[str, float]:
        """Mean loss, ``{prefix}/mAP``, precision / recall / F1 (all ranks' samples); ``sums`` overrides local
        sums. The per-class results stay in :attr:`report`."""
        values = (sums if sums is not None else self.sums()).numpy().tolist()
        scores, targets = self._gathered()
        if values[0] == 0:
            return {}
        out = {f"{prefix}/loss": values[1] / values[0]}
        if len(scores):
            self.report = multilabel_report(scores, targets, self.threshold)
            out.update(self.report.metrics(prefix))
        return out

    def _gathered(self) -> tuple[np.ndarray, np.ndarray]:
        """Every rank's sigmoid scores and targets, concatenated once (one host transfer per epoch)."""
        if self._logits:
            scores = paddle.nn.functional.sigmoid(paddle.concat(self._logits))
            targets = paddle.concat(self._targets)
        else:
            scores = paddle.zeros([0, self.num_classes], "float32")
            targets = paddle.zeros([0, self.num_classes], "uint8")
        if self.world_size > 1:
            scores, targets = _all_gather_rows(scores), _all_gather_rows(targets)
        return scores.numpy(), targets.numpy()


def _all_gather_rows(tensor: paddle.Tensor) -> paddle.Tensor:
    """Every rank's rows of ``tensor``, in rank order; ranks may hold different numbers of rows."""
    counts: list[paddle.Tensor] = []
    paddle.distributed.all_gather(counts, paddle.to_tensor([tensor.shape[0]], dtype="int64"))
    sizes = [int(c.item()) for c in counts]
    padded = tensor
    if tensor.shape[0] < max(sizes):  # all_gather needs one shape on every rank
        padding = paddle.zeros([max(sizes) - tensor.shape[0], *tensor.shape[1:]], tensor.dtype)
        padded = paddle.concat([tensor, padding]) if tensor.shape[0] else padding
    parts: list[paddle.Tensor] = []
    paddle.distributed.all_gather(parts, padded)
    return paddle.concat([part[:size] for part, size in zip(parts, sizes, strict=True)])


class LossMeter(ClassificationMeter):
    """The training meter of a multi-label run: the loss alone (top-k hits mean nothing for multi-hot targets).

    Its state is ClassificationMeter's (no hits), so a run resumed mid-epoch continues its sums.
    """

    def update(self, loss: paddle.Tensor, logits: paddle.Tensor | None, labels: paddle.Tensor | None,
               batch_size: int) -> None:
        super().update(loss, None, None, batch_size)


def task_meters(multilabel: bool, num_classes: int, threshold: float = 0.5,
                world_size: int = 1) -> Callable[[str], ClassificationMeter] | None:
    """The Trainer's meters for the task: None (its top-k default) for single-label data; for multi-label data the
    loss alone in training and mAP / F1 at ``threshold`` (``data.multilabel_threshold``) in validation, gathered
    from every rank."""
    if not multilabel:
        return None

    def meters(stage: str) -> LossMeter | MultiLabelMeter:
        return LossMeter(num_classes) if stage == "train" else MultiLabelMeter(num_classes, threshold, world_size)

    return meters
