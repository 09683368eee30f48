"""ResumableBatchSampler: order as a pure function of (seed, epoch), sharding, padding, skip and resume."""
from __future__ import annotations

import numpy as np
import pytest

from paddletrain.data.loaders import CheckedDataLoader, SeededDataset
from paddletrain.data.sampler import ResumableBatchSampler, SampleKey


def _order(sampler):
    return [[key.index for key in batch] for batch in sampler]


def _sampler(n=23, batch_size=4, **kwargs):
    kwargs.setdefault("shuffle", True)
    return ResumableBatchSampler(range(n), batch_size, **kwargs)


def test_same_seed_and_epoch_give_the_same_order_in_a_fresh_sampler():
    a, b = _sampler(seed=7), _sampler(seed=7)
    a.set_epoch(3)
    b.set_epoch(3)
    assert _order(a) == _order(b)
    assert _order(a) == _order(a)  # iterating again does not advance anything


def test_epoch_and_seed_each_change_the_order():
    base = _sampler(seed=7)
    other_seed = _sampler(seed=8)
    first = _order(base)
    base.set_epoch(1)
    assert _order(base) != first
    assert _order(other_seed) != first


def test_one_epoch_is_a_permutation_with_a_short_last_batch():
    batches = _order(_sampler(n=23, batch_size=4))
    assert [len(b) for b in batches] == [4, 4, 4, 4, 4, 3]
    assert sorted(i for b in batches for i in b) == list(range(23))


def test_without_shuffle_the_order_is_the_dataset_order():
    assert _order(_sampler(n=10, batch_size=3, shuffle=False)) == [[0, 1, 2], [3, 4, 5], [6, 7, 8], [9]]


def test_drop_last_drops_only_the_incomplete_batch():
    sampler = _sampler(n=23, batch_size=4, drop_last=True)
    batches = _order(sampler)
    assert len(sampler) == len(batches) == 5
    assert all(len(b) == 4 for b in batches)


def test_keys_carry_epoch_batch_rank_and_position():
    sampler = _sampler(n=16, batch_size=4, num_replicas=2, rank=1)
    sampler.set_epoch(2)
    batches = list(sampler)
    assert all(isinstance(k, SampleKey) for b in batches for k in b)
    assert [{(k.epoch, k.batch, k.rank) for k in b} for b in batches] == [{(2, 0, 1)}, {(2, 1, 1)}]
    assert [[k.position for k in b] for b in batches] == [[0, 1, 2, 3]] * 2


@pytest.mark.parametrize("n", [10, 11, 3])
def test_ranks_split_the_epoch_with_padding_at_the_tail(n):
    world = 4
    shards = [[k.index for b in _sampler(n=n, batch_size=2, seed=1, num_replicas=world, rank=r) for k in b]
              for r in range(world)]
    samplers = [_sampler(n=n, batch_size=2, seed=1, num_replicas=world, rank=r) for r in range(world)]
    assert len({len(s) for s in shards}) == 1  # equal steps on every rank
    real = [s[:sampler.num_real_samples] for s, sampler in zip(shards, samplers, strict=True)]
    assert sum(sampler.num_real_samples for sampler in samplers) == n
    assert sorted(i for shard in real for i in shard) == list(range(n))
    # Every rank agrees on the epoch's global order: interleaving the shards rebuilds it.
    interleaved = [shards[r][k] for k in range(len(shards[0])) for r in range(world)]
    assert sorted(interleaved[:n]) == list(range(n))


def test_rank_must_be_below_world_size():
    with pytest.raises(ValueError, match="rank=2"):
        _sampler(num_replicas=2, rank=2)


def test_skip_batches_yields_exactly_the_tail_then_only_once():
    sampler = _sampler(seed=5)
    sampler.set_epoch(4)
    full = _order(sampler)
    sampler.skip_batches(2)
    assert _order(sampler) == full[2:]
    assert _order(sampler) == full  # the skip applied to one iteration only


def test_state_dict_round_trip_resumes_the_same_epoch_mid_way():
    trained = _sampler(seed=5)
    trained.set_epoch(3)
    full = _order(trained)
    trained.position = 4  # the loader records batches delivered
    state = trained.state_dict()
    assert (state["seed"], state["epoch"], state["position"]) == (5, 3, 4)

    resumed = _sampler(seed=0)
    resumed.load_state_dict(state)
    resumed.set_epoch(3)  # the trainer's usual call at epoch start must keep the pending resume
    assert resumed.state_dict() == state
    assert _order(resumed) == full[4:]
    resumed.set_epoch(4)
    assert resumed.position == 0 and len(_order(resumed)) == len(full)


def test_moving_to_another_epoch_cancels_a_pending_skip():
    sampler = _sampler(seed=5)
    sampler.skip_batches(3)
    sampler.set_epoch(1)
    assert len(_order(sampler)) == len(sampler)


def test_resuming_mid_epoch_with_another_batch_size_is_refused():
    state = _sampler(batch_size=4).state_dict()
    state["position"] = 2
    with pytest.raises(ValueError, match="batch_size was 4, now 5"):
        _sampler(batch_size=5).load_state_dict(state)
    state["position"] = 0  # at an epoch boundary the new batch size is harmless
    _sampler(batch_size=5).load_state_dict(state)


def test_negative_seed_is_rejected_with_its_value():
    with pytest.raises(ValueError, match="-1"):
        _sampler(seed=-1)


# ---------------------------------------------------------------------------------------------- repeated augmentation
def _repeat(n=23, batch_size=4, num_repeats=3, **kwargs):
    return _sampler(n=n, batch_size=batch_size, num_repeats=num_repeats, **kwargs)


def _flat(sampler):
    return [key.index for batch in sampler for key in batch]


def test_repeats_come_k_in_a_row_within_one_batch_on_a_single_rank():
    sampler = _repeat(n=20, batch_size=6, num_repeats=3, seed=4)
    indices = _flat(sampler)
    assert len(indices) == 20 and len(sampler) == 4  # the epoch keeps the dataset's length
    assert [indices[i:i + 3] for i in range(0, 18, 3)] == [[i] * 3 for i in indices[0:18:3]]
    assert len(set(indices[0:18:3])) == 6  # 6 distinct images, 3 copies each, then the 7th begins
    first_batch = [key.index for key in next(iter(sampler))]
    assert first_batch == [first_batch[0]] * 3 + [first_batch[3]] * 3


@pytest.mark.parametrize("n, world, k", [(23, 4, 3), (10, 2, 3), (16, 8, 2), (7, 3, 4)])
def test_each_image_k_times_in_disjoint_rank_shares_before_truncation(n, world, k):
    samplers = [_repeat(n=n, batch_size=2, num_repeats=k, seed=9, num_replicas=world, rank=r) for r in range(world)]
    stream = samplers[0].repeated_stream()
    assert all((s.repeated_stream() == stream).all() for s in samplers)  # every rank agrees on the stream
    assert sorted(stream[:k * n].tolist()) == sorted(list(range(n)) * k)  # each image k times, then padding
    assert len(stream) % world == 0 and len(stream) - k * n < world
    # The ranks' full shares are disjoint slices that together are the whole stream...
    shares = [stream[r::world].tolist() for r in range(world)]
    assert sorted(i for share in shares for i in share) == sorted(stream.tolist())
    # ...and each rank yields the head of its share, the dataset's size / world size (timm's truncation).
    for sampler, share in zip(samplers, shares, strict=True):
        yielded = _flat(sampler)
        assert len(yielded) == sampler.num_samples == -(-n // world) == sampler.num_real_samples
        assert yielded == share[:len(yielded)]


def test_with_at_least_k_ranks_the_copies_of_an_image_meet_on_different_ranks_in_the_same_step():
    world, k = 4, 3
    per_rank = [_flat(_repeat(n=40, batch_size=5, num_repeats=k, seed=1, num_replicas=world, rank=r))
                for r in range(world)]
    where = {}
    for rank, indices in enumerate(per_rank):
        assert len(set(indices)) == len(indices)  # no rank sees an image twice in the epoch
        for position, index in enumerate(indices):
            where.setdefault(index, []).append((rank, position))
    full = [places for places in where.values() if len(places) == k]
    assert len(full) >= 40 // k - 1
    for places in full:
        assert len({rank for rank, _ in places}) == k
        assert max(p for _, p in places) - min(p for _, p in places) <= 1  # the same or the next step


def test_repeated_order_is_a_function_of_seed_and_epoch():
    a, b = _repeat(seed=3), _repeat(seed=3)
    a.set_epoch(2)
    b.set_epoch(2)
    assert _order(a) == _order(b)
    b.set_epoch(3)
    assert _order(a) != _order(b)
    assert _order(_repeat(seed=4)) != _order(_repeat(seed=3))


def test_repeated_sampler_resumes_mid_epoch_with_the_remaining_batches():
    trained = _repeat(n=30, batch_size=4, seed=6, num_replicas=2, rank=1)
    trained.set_epoch(5)
    full = _order(trained)
    trained.position = 3
    state = trained.state_dict()
    assert state["num_repeats"] == 3
    resumed = _repeat(n=30, batch_size=4, seed=0, num_replicas=2, rank=1)
    resumed.load_state_dict(state)
    resumed.set_epoch(5)
    assert _order(resumed) == full[3:]


def test_changing_the_repeats_mid_epoch_is_refused():
    state = _repeat(num_repeats=3).state_dict()
    state["position"] = 1
    with pytest.raises(ValueError, match="num_repeats was 3, now 2"):
        _repeat(num_repeats=2).load_state_dict(state)
    legacy = _sampler().state_dict()  # written before num_repeats existed
    del legacy["num_repeats"]
    legacy["position"] = 2
    _sampler().load_state_dict(legacy)


@pytest.mark.parametrize("bad", [0, -1, 1.5, True])
def test_num_repeats_must_be_a_positive_integer(bad):
    with pytest.raises(ValueError, match="num_repeats"):
        _repeat(num_repeats=bad)


def test_copies_in_one_batch_get_different_augmentations():

    class Blank:
        def __len__(self):
            return 8

        def __getitem__(self, index):
            return np.zeros((1, 2, 2), "float32"), 0

    def jitter(image):
        return image + np.random.rand(*image.shape).astype("float32")

    sampler = _repeat(n=8, batch_size=4, num_repeats=2, seed=2)
    loader = CheckedDataLoader(SeededDataset(Blank(), jitter, seed=2), sampler)
    images, _labels = next(iter(loader))
    keys = next(iter(sampler))
    assert keys[0].index == keys[1].index and keys[2].index == keys[3].index
    pixels = images.numpy().reshape(4, -1)
    assert not np.allclose(pixels[0], pixels[1]) and not np.allclose(pixels[2], pixels[3])
