"""What the Trainer asks of the objects it is given besides callbacks: the data's samplers and loaders, and the
batch transform. Each contract is a small runtime-checkable Protocol, so the Trainer tests for it with
``isinstance`` and any class with those methods qualifies, without deriving from anything.

The data pipeline's own classes (:class:`~paddletrain.data.sampling.sampler.ResumableBatchSampler`,
:class:`~paddletrain.data.loading.loaders.CheckedDataLoader`, :class:`~paddletrain.data.transforms.mixup.Mixup`)
fulfil all of them;
a plain ``paddle.io.DataLoader`` or a list of batches fulfils none, and the Trainer then does without.
"""
from __future__ import annotations

from typing import Any, Protocol, runtime_checkable

import paddle


@runtime_checkable
class Stateful(Protocol):
    """Has a position to save and restore, so a resumed run continues exactly.

    ``state_dict()`` returns JSON-like data (numbers, strings, lists, dicts); ``load_state_dict`` restores it and
    raises ``ValueError``/``TypeError`` (or :class:`~paddletrain.checkpoint.untrusted.StateValueError`) for a value
    that does not fit. The Trainer saves a training batch sampler's state and, one entry per rank, the batch
    transform's.
    """

    def state_dict(self) -> dict[str, Any]: ...

    def load_state_dict(self, state: dict[str, Any]) -> None: ...


@runtime_checkable
class EpochSampler(Protocol):
    """A batch sampler whose order depends on the epoch: the Trainer calls ``set_epoch(epoch)`` (0-based) before
    each training epoch, as ``paddle.io.DistributedBatchSampler`` expects."""

    def set_epoch(self, epoch: int) -> None: ...


@runtime_checkable
class SkippingSampler(Protocol):
    """A batch sampler that can start its next iteration at batch ``n`` of the epoch.

    On resume mid-epoch the Trainer calls ``skip_batches(batch_in_epoch)`` on a sampler that is not
    :class:`Stateful` (a stateful one restores its position itself).
    """

    def skip_batches(self, n: int) -> None: ...


@runtime_checkable
class PaddedLoader(Protocol):
    """A loader whose shard is padded to equal length across ranks: validation counts only its first
    ``num_real_samples`` samples, so padded repeats do not count twice."""

    @property
    def num_real_samples(self) -> int: ...


class BatchTransform(Protocol):
    """``transform(images, labels) -> (images, targets)``, run on every training batch before the forward pass
    (e.g. Mixup/CutMix, whose soft targets the loss takes); metrics still count the original labels. A transform
    that draws random numbers should also be :class:`Stateful`, so a resumed run draws what an uninterrupted one
    would."""

    def __call__(self, images: paddle.Tensor, labels: paddle.Tensor) -> tuple[paddle.Tensor, paddle.Tensor]: ...


def batch_sampler_of(loader: Any) -> Any | None:
    """The batch sampler of a ``paddle.io.DataLoader`` (the object the sampler hooks above apply to); None for
    any other iterable of batches."""
    return loader.batch_sampler if isinstance(loader, paddle.io.DataLoader) else None


def continues_mid_epoch(loader: Any) -> bool:
    """Whether a training loader can continue an epoch at a given batch exactly: its batch sampler restores its
    position (:class:`Stateful`) or skips to it (:class:`SkippingSampler`), or it is a fixed sequence of batches
    (a list, whose first batches the Trainer skips). Any other loader (a plain ``paddle.io.DataLoader``) draws its
    order and augmentation when the epoch starts, which a mid-epoch checkpoint does not hold."""
    sampler = batch_sampler_of(loader)
    return isinstance(sampler, (Stateful, SkippingSampler)) or isinstance(loader, (list, tuple))


def describe_loader(loader: Any) -> str:
    """``DataLoader(batch_sampler=BatchSampler(sampler=RandomSampler))``-like words for a message."""
    sampler = batch_sampler_of(loader)
    if sampler is None:
        return type(loader).__name__
    inner = getattr(sampler, "sampler", None)
    return (f"{type(loader).__name__}(batch_sampler={type(sampler).__name__}"
            f"{f'(sampler={type(inner).__name__})' if inner is not None else ''})")
