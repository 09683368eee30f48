"""An epoch's order of the samples of a set of shards: a pure function of (seed, epoch), local in its reads.

A global permutation of millions of samples would read every shard at every step; no shuffle at all would put
one shard's classes side by side. The usual middle way (WebDataset, LitData, MosaicML Streaming) is a shuffle of
the shards and a shuffle buffer within the stream. Here it is done on sample numbers, not on loaded samples:

1. the shards are permuted by ``(seed, epoch)``;
2. in that order they are cut into *windows*: consecutive shards holding at least ``shuffle_buffer`` samples
   (a window is never less than one shard);
3. the samples of each window are permuted by ``(seed, epoch, window)``.

The result is one global order of sample numbers. It depends on nothing else: not on the number of ranks or
loader workers (the sampler deals it out), not on what was read before (a resume recomputes it), not on the data
(only on the shards' sample counts). At any moment the samples being read come from one or two windows, so the
shards that must be on local disk are a window's worth, whatever the data set's size; a sample is read by its
offset, so nothing is buffered in memory.

With per-sample ``weights`` (``data.sampler=class_balanced``) each window draws its own length of samples with
replacement, in proportion to the weights of its samples: locality is kept, and the classes of a window are
balanced as far as the window holds them (``pack`` mixes every class into every shard).
"""
from __future__ import annotations

from collections.abc import Sequence

import numpy as np


def shard_starts(counts: Sequence[int]) -> np.ndarray:
    """The global number of each shard's first sample (``len(counts) + 1`` entries, the last being the total)."""
    starts = np.zeros(len(counts) + 1, np.int64)
    np.cumsum(np.asarray(counts, np.int64), out=starts[1:])
    return starts


def windows(shard_order: np.ndarray, counts: np.ndarray, shuffle_buffer: int) -> list[np.ndarray]:
    """``shard_order`` cut into runs of shards that hold at least ``shuffle_buffer`` samples each (the last may
    hold fewer)."""
    cut: list[np.ndarray] = []
    start, held = 0, 0
    for i, shard in enumerate(shard_order):
        held += int(counts[shard])
        if held >= shuffle_buffer:
            cut.append(shard_order[start:i + 1])
            start, held = i + 1, 0
    if start < len(shard_order):
        cut.append(shard_order[start:])
    return cut


def epoch_order(counts: Sequence[int], seed: int, epoch: int, shuffle_buffer: int, *, shuffle: bool = True,
                weights: np.ndarray | None = None) -> np.ndarray:
    """The epoch's global order of sample numbers (shard ``s``'s samples are ``starts[s]..starts[s+1]-1``).

    Without ``shuffle``: every shard in turn, in its own order. With ``weights`` (one per sample, not all zero in
    a window): each window's samples drawn with replacement by their weights, as many as the window holds.
    """
    if shuffle_buffer < 1:
        raise ValueError(f"shuffle_buffer={shuffle_buffer} must be at least 1")
    counts = np.asarray(counts, np.int64)
    starts = shard_starts(counts)
    if not shuffle:
        return np.arange(starts[-1], dtype=np.int64)
    shard_order = np.random.default_rng([seed, epoch, 0]).permutation(len(counts))
    parts = []
    for number, window in enumerate(windows(shard_order, counts, shuffle_buffer)):
        members = np.concatenate([np.arange(starts[s], starts[s + 1], dtype=np.int64) for s in window])
        if not len(members):
            continue
        rng = np.random.default_rng([seed, epoch, 1, number])
        if weights is None:
            parts.append(members[rng.permutation(len(members))])
            continue
        w = np.asarray(weights, np.float64)[members]
        if not w.sum() > 0:  # a window of zero-weight samples only: nothing of it is drawn
            continue
        parts.append(rng.choice(members, size=len(members), replace=True, p=w / w.sum()))
    return np.concatenate(parts) if parts else np.zeros(0, np.int64)
