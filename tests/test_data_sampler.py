"""ResumableBatchSampler: order as a pure function of (seed, epoch), sharding, padding, skip and resume; the
class-balanced WeightedBatchSampler: class frequencies, determinism, resume and sharding."""
from __future__ import annotations

import itertools

import numpy as np
import pytest

from paddletrain.data.loading.loaders import CheckedDataLoader, SeededDataset
from paddletrain.data.sampling.sampler import ResumableBatchSampler, SampleKey, WeightedBatchSampler


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


# ---------------------------------------------------------------------------------------------- class-balanced
# 100:1 between the largest and the smallest class.
COUNTS = np.array([1000, 100, 10])
TARGETS = np.repeat(np.arange(3), COUNTS)


def _balanced(batch_size=37, **kwargs):
    from paddletrain.data.sampling.balance import class_balanced_weights

    return WeightedBatchSampler(TARGETS, batch_size, class_balanced_weights(TARGETS), **kwargs)


def test_class_balanced_draws_every_class_equally_often_within_a_statistical_bound():
    sampler = _balanced(seed=11)
    drawn = []
    for epoch in range(10):
        sampler.set_epoch(epoch)
        indices = _flat(sampler)
        assert len(indices) == len(TARGETS)  # an epoch keeps the split's length
        drawn += indices
    fractions = np.bincount(TARGETS[drawn], minlength=3) / len(drawn)
    # Each class is a binomial share of 1/3: six standard deviations (~0.027 here) fail once in ~10^9 seeds.
    bound = 6 * np.sqrt((1 / 3) * (2 / 3) / len(drawn))
    np.testing.assert_allclose(fractions, 1 / 3, atol=bound)
    # With replacement: the 10 rare samples come back about 370 times each, the 1000 common ones ~3.7 times.
    assert set(np.flatnonzero(TARGETS == 2)) <= set(drawn)
    assert np.bincount(drawn)[TARGETS == 2].min() > 1


def test_class_balanced_draw_is_a_function_of_seed_and_epoch():
    a, b = _balanced(seed=3), _balanced(seed=3)
    a.set_epoch(2)
    b.set_epoch(2)
    assert _order(a) == _order(b)
    b.set_epoch(3)
    assert _order(a) != _order(b)
    assert _order(_balanced(seed=4)) != _order(_balanced(seed=3))


def test_class_balanced_sampler_resumes_mid_epoch_like_an_uninterrupted_run():
    uninterrupted = _balanced(seed=6, num_replicas=2, rank=1)
    uninterrupted.set_epoch(5)
    full = _order(uninterrupted)
    interrupted = _balanced(seed=6, num_replicas=2, rank=1)
    interrupted.set_epoch(5)
    before = list(itertools.islice(iter(interrupted), 4))
    interrupted.position = 4  # the loader records the batches it delivered
    resumed = _balanced(seed=0, num_replicas=2, rank=1)
    resumed.load_state_dict(interrupted.state_dict())
    resumed.set_epoch(5)
    assert [[k.index for k in b] for b in before] + _order(resumed) == full


def test_two_ranks_take_disjoint_shares_that_together_are_the_draw():
    world = 2
    samplers = [_balanced(batch_size=8, seed=1, num_replicas=world, rank=r) for r in range(world)]
    draw = samplers[0].epoch_order()
    assert all((s.epoch_order() == draw).all() for s in samplers)  # every rank agrees on the epoch's draw
    shards = [_flat(s) for s in samplers]
    assert len(shards[0]) == len(shards[1]) == len(TARGETS) // world
    # Disjoint positions of the one draw: interleaving the shards gives it back, entry for entry.
    interleaved = [shards[r][k] for k in range(len(shards[0])) for r in range(world)]
    assert interleaved == draw.tolist()


def test_resuming_mid_epoch_with_another_sampling_is_refused():
    random_state = ResumableBatchSampler(TARGETS, 37, shuffle=True).state_dict()
    random_state["position"] = 2
    with pytest.raises(ValueError, match=r"sampling was 'random', now weighted:"):
        _balanced().load_state_dict(random_state)
    other_counts = WeightedBatchSampler(TARGETS, 37, np.ones(len(TARGETS))).state_dict()
    other_counts["position"] = 2
    with pytest.raises(ValueError, match="sampling was"):
        _balanced().load_state_dict(other_counts)


@pytest.mark.parametrize("weights, match", [(np.ones(3), "3 sample weights for a dataset of 1110"),
                                            (-np.ones(1110), "finite, >= 0"), (np.zeros(1110), "not all 0")])
def test_bad_sample_weights_are_refused(weights, match):
    with pytest.raises(ValueError, match=match):
        WeightedBatchSampler(TARGETS, 4, weights)


def test_build_loader_picks_the_sampler_data_sampler_names():
    from paddletrain.config import DataConfig
    from paddletrain.data.loading.loaders import build_loader
    from paddletrain.errors import ConfigError

    class Labelled:
        targets = TARGETS

        def __len__(self):
            return len(TARGETS)

    loader = build_loader(Labelled(), DataConfig(sampler="class_balanced", batch_size=10), train=True, seed=0)
    assert isinstance(loader.batch_sampler, WeightedBatchSampler)
    np.testing.assert_allclose(loader.batch_sampler.probabilities, _balanced().probabilities)
    for name in (None, "random"):
        sampler = build_loader(Labelled(), DataConfig(sampler=name, batch_size=10), train=True, seed=0).batch_sampler
        assert type(sampler) is ResumableBatchSampler and sampler.shuffle
    evaluation = build_loader(Labelled(), DataConfig(sampler="class_balanced"), train=False, seed=0).batch_sampler
    assert type(evaluation) is ResumableBatchSampler and not evaluation.shuffle  # evaluation sees each sample once
    with pytest.raises(ConfigError, match=r"data\.sampler='uniform' is not allowed"):
        build_loader(Labelled(), DataConfig(sampler="uniform"), train=True, seed=0)


def test_class_counts_skip_unlabeled_images_and_refuse_labels_out_of_range():
    from paddletrain.data.datasets import DatasetError
    from paddletrain.data.formats.unlabeled import UNLABELED
    from paddletrain.data.sampling.balance import class_balanced_weights, class_counts

    targets = np.array([0, 2, 2, UNLABELED, 2])
    np.testing.assert_array_equal(class_counts(targets, 4), [1, 0, 3, 0])
    with pytest.raises(DatasetError, match=r"label 4 is outside \[0, 4\)"):
        class_counts(np.array([0, 4]), 4)
    with pytest.raises(DatasetError, match="needs a label for every training image; 1 have none"):
        class_balanced_weights(targets)
    np.testing.assert_allclose(class_balanced_weights(np.array([1, 1, 0])), [0.5, 0.5, 1.0])


class _OrderedDataset:
    """A dataset that orders its own epochs (as tar shards do, reading locally): a reversed permutation."""

    def __init__(self, n: int) -> None:
        self.n = n

    def __len__(self) -> int:
        return self.n

    def epoch_order(self, seed: int, epoch: int) -> np.ndarray:
        return np.random.default_rng([seed, epoch]).permutation(self.n)[::-1].copy()


@pytest.mark.parametrize("dataset", [list(range(37)), _OrderedDataset(37)], ids=["map-style", "self-ordered"])
@pytest.mark.parametrize(("before", "after"), [(2, 1), (1, 2), (2, 3)])
def test_a_mid_epoch_position_continued_on_another_number_of_ranks_deals_each_remaining_sample_once(
        dataset, before, after):
    """What docs/distributed.md says: the rest of the epoch is dealt to the new ranks; the samples already trained
    on are not seen again and every other one is seen once (label lists are map-style; shards order themselves)."""
    batch = 12 // before  # the global batch of 12 kept: the batch per rank changes with the ranks
    old = [ResumableBatchSampler(dataset, batch, shuffle=True, seed=5, num_replicas=before, rank=r)
           for r in range(before)]
    for sampler in old:
        sampler.set_epoch(1)
    seen_before = []
    for sampler in old:
        batches = iter(sampler)
        for _ in range(2):  # two batches trained on every rank
            seen_before += [key.index for key in next(batches)]
        sampler.position = 2
    state = old[0].state_dict()
    new = [ResumableBatchSampler(dataset, 12 // after, shuffle=True, seed=5, num_replicas=after, rank=r)
           for r in range(after)]
    seen_after = []
    for sampler in new:
        sampler.set_epoch(1)
        sampler.load_state_dict(state)
        seen_after += [key.index for keys in sampler for key in keys]
    assert not set(seen_before) & set(seen_after)
    remaining = len(dataset) - len(set(seen_before))
    # Each remaining sample once; the last batches may pad with repeats to fill every rank, as any epoch does.
    assert set(seen_before) | set(seen_after) == set(range(len(dataset)))
    assert len(seen_after) - remaining < after
