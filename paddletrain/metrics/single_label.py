"""Classification metrics accumulated on the device, synchronised to the host once per epoch, and the one
definition of training throughput.

With ``per_class`` (validation) the meter also counts, per class, the samples, the top-1 predictions and the hits,
and for up to :data:`MAX_CONFUSION_CLASSES` classes the confusion matrix: fixed-size tensors that a scatter-add
updates on the device, so a step still costs no host sync. :class:`ClassReport` turns those counts into
balanced accuracy (sklearn's ``balanced_accuracy_score``: mean recall over the classes present in the labels),
per-class precision, recall and F1 (0 where undefined, sklearn's ``zero_division=0``) and the matrix.
"""
from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import paddle

from paddletrain.checkpoint.untrusted import StateValueError, checked_int, checked_mapping, show


@dataclass
class Throughput:
    """Training throughput: images per second of training steps.

    The time of a step is the wait for its batch plus its compute (forward, backward, optimizer); what runs
    between steps (validation, checkpoints, logging) is not part of it. The progress bar, the log, VisualDL,
    ``summary.json`` and ``bench`` all report this one figure; wall time is reported beside it, separately.
    """

    images: int = 0
    data_time: float = 0.0
    compute_time: float = 0.0

    def add(self, images: int, data_time: float, compute_time: float) -> None:
        self.images += images
        self.data_time += data_time
        self.compute_time += compute_time

    @property
    def seconds(self) -> float:
        """Time spent in training steps."""
        return self.data_time + self.compute_time

    @property
    def images_per_second(self) -> float:
        return self.images / self.seconds if self.seconds > 0 else 0.0

    @property
    def data_share(self) -> float:
        """Fraction of the step time spent waiting for data (high: the loader is the bottleneck)."""
        return self.data_time / self.seconds if self.seconds > 0 else 0.0


def topk_correct(logits: paddle.Tensor, labels: paddle.Tensor, ks: Sequence[int]) -> paddle.Tensor:
    """Number of samples whose label is among the top-k logits, for each k in ``ks`` (a float32 tensor)."""
    return _topk_hits(logits, labels, ks)[0]


def _topk_hits(logits: paddle.Tensor, labels: paddle.Tensor,
               ks: Sequence[int]) -> tuple[paddle.Tensor, paddle.Tensor, paddle.Tensor]:
    """(hits per k, the top-k predictions ``[batch, max(ks)]``, the labels as a ``[batch, 1]`` tensor of the
    predictions' dtype)."""
    _, pred = paddle.topk(logits, k=max(ks), axis=-1)
    labels = labels.reshape([-1, 1])
    if labels.dtype != pred.dtype:  # a cast is a kernel launch: skip it when the dtypes already agree
        labels = labels.astype(pred.dtype)
    hits = pred == labels
    return paddle.stack([hits[:, :k].any(axis=-1).astype("float32").sum() for k in ks]), pred, labels


# The confusion matrix is kept up to this many classes (ImageNet-1k: 10^6 counts, 8 MB all-reduced once per
# validation); above it, only the per-class counts behind balanced accuracy, precision, recall and F1.
MAX_CONFUSION_CLASSES = 1000


@dataclass
class ClassReport:
    """Per-class results of one evaluation, from all ranks' counts.

    ``support``: samples of each class (true label), ``predicted``: top-1 predictions of each class, ``correct``:
    top-1 hits of each class; ``confusion``: ``[true, predicted]`` counts, or None above
    :data:`MAX_CONFUSION_CLASSES` classes; ``class_names``: one per class (index for classes without a name).
    """

    support: np.ndarray
    predicted: np.ndarray
    correct: np.ndarray
    confusion: np.ndarray | None
    class_names: list[str]

    @property
    def recall(self) -> np.ndarray:
        return np.divide(self.correct, self.support, out=np.zeros(len(self.support)), where=self.support > 0)

    @property
    def precision(self) -> np.ndarray:
        return np.divide(self.correct, self.predicted, out=np.zeros(len(self.predicted)), where=self.predicted > 0)

    @property
    def f1(self) -> np.ndarray:
        p, r = self.precision, self.recall
        return np.divide(2 * p * r, p + r, out=np.zeros(len(p)), where=(p + r) > 0)

    @property
    def balanced_accuracy(self) -> float | None:
        """Mean recall over the classes present in the labels (None without labels)."""
        present = self.support > 0
        return float(self.recall[present].mean()) if present.any() else None

    def per_class(self) -> dict[str, dict[str, float | int]]:
        """``{class name: {precision, recall, f1, support}}`` in class order."""
        p, r, f = self.precision, self.recall, self.f1
        return {name: {"precision": float(p[k]), "recall": float(r[k]), "f1": float(f[k]),
                       "support": int(self.support[k])} for k, name in enumerate(self.class_names)}

    def to_dict(self) -> dict[str, Any]:
        """What ``summary.json`` and ``evaluate`` write: ``classes`` (names in class order), ``per_class``, and
        ``confusion_matrix`` (rows: true class, columns: predicted class, in class order) when it was kept."""
        out: dict[str, Any] = {"classes": list(self.class_names), "per_class": self.per_class()}
        if self.confusion is not None:
            out["confusion_matrix"] = self.confusion.tolist()
        return out

    def table(self) -> list[str]:
        """A readable per-class table (sklearn's classification report), one line per class, then the means."""
        width = max([len(name) for name in self.class_names] + [len("balanced accuracy")])
        lines = [f"{'class':<{width}}  precision  recall     f1  support"]
        p, r, f = self.precision, self.recall, self.f1
        for k, name in enumerate(self.class_names):
            lines.append(f"{name:<{width}}  {p[k]:9.4f}  {r[k]:6.4f}  {f[k]:.4f}  {self.support[k]:7d}")
        present = self.support > 0
        if present.any():
            lines.append(f"{'macro avg':<{width}}  {p[present].mean():9.4f}  {r[present].mean():6.4f}  "
                         f"{f[present].mean():.4f}  {int(self.support.sum()):7d}")
            lines.append(f"{'balanced accuracy':<{width}}  {self.balanced_accuracy:.4f}")
        return lines


def class_names_for(num_classes: int, names: Sequence[str] | None) -> list[str]:
    """One distinct name per class: ``names`` where given (made distinct by their index), the index elsewhere."""
    names = list(names or [])[:num_classes]
    full = [str(name) for name in names] + [str(k) for k in range(len(names), num_classes)]
    if len(set(full)) < len(full):  # e.g. two folders given one display name: keys of a dict must differ
        full = [f"{k}:{name}" for k, name in enumerate(full)]
    return full


class ClassificationMeter:
    """Sums of loss and top-k hits over an epoch, kept on the device so a step costs no host sync.

    ``ks`` are the top-k accuracies to report; k larger than the number of classes is dropped. ``per_class``
    (validation) also counts per class and the confusion matrix (see the module notes); their size is the
    logits' width, taken at the first batch. Those counts are not part of :meth:`state_dict` (a validation is
    never resumed half-way).
    """

    def __init__(self, num_classes: int | None = None, ks: Sequence[int] = (1, 5), per_class: bool = False) -> None:
        self.ks = tuple(k for k in ks if num_classes is None or k <= num_classes) or (1,)
        self.per_class = per_class
        self.reset()

    def reset(self) -> None:
        self._loss_sum: paddle.Tensor | None = None
        self._hits: paddle.Tensor | None = None
        self._class_counts: paddle.Tensor | None = None  # [3 * C]: support, predicted, correct
        self._confusion: paddle.Tensor | None = None  # [C * C], row-major [true, predicted]
        self.num_outputs: int | None = None
        self.count = 0

    def update(self, loss: paddle.Tensor, logits: paddle.Tensor | None, labels: paddle.Tensor | None,
               batch_size: int) -> None:
        """Add a batch: ``loss`` is the batch mean; logits/labels may be None for custom tasks."""
        loss = loss.detach()
        if loss.dtype != paddle.float32:  # AMP losses may be half precision; summing needs float32
            loss = loss.astype("float32")
        loss_sum = loss * batch_size
        self._loss_sum = loss_sum if self._loss_sum is None else self._loss_sum + loss_sum
        if logits is not None and labels is not None:
            if any(k > logits.shape[-1] for k in self.ks):
                self.ks = tuple(k for k in self.ks if k <= logits.shape[-1]) or (1,)
                if self._hits is not None:
                    self._hits = self._hits[: len(self.ks)]
            hits, pred, labels = _topk_hits(logits.detach(), labels, self.ks)
            self._hits = hits if self._hits is None else self._hits + hits
            if self.per_class:  # validation only: training steps launch no extra kernel
                self._count_classes(pred[:, 0], labels.reshape([-1]), int(logits.shape[-1]))
        self.count += batch_size

    def _count_classes(self, top1: paddle.Tensor, labels: paddle.Tensor, num_outputs: int) -> None:
        """Scatter-add this batch into the per-class counts (and the confusion matrix): fixed-size tensors, so
        nothing waits for the device (a bincount's output size would need the host to see the largest label)."""
        if self._class_counts is None:
            self.num_outputs = num_outputs
            self._class_counts = paddle.zeros([3 * num_outputs], dtype="int64")
            if num_outputs <= MAX_CONFUSION_CLASSES:
                self._confusion = paddle.zeros([num_outputs * num_outputs], dtype="int64")
        c = self.num_outputs
        ones = paddle.ones_like(labels)
        correct = (top1 == labels).astype("int64")
        index = paddle.concat([labels, top1 + c, labels + 2 * c])
        self._class_counts = paddle.index_add(self._class_counts, index, 0, paddle.concat([ones, ones, correct]))
        if self._confusion is not None:
            self._confusion = paddle.index_add(self._confusion, labels * c + top1, 0, ones)

    def state_dict(self) -> dict[str, object]:
        """The running sums, so a run resumed mid-epoch reports the same epoch metrics as an uninterrupted one."""
        return {"ks": list(self.ks), "count": self.count, "loss_sum": self._loss_sum, "hits": self._hits}

    def load_state_dict(self, state: dict[str, object]) -> None:
        """Restore :meth:`state_dict`; a malformed value raises ``StateValueError`` naming it."""
        checked_mapping(state, "(meter state)")
        ks = state.get("ks")
        if not isinstance(ks, list) or not 1 <= len(ks) <= 16:
            raise StateValueError("ks", f"is {show(ks)}: expected a list of top-k values")
        ks = tuple(checked_int(k, f"ks[{i}]", minimum=1, maximum=1 << 20) for i, k in enumerate(ks))
        count = checked_int(state.get("count"), "count")
        loss_sum, hits = state.get("loss_sum"), state.get("hits")
        for name, value, size in (("loss_sum", loss_sum, 1), ("hits", hits, len(ks))):
            if value is not None and (not isinstance(value, paddle.Tensor) or value.size != size):
                raise StateValueError(name, f"is {show(value)}: expected a tensor of {size} value(s) or null")
        self.ks, self.count, self._loss_sum, self._hits = ks, count, loss_sum, hits  # type: ignore[assignment]

    def sums(self) -> paddle.Tensor:
        """[count, loss_sum, hits@k...] as one float64 tensor: what distributed evaluation all-reduces."""
        parts = [paddle.to_tensor([float(self.count)], dtype="float64")]
        loss_sum = self._loss_sum if self._loss_sum is not None else paddle.zeros([])
        parts.append(loss_sum.astype("float64").reshape([1]))
        if self._hits is not None:
            parts.append(self._hits.astype("float64"))
        # float64 holds counts exactly up to 2^53; one tensor, so distributed evaluation all-reduces once.
        parts += [t.astype("float64") for t in (self._class_counts, self._confusion) if t is not None]
        return paddle.concat(parts)

    def compute(self, prefix: str, sums: paddle.Tensor | None = None) -> dict[str, float]:
        """Mean loss and top-k accuracies as ``{prefix}/loss``, ``{prefix}/top1``...; ``sums`` overrides local sums.

        With ``per_class``: ``{prefix}/balanced_accuracy`` too."""
        values = (sums if sums is not None else self.sums()).numpy()
        count = float(values[0])
        if count == 0:
            return {}
        out = {f"{prefix}/loss": float(values[1]) / count}
        # No hits without logits (a custom task): then only the loss is reported.
        for k, hits in zip(self.ks, values[2:2 + len(self.ks)].tolist(), strict=False):
            out[f"{prefix}/top{k}"] = hits / count
        report = self.report(values)
        if report is not None and report.balanced_accuracy is not None:
            out[f"{prefix}/balanced_accuracy"] = report.balanced_accuracy
        return out

    def report(self, sums: paddle.Tensor | np.ndarray | None = None,
               class_names: Sequence[str] | None = None) -> ClassReport | None:
        """The per-class counts of ``sums`` (default: the local ones) as a :class:`ClassReport`; None without them."""
        if self.num_outputs is None or self._hits is None:
            return None
        values = sums if sums is not None else self.sums()
        values = np.rint(values.numpy() if isinstance(values, paddle.Tensor) else np.asarray(values))
        c, start = self.num_outputs, 2 + len(self.ks)
        support, predicted, correct = values[start:start + 3 * c].astype(np.int64).reshape(3, c)
        flat = values[start + 3 * c:]
        confusion = flat.astype(np.int64).reshape(c, c) if len(flat) == c * c and c > 0 else None
        return ClassReport(support, predicted, correct, confusion, class_names_for(c, class_names))
