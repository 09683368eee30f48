"""An epoch's order over shards: a pure function of (seed, epoch), local in its reads, the same on any number of
ranks, and continued exactly on another number of ranks (paddletrain.data.shards.order and the sampler)."""
from __future__ import annotations

import numpy as np
import pytest

from paddletrain.data.sampling.sampler import ResumableBatchSampler, WeightedBatchSampler
from paddletrain.data.shards.order import epoch_order, shard_starts, windows

COUNTS = [7, 5, 9, 6, 8, 4, 10, 3]  # 52 samples in 8 shards


class _Shards:
    """What the samplers see of a shard dataset: its length, targets and its own epoch order."""

    def __init__(self, counts=COUNTS, buffer=12):
        self.counts, self.buffer = counts, buffer
        self.targets = np.arange(sum(counts)) % 3

    def __len__(self):
        return sum(self.counts)

    def epoch_order(self, seed, epoch, weights=None):
        return epoch_order(self.counts, seed, epoch, self.buffer, weights=weights)

    @property
    def order_key(self):
        return f"buffer={self.buffer}"


def test_an_epoch_is_a_permutation_that_depends_only_on_seed_and_epoch():
    a = epoch_order(COUNTS, seed=3, epoch=1, shuffle_buffer=12)
    assert sorted(a.tolist()) == list(range(52))
    assert np.array_equal(a, epoch_order(COUNTS, seed=3, epoch=1, shuffle_buffer=12))
    assert not np.array_equal(a, epoch_order(COUNTS, seed=3, epoch=2, shuffle_buffer=12))
    assert not np.array_equal(a, epoch_order(COUNTS, seed=4, epoch=1, shuffle_buffer=12))
    assert np.array_equal(epoch_order(COUNTS, 0, 0, 12, shuffle=False), np.arange(52))


def test_the_samples_read_together_come_from_one_window_of_shards():
    starts = shard_starts(COUNTS)
    order = epoch_order(COUNTS, seed=0, epoch=0, shuffle_buffer=12)
    shard_of = np.searchsorted(starts, order, side="right") - 1
    cut = windows(np.random.default_rng([0, 0, 0]).permutation(len(COUNTS)), np.array(COUNTS), 12)
    assert all(sum(COUNTS[s] for s in w) >= 12 for w in cut[:-1])
    position = 0
    for window in cut:  # the order runs through the windows one after the other, each one's shards only
        size = sum(COUNTS[s] for s in window)
        assert set(shard_of[position:position + size]) == set(window.tolist())
        position += size
    assert position == 52


def test_a_buffer_of_one_reads_shard_after_shard():
    starts = shard_starts(COUNTS)
    order = epoch_order(COUNTS, seed=5, epoch=0, shuffle_buffer=1)
    shard_of = np.searchsorted(starts, order, side="right") - 1
    assert (np.diff(shard_of) != 0).sum() == len(COUNTS) - 1  # each shard one contiguous run


def test_weighted_draws_stay_in_their_windows_and_follow_the_weights():
    weights = np.ones(52)
    weights[np.arange(52) % 2 == 1] = 0.0  # odd samples never drawn
    order = epoch_order(COUNTS, seed=1, epoch=0, shuffle_buffer=12, weights=weights)
    assert len(order) == 52 and np.all(order % 2 == 0)


def test_the_samplers_use_the_datasets_own_order():
    data = _Shards()
    sampler = ResumableBatchSampler(data, 4, shuffle=True, seed=2)
    sampler.set_epoch(1)
    assert np.array_equal(sampler.epoch_order(), data.epoch_order(2, 1))
    weighted = WeightedBatchSampler(data, 4, np.ones(52), seed=2)
    weighted.set_epoch(1)
    assert np.array_equal(weighted.epoch_order(), data.epoch_order(2, 1, weights=np.full(52, 1 / 52)))


def _global_batches(ranks: int, batch: int, data, seed=7, epoch=3):
    samplers = [ResumableBatchSampler(data, batch, shuffle=True, seed=seed, num_replicas=ranks, rank=r,
                                      drop_last=True) for r in range(ranks)]
    for s in samplers:
        s.set_epoch(epoch)
    per_rank = [list(s) for s in samplers]
    return [sorted(k.index for r in range(ranks) for k in per_rank[r][step]) for step in range(len(per_rank[0]))]


@pytest.mark.parametrize("ranks", [2, 4])
def test_the_same_seed_gives_the_same_global_batches_on_one_two_or_four_ranks(ranks):
    data = _Shards()
    assert _global_batches(ranks, 12 // ranks, data) == _global_batches(1, 12, data)


@pytest.mark.parametrize(("before", "after"), [(2, 4), (4, 2), (2, 1), (1, 3)])
def test_continued_on_another_number_of_ranks_every_remaining_sample_is_seen_exactly_once(before, after):
    data = _Shards()
    old = [ResumableBatchSampler(data, 3, shuffle=True, seed=1, num_replicas=before, rank=r) for r in range(before)]
    seen = []
    for s in old:
        s.set_epoch(2)
        for batch_number, keys in enumerate(s):
            if batch_number == 2:
                break
            seen += [k.index for k in keys]
            s.position = batch_number + 1  # what the loader does as it hands a batch on
    state = old[0].state_dict()
    assert state["consumed"] == 2 * 3 * before
    new = [ResumableBatchSampler(data, 3, shuffle=True, seed=0, num_replicas=after, rank=r) for r in range(after)]
    rest = []
    for s in new:
        s.load_state_dict(state)
        s.set_epoch(2)
        shares = [k.index for keys in s for k in keys]
        rest += shares[:s.num_real_samples]  # the padding at the end repeats samples, as on every epoch
    assert sorted(seen + rest) == list(range(52))
    order = data.epoch_order(1, 2)
    assert sorted(rest) == sorted(order[2 * 3 * before:].tolist())


def test_a_checkpoint_taken_after_the_change_continues_the_new_dealing():
    data = _Shards()
    first = ResumableBatchSampler(data, 3, shuffle=True, seed=1, num_replicas=2, rank=0)
    first.set_epoch(0)
    first.position = 2
    second = ResumableBatchSampler(data, 3, shuffle=True, seed=1, num_replicas=4, rank=1)
    second.load_state_dict(first.state_dict())
    second.set_epoch(0)
    # The new dealing's batches are numbered on from the two batches done: the Trainer's batch count goes on.
    dealt = list(second)
    assert dealt[0][0].batch == 2 and len(second) == 2 + len(dealt) == 2 + -(-(52 - 12) // 4 // 3)
    expected = dealt[1:]
    second.position = 3
    third = ResumableBatchSampler(data, 3, shuffle=True, seed=1, num_replicas=4, rank=1)
    third.load_state_dict(second.state_dict())
    third.set_epoch(0)
    assert [[k.index for k in b] for b in third] == [[k.index for k in b] for b in expected]
    assert third.state_dict()["consumed"] == 12 + 12


def test_repeats_still_refuse_another_number_of_ranks_mid_epoch():
    from paddletrain.errors import UserError

    data = _Shards()
    old = ResumableBatchSampler(data, 3, shuffle=True, num_replicas=2, num_repeats=2)
    old.position = 1
    with pytest.raises(UserError, match="num_replicas was 2, now 4"):
        ResumableBatchSampler(data, 3, shuffle=True, num_replicas=4, num_repeats=2).load_state_dict(old.state_dict())


def test_an_epoch_is_not_continued_under_another_order():
    from paddletrain.errors import UserError

    old = ResumableBatchSampler(_Shards(buffer=12), 3, shuffle=True)
    old.position = 2
    assert old.state_dict()["sampling"] == "random:buffer=12"
    with pytest.raises(UserError, match="sampling was 'random:buffer=12', now random:buffer=6"):
        ResumableBatchSampler(_Shards(buffer=6), 3, shuffle=True).load_state_dict(old.state_dict())
