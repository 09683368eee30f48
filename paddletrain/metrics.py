"""Classification metrics accumulated on the device, synchronised to the host once per epoch, and the one
definition of training throughput."""
from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

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
    maxk = max(ks)
    _, pred = paddle.topk(logits, k=maxk, axis=-1)
    labels = labels.reshape([-1, 1])
    if labels.dtype != pred.dtype:  # a cast is a kernel launch: skip it when the dtypes already agree
        labels = labels.astype(pred.dtype)
    hits = pred == labels
    return paddle.stack([hits[:, :k].any(axis=-1).astype("float32").sum() for k in ks])


class ClassificationMeter:
    """Sums of loss and top-k hits over an epoch, kept on the device so a step costs no host sync.

    ``ks`` are the top-k accuracies to report; k larger than the number of classes is dropped.
    """

    def __init__(self, num_classes: int | None = None, ks: Sequence[int] = (1, 5)) -> None:
        self.ks = tuple(k for k in ks if num_classes is None or k <= num_classes) or (1,)
        self.reset()

    def reset(self) -> None:
        self._loss_sum: paddle.Tensor | None = None
        self._hits: paddle.Tensor | None = None
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
            hits = topk_correct(logits.detach(), labels, self.ks)
            self._hits = hits if self._hits is None else self._hits + hits
        self.count += batch_size

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
        return paddle.concat(parts)

    def compute(self, prefix: str, sums: paddle.Tensor | None = None) -> dict[str, float]:
        """Mean loss and top-k accuracies as ``{prefix}/loss``, ``{prefix}/top1``...; ``sums`` overrides local sums."""
        values = (sums if sums is not None else self.sums()).numpy().tolist()
        count = values[0]
        if count == 0:
            return {}
        out = {f"{prefix}/loss": values[1] / count}
        # No hits without logits (a custom task): then only the loss is reported.
        for k, hits in zip(self.ks, values[2:], strict=False):
            out[f"{prefix}/top{k}"] = hits / count
        return out
