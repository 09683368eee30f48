"""A batch sampler whose order is a pure function of (seed, epoch), and that can resume mid-epoch.

Each yielded batch is a list of :class:`SampleKey` ``(index, epoch, batch, rank, position)``. Carrying the
epoch, rank and batch number to the dataset lets :class:`paddletrain.data.loading.loaders.SeededDataset` seed
augmentation per batch in any worker process (persistent or not); the batch number also lets the loader
record exactly how many batches the consumer has received, which the sampler itself cannot know while
workers prefetch ahead of it.

:class:`WeightedBatchSampler` replaces the epoch's permutation by a draw with replacement (class-balanced
sampling); sharding, repeats, skipping and resuming are the same.
"""
from __future__ import annotations

import hashlib
import logging
import threading
from collections.abc import Iterator, Sized
from typing import Any, NamedTuple

import numpy as np
from paddle.io import DistributedBatchSampler

from paddletrain.checkpoint.untrusted import StateValueError, checked_int, checked_mapping, required, show
from paddletrain.errors import UserError

log = logging.getLogger("paddletrain")


class SampleKey(NamedTuple):
    """What the sampler hands to ``dataset[...]`` for one sample."""

    index: int
    epoch: int
    batch: int
    rank: int = 0
    position: int = 0  # within the batch; 0 marks the sample that seeds the batch's augmentation


# The sample a transform is running on, set by paddletrain.data.loading.loaders.SeededDataset around its transform:
# what a
# deterministic augmentation reads (AlternatingFlip). Per thread; None outside a SeededDataset.
_current = threading.local()


class CurrentSample(NamedTuple):
    """The loader's seed, and the dataset index and epoch of the sample being transformed."""

    seed: int
    index: int
    epoch: int


def current_sample() -> CurrentSample | None:
    """The sample :class:`~paddletrain.data.loading.loaders.SeededDataset` is transforming in this thread, if any."""
    return getattr(_current, "sample", None)


def set_current_sample(sample: CurrentSample | None) -> None:
    _current.sample = sample


class ResumableBatchSampler(DistributedBatchSampler):
    """Deterministic, shardable, resumable batches of :class:`SampleKey`.

    The epoch's global order is a permutation drawn from ``(seed, epoch)`` (or ``range(len)`` without
    shuffle), padded by wrapping around to a multiple of ``num_replicas``; rank ``r`` takes every
    ``num_replicas``-th index starting at ``r``. Padding repeats therefore come last on every rank:
    ``num_real_samples`` says how many of this rank's samples are real.

    ``position`` counts the batches of the current epoch already delivered to the consumer (the loader
    advances it); ``state_dict()`` saves it and ``load_state_dict()`` makes the next iteration start there.

    A dataset may order its own epochs: one with an ``epoch_order(seed, epoch)`` method (tar shards, whose order
    keeps reads local: :mod:`paddletrain.data.shards.order`) gives the global order instead of the permutation.

    Continued on another number of ranks mid-epoch (without repeats; the batch per rank may change with them, to
    keep the global batch), the saved state says how many entries of the epoch's global order were consumed
    (``consumed``: every rank takes the same number of batches, so they are the order's first
    ``position * batch_size * num_replicas``); the rest of the order is dealt to the new ranks in the same way, so
    every remaining sample of the epoch is seen exactly once. The new dealing's batches are numbered on from the
    ``position`` reached, so a trainer's count of the epoch's batches goes on where it stopped.

    Repeated augmentation (``num_repeats`` k > 1; Hoffer et al. 2020, "Augment Your Batch", as DeiT's and timm's
    ``RepeatAugSampler`` define it for training): every index of the epoch's permutation is repeated k times in a
    row, the stream is padded by wrapping to a multiple of ``num_replicas``, and rank ``r`` takes every
    ``num_replicas``-th entry starting at ``r``. The ranks' shares are disjoint slices of that stream, and with
    at least k ranks the k copies of an image go to k different ranks in the same step (each augmented
    differently, since every rank and batch position seeds its own augmentation). Each rank then keeps the
    first ``ceil(len(dataset) / num_replicas)`` entries of its share, as timm does (``num_selected_samples``,
    without its rounding to multiples of 256): the epoch keeps its length and number of steps, so an epoch
    shows about ``len(dataset) / k`` distinct images k times each, and the next epoch's permutation others.
    """

    # What orders an epoch; saved, so that a resume mid-epoch with another sampling is refused.
    sampling = "random"

    def __init__(self, dataset: Sized, batch_size: int, *, shuffle: bool = False, drop_last: bool = False,
                 seed: int = 0, num_replicas: int = 1, rank: int = 0, num_repeats: int = 1) -> None:
        if not isinstance(seed, (int, np.integer)) or seed < 0:
            raise ValueError(f"sampler seed must be a non-negative integer, got {seed!r}")
        if not 0 <= rank < num_replicas:
            raise ValueError(f"rank={rank} must be in [0, num_replicas={num_replicas})")
        if isinstance(num_repeats, bool) or not isinstance(num_repeats, (int, np.integer)) or num_repeats < 1:
            raise ValueError(f"num_repeats (repeated augmentation) must be an integer >= 1, got {num_repeats!r}")
        super().__init__(dataset, batch_size, num_replicas=num_replicas, rank=rank, shuffle=shuffle,
                         drop_last=drop_last)
        self.seed = int(seed)
        self.num_repeats = int(num_repeats)
        self.position = 0
        self._skip = 0
        # Entries of the epoch's global order consumed before this dealing (a resume on another number of ranks),
        # and the batches this rank counts as done then: the new dealing's batches are numbered on from there.
        self._offset = 0
        self._offset_batches = 0
        self.sampling = self._with_order_key(self.sampling)

    def _with_order_key(self, sampling: str) -> str:
        """``sampling`` with what fixes the dataset's own order (shards: their sample counts and the shuffle
        buffer), so that a resume mid-epoch with another order is refused, not silently re-ordered."""
        key = getattr(self.dataset, "order_key", None)
        return f"{sampling}:{key}" if key and getattr(self.dataset, "epoch_order", None) else sampling

    @property
    def num_real_samples(self) -> int:
        """Samples of this rank that are not padding (they come first in its order).

        With repeated augmentation every sample is a training draw: there is no padding to tell apart.
        """
        if self.num_repeats > 1:
            return self.num_samples
        return len(range(self.local_rank, len(self.dataset) - self._offset, self.nranks))

    def _rank_samples(self) -> int:
        """This rank's entries of the epoch, padding included (fewer after a resume on another number of ranks)."""
        if not self._offset:
            return self.num_samples
        return -(-(len(self.dataset) - self._offset) // self.nranks)

    def __len__(self) -> int:
        """Batches per full epoch (a pending skip does not shorten it; after a new dealing, the batches done
        before it and those of the dealing)."""
        samples = self._rank_samples()
        if self.drop_last:
            return self._offset_batches + samples // self.batch_size
        return self._offset_batches + -(-samples // self.batch_size)

    def set_epoch(self, epoch: int) -> None:
        """Select the epoch whose order the next iteration yields.

        Moving to another epoch resets ``position`` and any pending skip; setting the current epoch again
        keeps them, so ``load_state_dict()`` followed by the trainer's usual ``set_epoch()`` still resumes.
        """
        if epoch != self.epoch:
            self.position = 0
            self._skip = 0
            self._offset = self._offset_batches = 0
        self.epoch = int(epoch)

    def skip_batches(self, n: int) -> None:
        """Make the next iteration (only) start at batch ``n`` of the current epoch's order."""
        if n < 0:
            raise ValueError(f"cannot skip a negative number of batches ({n})")
        self._skip = int(n)
        self.position = int(n)

    def epoch_order(self) -> np.ndarray:
        """The epoch's global order of sample indices, before repeats, padding and sharding."""
        n = len(self.dataset)
        own_order = getattr(self.dataset, "epoch_order", None)
        if self.shuffle and callable(own_order):
            return np.asarray(own_order(self.seed, self.epoch), np.int64)
        if self.shuffle:
            return np.random.default_rng([self.seed, self.epoch]).permutation(n)
        return np.arange(n)

    def repeated_stream(self) -> np.ndarray:
        """The epoch's global stream with every index repeated ``num_repeats`` times in a row, padded by
        wrapping to a multiple of ``num_replicas`` (before any rank keeps only its first entries)."""
        stream = np.repeat(self.epoch_order(), self.num_repeats)
        total = -(-len(stream) // self.nranks) * self.nranks
        return np.resize(stream, total)

    def epoch_indices(self) -> list[int]:
        """This rank's sample indices for the current epoch, padding included, in order."""
        if self.num_repeats > 1:
            share = self.repeated_stream()[self.local_rank::self.nranks]
            return share[:self.num_samples].tolist()
        order = self.epoch_order()[self._offset:]
        # Wraps around: pads with the head of the (remaining) order to a multiple of the ranks.
        order = np.resize(order, self._rank_samples() * self.nranks)
        return order[self.local_rank::self.nranks].tolist()

    def __iter__(self) -> Iterator[list[SampleKey]]:
        indices = self.epoch_indices()
        start, self._skip = self._skip, 0
        epoch, size, rank = self.epoch, self.batch_size, self.local_rank
        begin = (start - self._offset_batches) * size
        # A dataset that reads remote files (tar shards) copies them ahead of the readers, in the order dealt here.
        fetch_ahead = getattr(self.dataset, "fetch_ahead", None)
        ahead = fetch_ahead(indices[begin:]) if callable(fetch_ahead) else None
        try:
            for batch in range(start, len(self)):
                first = (batch - self._offset_batches) * size
                chunk = indices[first:first + size]
                if ahead is not None:
                    ahead.advance(first - begin + len(chunk))
                yield [SampleKey(int(i), epoch, batch, rank, position) for position, i in enumerate(chunk)]
        finally:
            if ahead is not None:
                ahead.close(timeout=0)

    def state_dict(self) -> dict[str, Any]:
        """Everything needed to continue this epoch's order where the consumer stopped."""
        dealt = max(self.position - self._offset_batches, 0)
        consumed = min(self._offset + dealt * self.batch_size * self.nranks, len(self.dataset))
        return {"seed": self.seed, "epoch": self.epoch, "position": self.position, "consumed": consumed,
                "offset": self._offset, "offset_batches": self._offset_batches,
                "batch_size": self.batch_size, "num_replicas": self.nranks, "dataset_size": len(self.dataset),
                "num_repeats": self.num_repeats, "sampling": self.sampling}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore seed, epoch and position; the next iteration continues at ``position``.

        Raises:
            ValueError: resuming mid-epoch with a different batch size, world size, dataset length, number
                of repeats or sampling, where the saved position would point into a different order.
        """
        checked_mapping(state, "(sampler state)")
        position = checked_int(state.get("position", 0), "position")
        seed = checked_int(required(state, "seed", "seed"), "seed", maximum=2**63 - 1)
        epoch = checked_int(required(state, "epoch", "epoch"), "epoch")
        current = {"batch_size": self.batch_size, "num_replicas": self.nranks, "dataset_size": len(self.dataset),
                   "num_repeats": self.num_repeats, "sampling": self.sampling}
        changed = {k: (state[k], v) for k, v in current.items() if k in state and state[k] != v}
        if position and "num_replicas" in changed and set(changed) <= {"num_replicas", "batch_size"} \
                and self.num_repeats == 1 and "consumed" in state:
            # Another number of ranks: deal the rest of the epoch's order to them (see the class docstring).
            consumed = checked_int(state["consumed"], "consumed", maximum=len(self.dataset))
            if self.local_rank == 0:
                log.info("Continuing epoch %d mid-way (batch %d) on %d rank(s), the checkpoint's %d: the %d samples of "
                         "its order not yet trained on are dealt to the ranks, each once", epoch + 1, position,
                         self.nranks, state["num_replicas"], len(self.dataset) - consumed)
            self.seed, self.epoch = seed, epoch
            self._offset, self._offset_batches = consumed, position
            self.skip_batches(position)
            return
        if position and changed:
            detail = ", ".join(f"{k} was {show(old)}, now {new}" for k, (old, new) in changed.items())
            raise UserError(f"cannot resume mid-epoch (batch {position}) because the sampling changed: {detail}. "
                             "Resume from an end-of-epoch checkpoint or restore the original settings.")
        self._offset = checked_int(state.get("offset", 0), "offset", maximum=len(self.dataset))
        self._offset_batches = checked_int(state.get("offset_batches", 0), "offset_batches", maximum=position)
        if position > len(self):
            raise StateValueError("position", f"is {position}, but an epoch has only {len(self)} batches")
        self.seed = seed
        self.epoch = epoch
        self.skip_batches(position)


class WeightedBatchSampler(ResumableBatchSampler):
    """:class:`ResumableBatchSampler` whose epoch is a draw with replacement, by per-sample ``weights``.

    Each epoch draws ``len(dataset)`` indices from ``(seed, epoch)`` with probabilities proportional to
    ``weights``, as PyTorch's ``WeightedRandomSampler(weights, num_samples=len(dataset), replacement=True)``
    does; the draw is then repeated, padded, sharded (rank ``r`` takes every ``num_replicas``-th entry from ``r``:
    the ranks' shares are disjoint positions of one draw), batched and resumed exactly like the permutation of
    the parent class. With ``1 / count`` of each sample's class as its weight
    (:func:`paddletrain.data.sampling.balance.class_balanced_weights`) every class is drawn equally often in
    expectation.
    """

    def __init__(self, dataset: Sized, batch_size: int, weights: np.ndarray, *, drop_last: bool = False,
                 seed: int = 0, num_replicas: int = 1, rank: int = 0, num_repeats: int = 1) -> None:
        weights = np.asarray(weights, dtype=np.float64).reshape(-1)
        if len(weights) != len(dataset):
            raise ValueError(f"{len(weights)} sample weights for a dataset of {len(dataset)} samples")
        if not np.all(np.isfinite(weights)) or np.any(weights < 0) or not weights.sum() > 0:
            raise ValueError("sample weights must be finite, >= 0 and not all 0")
        super().__init__(dataset, batch_size, shuffle=True, drop_last=drop_last, seed=seed,
                         num_replicas=num_replicas, rank=rank, num_repeats=num_repeats)
        self.probabilities = weights / weights.sum()
        # Other weights (another class count) would make a saved mid-epoch position point into another draw.
        digest = hashlib.sha256(self.probabilities.astype("<f8").tobytes()).hexdigest()[:16]
        self.sampling = self._with_order_key(f"weighted:{digest}")

    def epoch_order(self) -> np.ndarray:
        """The epoch's draw of ``len(dataset)`` indices with replacement, a pure function of (seed, epoch)."""
        n = len(self.dataset)
        own_order = getattr(self.dataset, "epoch_order", None)
        if callable(own_order):  # a dataset that orders its own epochs draws within its windows (shards)
            return np.asarray(own_order(self.seed, self.epoch, weights=self.probabilities), np.int64)
        return np.random.default_rng([self.seed, self.epoch]).choice(n, size=n, replace=True, p=self.probabilities)
