"""DataLoaders with deterministic augmentation and a bad-sample policy that never hangs.

Why not a plain ``paddle.io.DataLoader``: on paddle 3.3 an exception in ``dataset.__getitem__`` hangs the
loop forever with ``num_workers=0`` and surfaces as an anonymous "Blocking queue is killed" with workers.
So :class:`SeededDataset` turns every per-sample failure into a :class:`BadSample` marker, the collate
function keeps the markers out of the stacked arrays, and :class:`CheckedDataLoader` acts on them in the
main process: raise :class:`BadSampleError` naming the file (policy "fail") or drop, log and count the
sample (policy "skip"), aborting once an epoch's skipped samples exceed ``max_bad_fraction``.

With ``num_workers=0`` batches are loaded in the calling thread: paddle's loader thread would run the
transforms concurrently with the training step, and the per-sample reseeding of the global RNGs would then
leak into the trainer's random stream.

Worker processes ignore SIGTERM/SIGINT (the main process decides when they stop), die with the process that
started them (``kill -9`` of the trainer leaves no worker behind), and are shut down as soon as an iteration
ends, also when the trainer stops reading before the loader is exhausted (paddle would keep those workers alive
until the process exits: one set per epoch). Workers still running when the interpreter exits (persistent ones)
are stopped by their stop message before ``multiprocessing`` joins them: it would otherwise SIGTERM them, which
they ignore, and wait forever.
"""
from __future__ import annotations

import gc
import logging
import multiprocessing.util
import os
import random
import threading
import weakref
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

import numpy as np
import paddle

from paddletrain.data.datasets import BadSampleError, DatasetError
from paddletrain.data.errors import SourceUnavailableError
from paddletrain.data.formats.unlabeled import UNLABELED
from paddletrain.data.sampling.balance import class_balanced_weights, dataset_targets
from paddletrain.data.sampling.sampler import (
    CurrentSample,
    ResumableBatchSampler,
    SampleKey,
    WeightedBatchSampler,
    set_current_sample,
)
from paddletrain.errors import ConfigError
from paddletrain.job.processes import (
    call_with_worker_setup,
    lost_worker,
    stop_signals_held,
    take_lost_worker,
    waiting_in_loader,
    watch_loader_workers,
)

log = logging.getLogger(__name__)

BAD_SAMPLE_POLICIES = ("fail", "skip")


@dataclass
class BadSample:
    """Marker returned instead of ``(image, label, index, batch)`` for a sample that failed."""

    index: int
    batch: int
    description: str
    error: str
    # "read": unreadable/transform failed (policy decides); "label": label out of range, "source": the data's
    # source cannot be read (both always fatal).
    kind: str = "read"


def batch_seeds(seed: int, epoch: int, rank: int, batch: int) -> tuple[int, int]:
    """Two 32-bit seeds (python ``random``, ``numpy.random``) for one batch of one rank and epoch.

    The state of numpy's ``SeedSequence(seed)`` descendant at spawn key ``(epoch, rank, batch)``: what
    ``.spawn()`` would hand the batch-th child of the rank-th child of the epoch-th child. ~15 us, once a batch.
    """
    py_seed, np_seed = np.random.SeedSequence(seed, spawn_key=(epoch, rank, batch)).generate_state(2)
    return int(py_seed), int(np_seed)


# Set while a whole batch is loaded in the main process: the RNGs are then saved and restored once per batch
# instead of once per sample (~0.16 ms each).
_batch_scope = threading.local()


@contextmanager
def _global_rngs_restored() -> Iterator[None]:
    saved = (random.getstate(), np.random.get_state())
    _batch_scope.active = True
    try:
        yield
    finally:
        _batch_scope.active = False
        random.setstate(saved[0])
        np.random.set_state(saved[1])


class SeededDataset(paddle.io.Dataset):
    """Wrap a dataset so each batch's randomness is a pure function of (seed, epoch, rank, batch).

    ``dataset[SampleKey(index, epoch, batch, rank, position)]`` loads the sample and applies ``transform``.
    The first sample of a batch (``position == 0``) seeds python ``random`` and ``numpy.random`` from
    ``(seed, epoch, rank, batch)``; the batch's other samples continue those streams. A batch is always
    loaded whole and in order, by one worker or by the loader's own thread, so every sample's augmentation
    depends only on the sampler's (seed, epoch, rank, batch, position): not on the worker count, prefetching
    or resume position. Seeding once per batch rather than per sample saves ~7% of a small image's load time.
    In the main process both global RNG states are restored afterwards, leaving the caller's random stream
    untouched. Returns ``(image, label, index, batch)``, or a :class:`BadSample` on any failure.
    """

    def __init__(self, dataset: Any, transform: Callable[[Any], Any] | None = None, seed: int = 0,
                 num_classes: int | None = None) -> None:
        super().__init__()
        if int(seed) < 0:
            raise ConfigError(f"seed={seed} must be 0 or more (it seeds numpy's SeedSequence)")
        self.dataset = dataset
        self.transform = transform
        self.seed = int(seed)
        classes = getattr(dataset, "classes", None)
        self.num_classes = num_classes if num_classes is not None else (len(classes) if classes else None)
        # Multi-hot float32 rows instead of class indices (checked when the multi-label list was read).
        self.multilabel = bool(getattr(dataset, "multilabel", False))

    def __len__(self) -> int:
        return len(self.dataset)

    def describe(self, index: int) -> str:
        """The wrapped dataset's name for the sample, or a generic one if it cannot describe samples."""
        try:
            return str(self.dataset.describe(index))
        except Exception:  # describing must never hide the original problem
            return f"{type(self.dataset).__name__}[{index}]"

    def __getitem__(self, key: SampleKey | tuple | int) -> tuple | BadSample:
        if not isinstance(key, SampleKey):
            key = SampleKey(*key) if isinstance(key, tuple) else SampleKey(int(key), 0, 0)
        # In the main process the caller's RNG states are restored afterwards (once per batch when the loader
        # loads a whole batch); a worker process owns its RNGs and skips the restore. Written out rather than
        # as a context manager: this runs once per sample.
        restore = paddle.io.get_worker_info() is None and not getattr(_batch_scope, "active", False)
        saved = (random.getstate(), np.random.get_state()) if restore else None
        if key.position == 0 or saved is not None:  # a lone sample outside a batch seeds itself
            py_seed, np_seed = batch_seeds(self.seed, key.epoch, key.rank, key.batch)
            random.seed(py_seed)
            np.random.seed(np_seed)
        try:
            image, label = self.dataset[key.index]
            if self.transform is not None:
                set_current_sample(CurrentSample(self.seed, key.index, key.epoch))
                try:
                    image = self.transform(image)
                finally:
                    set_current_sample(None)
            if not self.multilabel:
                label = int(label)
        except Exception as exc:  # any failure becomes a marker: raising here would hang paddle's loader
            # A dataset's own BadSampleError already says what went wrong; other errors need their type.
            error = str(exc) if isinstance(exc, (BadSampleError, SourceUnavailableError)) \
                else f"{type(exc).__name__}: {exc}"
            # A source that cannot be read at all (a server away) stops the run whatever the policy.
            kind = "source" if isinstance(exc, SourceUnavailableError) else "read"
            return BadSample(key.index, key.batch, self.describe(key.index), error, kind)
        finally:
            if saved is not None:
                random.setstate(saved[0])
                np.random.set_state(saved[1])
        # UNLABELED marks an extra image for label-free distillation (paddletrain.data.formats.unlabeled).
        if self.num_classes is not None and not self.multilabel and not 0 <= label < self.num_classes \
                and label != UNLABELED:
            return BadSample(key.index, key.batch, self.describe(key.index),
                             f"label {label} is outside [0, {self.num_classes}) for a dataset of "
                             f"{self.num_classes} classes", kind="label")
        return image, label, key.index, key.batch


def collate_checked(items: Iterable[tuple | BadSample], size: int | None = None,
                    empty: Callable[[tuple, np.dtype], np.ndarray] = np.empty) -> list:
    """Stack the good samples; pass bad ones on as plain data the main process can report.

    Returns ``[images | None, labels | None, indices, batch, problems]``: ``indices`` covers every sample
    of the batch (never empty, so paddle's queue never sees an empty batch), ``problems`` is a list of
    ``[index, description, error, kind]``. ``None`` replaces the arrays when no sample survived.

    ``items`` is read once, so it may be a generator: each image is copied into the batch array as it
    arrives, while it is still in the CPU cache, and its own memory is reused by the next sample. ``size``
    (the batch length) is needed when ``items`` has no ``len()``. ``empty(shape, dtype)`` allocates the image
    batch (``np.empty``, or a :class:`_BatchArrays` handing back a batch array nobody uses any more).
    """
    size = len(items) if size is None else size  # type: ignore[arg-type]
    problems: list[list] = []
    indices: list[int] = []
    labels: list = []
    images: np.ndarray | None = None
    shapes: set = set()
    batch = 0
    for item in items:
        if isinstance(item, BadSample):
            problems.append([item.index, item.description, item.error, item.kind])
            indices.append(item.index)
            batch = item.batch
            continue
        image, label, index, batch = item
        image = np.asarray(image)
        indices.append(index)
        shapes.add(image.shape)
        if len(shapes) > 1:
            continue  # reported below; the remaining samples only add their shapes to the message
        if images is None:
            images = empty((size, *image.shape), image.dtype)
        images[len(labels)] = image
        labels.append(label)
    index_array = np.array(indices, np.int64)
    if len(shapes) > 1:
        problems.append([-1, f"batch {batch}", f"cannot stack samples of shapes {sorted(map(str, shapes))}",
                         "collate"])
        return [None, None, index_array, batch, problems]
    if images is None:
        return [None, None, index_array, batch, problems]
    # Class indices, or multi-hot rows (a multi-label dataset's float32 arrays).
    stacked = np.stack(labels) if isinstance(labels[0], np.ndarray) else np.array(labels, np.int64)
    return [images[:len(labels)], stacked, index_array, batch, problems]


class CheckedDataLoader(paddle.io.DataLoader):
    """A ``paddle.io.DataLoader`` over a :class:`SeededDataset` that yields ``[images, labels]`` tensors.

    Applies the bad-sample policy in the main process, keeps ``batch_sampler.position`` equal to the
    number of batches delivered, and exposes ``num_real_samples`` (this rank's samples that are not
    distributed padding) and the counters ``bad_samples`` (this epoch) / ``total_bad_samples``.
    """

    def __init__(self, dataset: SeededDataset, batch_sampler: ResumableBatchSampler, *, num_workers: int = 0,
                 bad_sample_policy: str = "fail", max_bad_fraction: float = 0.0, **kwargs: Any) -> None:
        self.user_worker_init_fn = kwargs.pop("worker_init_fn", None)
        super().__init__(dataset, batch_sampler=batch_sampler, num_workers=num_workers,
                         collate_fn=collate_checked, **kwargs)
        self.bad_sample_policy = bad_sample_policy
        self.max_bad_fraction = max_bad_fraction
        self.bad_samples = 0
        self.total_bad_samples = 0

    @property
    def num_real_samples(self) -> int:
        """This rank's samples that are not padding; padding repeats come last in its order."""
        return self.batch_sampler.num_real_samples

    def __iter__(self) -> Iterator[list[paddle.Tensor]]:
        self.bad_samples = 0
        workers = self._start_workers() if self.num_workers else None
        raw = self._load_in_this_thread() if workers is None else _naming_lost_workers(workers)
        try:
            for images, labels, _indices, batch, problems in raw:
                if problems:  # a batch that stops the run is not delivered: a save continues before it
                    self._handle_problems(problems)
                self.batch_sampler.position = int(batch) + 1
                if images is not None:
                    yield [images, labels]
        finally:
            if workers is not None and not self._persistent_workers:
                _shut_down_workers(workers)

    def _start_workers(self) -> Iterator[list]:
        # Paddle reads worker_init_fn when it starts the workers; the parent to die with is this process.
        self.worker_init_fn = call_with_worker_setup(self.user_worker_init_fn, os.getpid())
        with stop_signals_held(), _gc_frozen_for_fork(), waiting_in_loader():  # persistent workers reset here
            iterator = super().__iter__()
        watch_loader_workers()
        _RUNNING_WORKERS.add(iterator)
        return iterator

    def _load_in_this_thread(self) -> Iterator[list]:
        # On the CPU a tensor can share the batch array's memory instead of copying it again (see _BatchArrays).
        on_cpu = paddle.get_device() == "cpu"
        arrays = _BatchArrays()
        for keys in self.batch_sampler:
            with _global_rngs_restored():
                images, labels, indices, number, problems = collate_checked(
                    (self.dataset[key] for key in keys), size=len(keys), empty=arrays.empty)
            if images is not None:  # the indices stay an array: only the bad-sample handling reads them
                arrays.lend(images)
                images, labels = _as_tensor(images, on_cpu), _as_tensor(labels, on_cpu)
            yield [images, labels, indices, number, problems]

    def _handle_problems(self, problems: list[list]) -> None:
        for index, description, error, kind in problems:
            index = int(index)
            if kind == "label":
                raise DatasetError(f"bad label in sample {index} ({description}): {error}. Check the dataset's "
                                   "labels or data.class_names.")
            if kind == "source":
                raise SourceUnavailableError(f"cannot load sample {index} ({description}): {error}")
            if kind == "collate":
                raise DatasetError(f"the transform produced samples of different shapes in {description}: {error}."
                                   " Check data.image_size and the transform presets.")
            if self.bad_sample_policy == "fail":
                raise BadSampleError(f"cannot load sample {index} ({description}): {error}. Fix or remove the file,"
                                     " or set data.bad_sample_policy=skip to drop unreadable samples.",
                                     index, description)
            self.bad_samples += 1
            self.total_bad_samples += 1
            budget = int(self.max_bad_fraction * self.batch_sampler.num_samples)
            log.warning("skipping unreadable sample %d (%s): %s [%d skipped this epoch, budget %d]",
                        index, description, error, self.bad_samples, budget)
            if self.bad_samples > budget:
                raise BadSampleError(
                    f"{self.bad_samples} unreadable samples in this epoch of {self.batch_sampler.num_samples}, "
                    f"more than data.max_bad_fraction={self.max_bad_fraction} allows ({budget}); the last was "
                    f"sample {index} ({description}): {error}", index, description)


@contextmanager
def _gc_frozen_for_fork() -> Iterator[None]:
    """Start workers with this process's objects frozen out of their garbage collector.

    A forked worker shares this process's memory until it writes to a page. Its first full garbage collection
    writes to the header of every container object it inherited (the whole of Paddle, the dataset's lists), and
    each page written becomes the worker's own: measured, 40 MB per worker in an epoch, whatever the dataset
    (docs/performance.md, "A million files"). ``gc.freeze()`` before the fork moves those objects to a generation
    the workers' collector never visits; unfreezing right after leaves this process's own collection unchanged.
    A program that froze objects itself keeps them frozen: then this does nothing.
    """
    if gc.get_freeze_count():
        yield
        return
    gc.freeze()
    try:
        yield
    finally:
        gc.unfreeze()


# Seconds to wait for workers to take their stop message before leaving them to die with this process.
WORKER_SHUTDOWN_TIMEOUT = 5.0


def _naming_lost_workers(batches: Iterator[list]) -> Iterator[list]:
    """``batches``, ending in :func:`lost_worker`'s error (no traceback chained) when a worker died."""
    batches = iter(batches)
    while True:
        lost = take_lost_worker()  # noticed while the batch before was trained on
        if lost is not None:
            raise lost
        try:
            with waiting_in_loader():
                batch = next(batches)
        except StopIteration:
            break
        except Exception as exc:
            lost = lost_worker(exc) or take_lost_worker()
            if lost is None:
                raise
            raise lost from None
        yield batch
    # Paddle's reader ends the iteration quietly once it finds a dead worker: not a whole epoch, so say why.
    lost = take_lost_worker()
    if lost is not None:
        raise lost


def _shut_down_workers(iterator: Any) -> None:
    """Stop a paddle multi-process iterator's workers now.

    Paddle shuts them down only when the iterator is exhausted or collected, and its prefetch thread keeps a
    reference to the iterator, so a trainer that stops after ``len(loader)`` batches (or a ``break``) would
    otherwise leave a set of workers behind every epoch. Paddle has no public close; this is what its own
    exhaustion path calls.
    """
    shutdown = getattr(iterator, "_try_shutdown_all", None)
    if shutdown is not None:
        try:
            shutdown(WORKER_SHUTDOWN_TIMEOUT)
        except (SystemError, RuntimeError) as exc:  # a worker already gone: said where it was noticed
            log.debug("loader workers shut down with %s", exc)


# Multi-process iterators whose workers may still run; weak, so that an iterator's collection still shuts it down.
_RUNNING_WORKERS: weakref.WeakSet = weakref.WeakSet()


def _shut_down_all_workers() -> None:
    for iterator in list(_RUNNING_WORKERS):
        _shut_down_workers(iterator)


# At exit multiprocessing SIGTERMs daemonic children and joins them; our workers ignore SIGTERM (see
# processes.ignore_stop_signals), so they are sent their stop message first. A finalizer with an exit priority
# runs before that step, whatever order the modules were imported in.
multiprocessing.util.Finalize(None, _shut_down_all_workers, exitpriority=100)


class _BatchArrays:
    """Image batch arrays for ``num_workers=0``, reused once the batch handed out from one is gone.

    A new 19 MB batch (32 images at 224 px) is fresh memory: the kernel faults in and zeroes every page as the
    images are written, which costs more than the copy itself (measured 90-155 us against 25 us an image,
    docs/performance.md "The loader at 224 px"). The CPU tensor shares the array's memory (DLPack), so an array
    is only reused once the view lent out in it has died: its DLPack capsule holds the view, and the tensor
    (with its slices, detached copies and the autograd graph that saved it) holds the capsule. The weak reference
    to that view is the test; nothing else ever sees the array. A consumer that keeps every batch keeps every
    view alive, and then each batch gets a new array, as before. The values written are the same either way:
    collate overwrites every row it returns.
    """

    # Lent arrays remembered: the one being consumed, the one before it (still referenced until the consumer's
    # loop variable moves on) and one spare. More would only hold idle memory until the epoch ends.
    KEEP = 3

    def __init__(self) -> None:
        self._lent: list[tuple[np.ndarray, weakref.ref]] = []

    def empty(self, shape: tuple, dtype: np.dtype) -> np.ndarray:
        for i, (array, view) in enumerate(self._lent):
            if view() is None and array.shape == shape and array.dtype == dtype:
                del self._lent[i]
                return array
        return np.empty(shape, dtype)

    def lend(self, view: np.ndarray) -> None:
        """Remember ``view`` (of an array from :meth:`empty`) as handed out; its array is free once it dies."""
        array = view if view.base is None else view.base
        self._lent.append((array, weakref.ref(view)))
        if len(self._lent) > self.KEEP:
            del self._lent[0]


def _as_tensor(array: np.ndarray, on_cpu: bool) -> paddle.Tensor:
    if on_cpu and array.flags.c_contiguous:
        # Zero-copy through DLPack (7 us for a 38 MB batch, against 20 ms for to_tensor's copy); the capsule
        # keeps the array alive for as long as the tensor lives.
        return paddle.from_dlpack(array)
    return paddle.to_tensor(array)


def _check_policy(cfg: Any) -> None:
    if cfg.bad_sample_policy not in BAD_SAMPLE_POLICIES:
        raise ConfigError(f"data.bad_sample_policy={cfg.bad_sample_policy!r} is not supported; valid values: "
                          f"{', '.join(BAD_SAMPLE_POLICIES)}")
    if not 0.0 <= cfg.max_bad_fraction <= 1.0:
        raise ConfigError(f"data.max_bad_fraction={cfg.max_bad_fraction} must be between 0 and 1")


def _train_sampler(dataset: Any, cfg: Any, batch_size: int, seed: int, num_replicas: int, rank: int,
                   sample_weights: np.ndarray | None) -> ResumableBatchSampler:
    """The training batch sampler ``data.sampler`` names (null or random: a permutation; class_balanced: a draw)."""
    name = getattr(cfg, "sampler", None) or "random"
    repeats = int(getattr(cfg, "num_repeats", 1) or 1)
    common = dict(drop_last=bool(cfg.drop_last), seed=seed, num_replicas=num_replicas, rank=rank,
                  num_repeats=repeats)
    if name == "random":
        return ResumableBatchSampler(dataset, batch_size, shuffle=True, **common)
    if name != "class_balanced":
        raise ConfigError(f"data.sampler={name!r} is not allowed; choose one of: random, class_balanced")
    if sample_weights is None:
        targets = dataset_targets(dataset)
        if targets is None:
            raise ConfigError(f"data.sampler=class_balanced needs the labels of every training sample, but "
                              f"{type(dataset).__name__} has no `targets`")
        sample_weights = class_balanced_weights(targets)
    return WeightedBatchSampler(dataset, batch_size, sample_weights, **common)


def build_loader(dataset: Any, cfg: Any, train: bool, seed: int, num_replicas: int = 1, rank: int = 0,
                 transform: Callable[[Any], Any] | None = None,
                 sample_weights: np.ndarray | None = None) -> CheckedDataLoader:
    """A loader over ``dataset`` configured by a ``DataConfig``.

    Train: shuffled by ``(seed, epoch)`` (``data.sampler=class_balanced``: drawn with replacement by
    ``sample_weights``, by default :func:`~paddletrain.data.sampling.balance.class_balanced_weights` of the dataset's
    targets), ``cfg.drop_last``, ``cfg.batch_size``, each image ``cfg.num_repeats``
    times (repeated augmentation). Eval: dataset order, every
    sample exactly once per rank shard (never dropped), ``cfg.eval_batch_size`` (default ``batch_size``).
    Call ``loader.batch_sampler.set_epoch(epoch)`` each epoch; save/restore ``loader.batch_sampler.state_dict()``
    to resume mid-epoch. ``transform`` is applied after the dataset's own (usually the dataset has it).
    """
    _check_policy(cfg)
    batch_size = cfg.batch_size if train else (cfg.eval_batch_size or cfg.batch_size)
    if batch_size <= 0:
        key = "data.batch_size" if train or not cfg.eval_batch_size else "data.eval_batch_size"
        raise ConfigError(f"{key}={batch_size} must be positive")
    if cfg.num_workers < 0:
        raise ConfigError(f"data.num_workers={cfg.num_workers} must be 0 or more")
    # Repeated augmentation and class balance shape the training draw; evaluation sees every sample once.
    if train:
        sampler = _train_sampler(dataset, cfg, batch_size, seed, num_replicas, rank, sample_weights)
    else:
        sampler = ResumableBatchSampler(dataset, batch_size, shuffle=False, seed=seed, num_replicas=num_replicas,
                                        rank=rank)
    return CheckedDataLoader(
        SeededDataset(dataset, transform, seed),
        sampler,
        num_workers=cfg.num_workers,
        use_shared_memory=cfg.use_shared_memory,
        persistent_workers=cfg.persistent_workers and cfg.num_workers > 0,
        bad_sample_policy=cfg.bad_sample_policy,
        max_bad_fraction=cfg.max_bad_fraction,
    )
