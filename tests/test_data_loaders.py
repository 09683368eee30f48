"""build_loader: determinism across workers and resume, RNG isolation, eval coverage, bad samples never hang."""
from __future__ import annotations

import gc
import logging
import random
import subprocess
import sys
import textwrap
import time

import numpy as np
import paddle
import pytest

from paddletrain.config import DataConfig
from paddletrain.data.datasets import BadSampleError, DatasetError
from paddletrain.data.loading.loaders import (
    BadSample,
    SeededDataset,
    _BatchArrays,
    _global_rngs_restored,
    batch_seeds,
    build_loader,
    collate_checked,
)
from paddletrain.data.sampling.sampler import SampleKey
from paddletrain.data.transforms.presets import build_transform
from paddletrain.errors import ConfigError

pytestmark = pytest.mark.timeout(60)


class TinyDataset:
    """8x8 RGB images whose pixels encode the index; some indices raise like a truncated file would."""

    def __init__(self, n=24, bad=(), num_classes=3, transform=None, labels=None):
        self.n, self.bad, self.transform = n, set(bad), transform
        self.classes = [f"c{i}" for i in range(num_classes)]
        self.labels = labels

    def __len__(self):
        return self.n

    def describe(self, index):
        return f"/data/train/img_{index:03d}.png"

    def __getitem__(self, index):
        if index in self.bad:
            raise OSError("image file is truncated")
        image = np.full((8, 8, 3), index, np.uint8)
        image = self.transform(image) if self.transform else image
        label = self.labels[index] if self.labels is not None else index % len(self.classes)
        return image, np.int64(label)


def _cfg(**kwargs):
    kwargs.setdefault("batch_size", 4)
    kwargs.setdefault("image_size", 8)
    return DataConfig(**kwargs)


def _augmented(cfg, **kwargs):
    """A dataset with random train augmentation (pad-crop, flip, jitter) applied inside the dataset."""
    return TinyDataset(transform=build_transform(cfg, train=True), **kwargs)


def _batches(loader, epoch=0):
    loader.batch_sampler.set_epoch(epoch)
    return [(x.numpy(), y.numpy()) for x, y in loader]


def _assert_same_batches(a, b):
    assert len(a) == len(b)
    for (xa, ya), (xb, yb) in zip(a, b, strict=True):
        np.testing.assert_array_equal(ya, yb)
        np.testing.assert_array_equal(xa, xb)


def test_train_batches_are_identical_with_0_and_2_workers_augmentation_included():
    cfg = _cfg(color_jitter=0.4)
    single = build_loader(_augmented(cfg), cfg, train=True, seed=11)
    cfg2 = _cfg(color_jitter=0.4, num_workers=2)
    multi = build_loader(_augmented(cfg2), cfg2, train=True, seed=11)
    for epoch in (0, 1):
        _assert_same_batches(_batches(single, epoch), _batches(multi, epoch))
    assert not np.array_equal(_batches(single, 0)[0][0], _batches(single, 1)[0][0])


def test_persistent_workers_see_the_new_epoch():
    cfg = _cfg()
    reference = build_loader(_augmented(cfg), cfg, train=True, seed=3)
    cfgp = _cfg(num_workers=2, persistent_workers=True)
    persistent = build_loader(_augmented(cfgp), cfgp, train=True, seed=3)
    for epoch in (0, 1):
        _assert_same_batches(_batches(reference, epoch), _batches(persistent, epoch))


# A process that still holds persistent workers when it ends must end: multiprocessing's exit SIGTERMs and joins
# its daemonic children, and our workers ignore SIGTERM (CI once hung here for an hour after the last test).
EXIT_WITH_LIVE_WORKERS = textwrap.dedent("""
    import numpy as np
    from paddletrain.config import DataConfig
    from paddletrain.data.loading.loaders import build_loader

    class Images:
        classes = ["a", "b"]
        def __len__(self):
            return 16
        def describe(self, index):
            return str(index)
        def __getitem__(self, index):
            return np.full((8, 8, 3), index, np.uint8), np.int64(index % 2)

    cfg = DataConfig(batch_size=4, image_size=8, num_workers=2, persistent_workers={persistent})
    loader = build_loader(Images(), cfg, train=True, seed=0)
    batches = iter(loader)
    next(batches)  # stopped mid-epoch, workers still running, loader and iterator still referenced
    print("ready", flush=True)
""")


@pytest.mark.parametrize("persistent", [True, False])
def test_the_process_ends_while_its_loader_workers_are_still_running(persistent):
    started = time.monotonic()
    done = subprocess.run([sys.executable, "-c", EXIT_WITH_LIVE_WORKERS.format(persistent=persistent)],
                          capture_output=True, text=True, timeout=45)
    assert done.returncode == 0, done.stderr[-2000:]
    assert "ready" in done.stdout
    assert time.monotonic() - started < 40


@pytest.mark.parametrize("num_workers", [0, 2])
def test_resumed_loader_yields_exactly_the_remaining_batches(num_workers):
    cfg = _cfg(num_workers=num_workers)
    first = build_loader(_augmented(cfg), cfg, train=True, seed=5)
    first.batch_sampler.set_epoch(2)
    delivered, state = [], None
    for x, y in first:
        delivered.append((x.numpy(), y.numpy()))
        if len(delivered) == 2:
            # Workers prefetch ahead; the saved position must still count what was delivered.
            state = first.batch_sampler.state_dict()
    assert state["position"] == 2 and state["epoch"] == 2

    resumed = build_loader(_augmented(cfg), cfg, train=True, seed=5)
    resumed.batch_sampler.load_state_dict(state)
    resumed.batch_sampler.set_epoch(2)
    _assert_same_batches([(x.numpy(), y.numpy()) for x, y in resumed], delivered[2:])
    assert resumed.batch_sampler.position == len(resumed)


class SlowDataset(TinyDataset):
    """Draws from the global RNGs while sleeping in between, as a slow decoder plus augmentation would."""

    def __getitem__(self, index):
        image, label = super().__getitem__(index)
        time.sleep(0.002)  # gives any concurrent thread time to draw from the reseeded global RNGs
        image[0, 0, 0] = random.randint(0, 255)
        return image, label


def test_iterating_with_0_workers_leaves_the_callers_random_streams_alone():
    loader = build_loader(SlowDataset(), _cfg(), train=True, seed=1)

    def draws(batches):
        values = []
        for _ in batches:
            for _ in range(5):  # the training step's own randomness, interleaved with loading
                values.append((random.random(), np.random.rand()))
                time.sleep(0.001)
        return values

    random.seed(123)
    np.random.seed(123)
    expected = draws(range(len(loader)))
    random.seed(123)
    np.random.seed(123)
    assert draws(loader) == expected


def test_a_batch_depends_on_seed_epoch_rank_and_batch_number_only():
    cfg = _cfg()

    def batch(data, epoch=1, number=0, rank=0, indices=(3, 7, 1)):
        """Loaded as a loader loads a batch: whole, in order, with the caller's RNGs put back afterwards."""
        with _global_rngs_restored():
            return np.stack([data[SampleKey(i, epoch, number, rank, p)][0] for p, i in enumerate(indices)])

    data = SeededDataset(_augmented(cfg), seed=4)
    np.testing.assert_array_equal(batch(data), batch(data))
    assert not np.array_equal(batch(data), batch(data, epoch=2))
    assert not np.array_equal(batch(data), batch(data, rank=1))  # ranks do not share augmentation streams
    assert not np.array_equal(batch(data), batch(data, number=5))
    assert not np.array_equal(batch(data), batch(SeededDataset(_augmented(cfg), seed=5)))
    # Within a batch the samples draw from one stream, so equal images are augmented differently.
    same = batch(data, indices=(3, 3, 3, 3))
    assert not all(np.array_equal(same[0], other) for other in same[1:])


def test_eval_loader_covers_every_sample_once_in_order():
    n = 10
    cfg = _cfg(eval_batch_size=3, drop_last=True)
    data = TinyDataset(n=n, num_classes=n, labels=list(range(n)))
    loader = build_loader(data, cfg, train=False, seed=0)
    labels = [y for _, y in _batches(loader)]
    assert [len(y) for y in labels] == [3, 3, 3, 1]
    assert np.concatenate(labels).tolist() == list(range(n))
    assert loader.num_real_samples == n


def test_distributed_eval_shards_cover_the_set_and_say_which_samples_are_padding():
    n, world = 7, 3
    data = TinyDataset(n=n, num_classes=n, labels=list(range(n)))
    real = []
    for rank in range(world):
        loader = build_loader(data, _cfg(batch_size=2), train=False, seed=0, num_replicas=world, rank=rank)
        labels = np.concatenate([y for _, y in _batches(loader)]).tolist()
        assert len(labels) == 3  # equal step counts on every rank
        real += labels[:loader.num_real_samples]
    assert sorted(real) == list(range(n))


@pytest.mark.parametrize("num_workers", [0, 2])
def test_fail_policy_raises_in_the_main_process_naming_the_file(num_workers):
    cfg = _cfg(num_workers=num_workers, bad_sample_policy="fail")
    loader = build_loader(TinyDataset(bad={13}), cfg, train=True, seed=0)
    with pytest.raises(BadSampleError) as info:
        _batches(loader)
    message = str(info.value)
    assert "/data/train/img_013.png" in message and "13" in message and "truncated" in message
    assert info.value.index == 13


@pytest.mark.parametrize("num_workers", [0, 2])
def test_skip_policy_drops_logs_and_counts_bad_samples(num_workers, caplog):
    cfg = _cfg(num_workers=num_workers, bad_sample_policy="skip", max_bad_fraction=0.1)
    data = TinyDataset(n=24, bad={5, 17})
    loader = build_loader(data, cfg, train=True, seed=0)
    with caplog.at_level(logging.WARNING, logger="paddletrain.data.loading.loaders"):
        batches = _batches(loader)
    images = np.concatenate([x for x, _ in batches])
    seen = sorted(int(v) for v in images[:, 0, 0, 0])  # untransformed pixels hold the index
    assert seen == sorted(set(range(24)) - {5, 17})
    assert loader.bad_samples == 2 and loader.total_bad_samples == 2
    assert "img_005.png" in caplog.text and "img_017.png" in caplog.text


@pytest.mark.parametrize("num_workers", [0, 2])
def test_a_batch_of_only_bad_samples_is_skipped_without_hanging(num_workers):
    cfg = _cfg(num_workers=num_workers, bad_sample_policy="skip", max_bad_fraction=0.5)
    loader = build_loader(TinyDataset(n=12, bad={4, 5, 6, 7}), cfg, train=False, seed=0)
    batches = _batches(loader)
    assert len(batches) == 2
    assert loader.batch_sampler.position == 3


@pytest.mark.parametrize("num_workers", [0, 2])
def test_too_many_bad_samples_abort_the_run(num_workers):
    cfg = _cfg(num_workers=num_workers, bad_sample_policy="skip", max_bad_fraction=0.1)
    loader = build_loader(TinyDataset(n=20, bad={1, 9, 15}), cfg, train=False, seed=0)
    with pytest.raises(BadSampleError, match=r"3 unreadable samples .* data.max_bad_fraction=0.1 allows \(2\)"):
        _batches(loader)


def test_label_outside_the_classes_names_label_class_count_and_file():
    data = TinyDataset(n=8, num_classes=3, labels=[0, 1, 2, 0, 7, 1, 2, 0])
    loader = build_loader(data, _cfg(bad_sample_policy="skip"), train=False, seed=0)
    with pytest.raises(DatasetError) as info:
        _batches(loader)
    message = str(info.value)
    assert "label 7" in message and "[0, 3)" in message and "img_004.png" in message


def test_samples_of_different_shapes_give_a_clear_error():
    class Ragged(TinyDataset):
        def __getitem__(self, index):
            return np.zeros((3, 8 + index % 2, 8), np.float32), np.int64(0)

    with pytest.raises(DatasetError, match="different shapes"):
        _batches(build_loader(Ragged(n=4), _cfg(), train=False, seed=0))


@pytest.mark.parametrize("kwargs,key", [
    (dict(bad_sample_policy="ignore"), "data.bad_sample_policy='ignore'"),
    (dict(max_bad_fraction=1.5), "data.max_bad_fraction=1.5"),
    (dict(eval_batch_size=-1), "data.eval_batch_size=-1"),
])
def test_bad_loader_config_names_the_key(kwargs, key):
    with pytest.raises(ConfigError) as info:
        build_loader(TinyDataset(), _cfg(**kwargs), train=False, seed=0)
    assert key in str(info.value)


def test_loader_is_a_paddle_dataloader_with_int64_labels_and_full_length():
    loader = build_loader(TinyDataset(n=10), _cfg(), train=True, seed=0)
    assert isinstance(loader, paddle.io.DataLoader)
    assert len(loader) == 2  # drop_last for training
    x, y = next(iter(loader))
    assert x.dtype == paddle.uint8 and y.dtype == paddle.int64


def test_batch_seeds_are_deterministic_distinct_and_fit_both_rngs():
    seeds = {batch_seeds(seed, epoch, rank, batch)
             for seed in range(3) for epoch in range(4) for rank in range(4) for batch in range(50)}
    assert len(seeds) == 3 * 4 * 4 * 50  # no two (seed, epoch, rank, batch) share their seeds
    assert batch_seeds(7, 2, 1, 11) == batch_seeds(7, 2, 1, 11)
    assert all(0 <= a < 2**32 and 0 <= b < 2**32 for a, b in seeds)  # numpy's legacy seed takes < 2**32


def test_batch_seeds_are_numpys_spawn_tree_of_the_seed():
    """The documented stream: child ``batch`` of child ``rank`` of child ``epoch`` of ``SeedSequence(seed)``."""
    child = np.random.SeedSequence(7).spawn(3)[2].spawn(2)[1].spawn(12)[11]
    assert batch_seeds(7, 2, 1, 11) == tuple(int(x) for x in child.generate_state(2))


def test_a_negative_seed_is_refused_with_the_key():
    with pytest.raises(ConfigError, match="seed=-1"):
        SeededDataset(TinyDataset(), seed=-1)


def test_collate_reads_a_generator_once_and_keeps_bad_samples_out_of_the_arrays():
    def items():
        yield np.full((2, 2), 1, np.float32), 0, 10, 5
        yield BadSample(11, 5, "img_011.png", "truncated")
        yield np.full((2, 2), 3, np.float32), 2, 12, 5

    images, labels, indices, batch, problems = collate_checked(items(), size=3)
    assert images.shape == (2, 2, 2) and images[1, 0, 0] == 3
    assert labels.tolist() == [0, 2] and labels.dtype == np.int64
    assert indices.tolist() == [10, 11, 12] and batch == 5
    assert problems == [[11, "img_011.png", "truncated", "read"]]
    images, labels, indices, _, problems = collate_checked([BadSample(3, 0, "a", "x"), BadSample(4, 0, "b", "y")])
    assert images is None and labels is None and indices.tolist() == [3, 4] and len(problems) == 2


def test_batches_from_the_main_thread_do_not_share_memory():
    # With 0 workers the image tensor wraps the freshly stacked array without copying; no later batch may
    # write into an earlier one.
    loader = build_loader(TinyDataset(n=12), _cfg(), train=False, seed=0)
    kept = [x for x, _ in loader]
    first = [x.numpy().copy() for x in kept]
    for _batch in loader:  # a second pass allocates again
        pass
    del _batch
    gc.collect()  # the arrays behind the kept tensors must live as long as the tensors (DLPack capsule)
    for x, expected in zip(kept, first, strict=True):
        np.testing.assert_array_equal(x.numpy(), expected)
    assert [int(x[0, 0, 0, 0]) for x in kept] == [0, 4, 8]


def test_a_batch_array_is_reused_only_once_the_tensor_lent_from_it_is_gone():
    arrays = _BatchArrays()
    first = arrays.empty((4, 3, 8, 8), np.float32)
    view = first[:3]
    arrays.lend(view)
    tensor = paddle.from_dlpack(view)  # as the loader does on the CPU: the capsule holds the view
    del view
    sliced = tensor[1:]
    del tensor
    gc.collect()
    assert arrays.empty((4, 3, 8, 8), np.float32) is not first  # a slice still shares its memory
    del sliced
    gc.collect()
    assert arrays.empty((4, 3, 9, 9), np.float32) is not first  # another shape gets its own array
    assert arrays.empty((4, 3, 8, 8), np.float32) is first


def test_a_consumer_that_drops_its_batches_gets_them_in_reused_arrays_with_the_same_values(monkeypatch):
    cfg = _cfg(train_transform="small")
    loader = build_loader(_augmented(cfg, n=24), cfg, train=True, seed=3)
    expected = _batches(loader, epoch=1)
    handed = []
    empty = _BatchArrays.empty
    monkeypatch.setattr(_BatchArrays, "empty", lambda self, *args: handed.append(empty(self, *args)) or handed[-1])
    loader.batch_sampler.set_epoch(1)
    for (x, y), (ex, ey) in zip(loader, expected, strict=True):
        np.testing.assert_array_equal(x.numpy(), ex)
        np.testing.assert_array_equal(y.numpy(), ey)
    assert len({id(a) for a in handed}) < len(handed) == len(expected)  # 6 batches from fewer arrays


def test_augment_list_batches_are_identical_with_0_and_2_workers_and_repeats_reach_the_sampler():
    augment = [{"name": "rand_augment", "magnitude": 9}, {"name": "random_erasing", "probability": 0.5,
                                                          "mode": "pixel"}]
    cfg = _cfg(augment=augment, num_repeats=2)
    single = build_loader(_augmented(cfg), cfg, train=True, seed=5)
    cfg2 = _cfg(augment=augment, num_repeats=2, num_workers=2)
    multi = build_loader(_augmented(cfg2), cfg2, train=True, seed=5)
    assert single.batch_sampler.num_repeats == 2
    assert build_loader(TinyDataset(), cfg, train=False, seed=5).batch_sampler.num_repeats == 1  # eval: once
    for epoch in (0, 1):
        _assert_same_batches(_batches(single, epoch), _batches(multi, epoch))
