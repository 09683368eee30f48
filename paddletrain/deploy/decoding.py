"""Decode and preprocess image files into model-ready batches, in worker processes, in input order.

Used by :mod:`paddletrain.predict`. With workers, each batch is written straight into a shared-memory block
that the main process reads in place: pickling a 224 px float32 batch of 32 (19 MB) through a pipe cost
25-40 ms per batch here, and the unpickling ran in the process that also runs the predictor. When
``/dev/shm`` is too small for the blocks (64 MB is Docker's default) the batches travel pickled instead, with a
log line saying so.

Why a pool of our own rather than ``paddle.io.DataLoader(use_shared_memory=True)``: on the same work (256 JPEGs
to 224 px batches of 32, one worker) the DataLoader delivers 0.64 x the pool's images/s, because its worker
stacks each batch and then copies it into a fresh shared-memory segment (0.39 s of worker CPU a pass against the
pool's 0.23 s, which writes each image into its row of a reused block). ``python -m comparisons decode``
measures both (docs/performance.md); if the DataLoader comes within 5%, it should replace this module.
"""
from __future__ import annotations

import itertools
import logging
import os
import signal
import time
from collections import deque
from collections.abc import Iterator, Sequence
from concurrent.futures import ProcessPoolExecutor
from concurrent.futures.process import BrokenProcessPool
from multiprocessing import shared_memory

import numpy as np

from paddletrain.deploy.predictor import Preprocessing
from paddletrain.errors import DataWorkerLost
from paddletrain.job.processes import die_with_parent, ignore_stop_signals, shut_down_later, worker_killed

log = logging.getLogger("paddletrain")

# Batches decoded ahead per worker: enough to hide decode jitter, bounded so memory does not grow when the
# predictor is the slower side.
PREFETCH_PER_WORKER = 2
SHM_DIR = "/dev/shm"

# (paths decoded, their stacked inputs or None, (path, reason) for each failure)
Batch = tuple[list[str], np.ndarray | None, list[tuple[str, str]]]  # a runtime alias, evaluated at import

_worker_preprocessing: Preprocessing | None = None
_worker_blocks: dict[str, shared_memory.SharedMemory] = {}


def _decode_each(paths: Sequence[str], preprocessing: Preprocessing) -> Iterator[tuple[str, np.ndarray | None, str]]:
    # Here, not at the top: paddletrain.data's __init__ loads Paddle (~4 s), which predict's start-up does without.
    from paddletrain.data.formats.images import ImageReadError, open_image

    for path in paths:
        try:
            yield path, preprocessing(open_image(path)), ""
        except ImageReadError as exc:  # already says what kind of failure it was
            yield path, None, str(exc)
        except Exception as exc:  # any decode/preprocess failure is about this file, not the run
            yield path, None, f"{type(exc).__name__}: {exc}"


def load_batch(paths: Sequence[str], preprocessing: Preprocessing | None = None) -> Batch:
    """Decode and preprocess ``paths``: (the paths that worked, their stacked inputs, (path, reason) failures)."""
    ok, arrays, failures = [], [], []
    for path, array, reason in _decode_each(paths, preprocessing or _worker_preprocessing):
        if array is None:
            failures.append((path, reason))
        else:
            ok.append(path)
            arrays.append(array)
    return ok, (np.stack(arrays) if arrays else None), failures


def _load_into_block(paths: Sequence[str], block_name: str, shape: tuple[int, ...]
                     ) -> tuple[list[str], int, list[tuple[str, str]]]:
    """Like :func:`load_batch`, but the inputs go to rows 0..n-1 of a shared-memory block; returns n."""
    block = _worker_blocks.get(block_name)
    if block is None:
        block = _worker_blocks[block_name] = shared_memory.SharedMemory(name=block_name)
    rows = np.ndarray(shape, np.float32, buffer=block.buf)
    ok, failures = [], []
    for path, array, reason in _decode_each(paths, _worker_preprocessing):
        if array is not None and array.shape != shape[1:]:
            array, reason = None, f"ValueError: preprocessing gave shape {array.shape}, expected {shape[1:]}"
        if array is None:
            failures.append((path, reason))
        else:
            rows[len(ok)] = array
            ok.append(path)
    del rows  # no view may outlive the call: the block is closed when the worker exits
    return ok, len(ok), failures


def _init_worker(preprocessing: Preprocessing, cores: list[int] | None, parent_pid: int) -> None:
    global _worker_preprocessing
    # The predictor's process decides when decoding stops; a `kill -9` of it must not leave workers (and,
    # through their inherited pipe, multiprocessing's resource tracker) behind.
    ignore_stop_signals()
    die_with_parent(signal.SIGKILL, parent_pid)
    _worker_preprocessing = preprocessing
    if cores:
        os.sched_setaffinity(0, cores)


def _worker_cores(num_workers: int) -> list[int] | None:
    """The last ``num_workers`` usable cores, so the predictor's thread(s) keep the others to themselves.

    Measured on 2 cores (resnet18, 1 worker, medians of 4 interleaved runs of predict_files vs the bare
    predictor): fp32 0.98 pinned vs 0.94 unpinned, bf16 0.89 vs 0.87. None when the cores would not leave
    the predictor one of its own (or without affinity control).
    """
    try:
        cores = sorted(os.sched_getaffinity(0))
    except AttributeError:  # not Linux
        return None
    return cores[-num_workers:] if len(cores) > num_workers else None


def _shm_fits(nbytes: int) -> bool:
    try:
        stat = os.statvfs(SHM_DIR)
    except OSError:
        return False
    return stat.f_bavail * stat.f_frsize >= nbytes * 1.25  # leave room for everyone else's segments


class _Blocks:
    """Shared-memory blocks of one batch each, handed out and taken back; all unlinked on close."""

    def __init__(self, count: int, shape: tuple[int, ...]) -> None:
        self.shape = shape
        nbytes = int(np.prod(shape)) * 4
        self._blocks = [shared_memory.SharedMemory(create=True, size=nbytes) for _ in range(count)]
        self.free = deque(block.name for block in self._blocks)
        self._by_name = {block.name: block for block in self._blocks}

    def rows(self, name: str, count: int) -> np.ndarray:
        return np.ndarray(self.shape, np.float32, buffer=self._by_name[name].buf)[:count]

    def close(self) -> None:
        for block in self._blocks:
            block.close()
            block.unlink()


def decoded_batches(chunks: list[list[str]], preprocessing: Preprocessing, num_workers: int,
                    input_size: tuple[int, int, int]) -> Iterator[Batch]:
    """Decoded batches of ``chunks`` in order; with workers, up to ``PREFETCH_PER_WORKER * num_workers`` ahead.

    A yielded array is valid until the next batch is requested (with workers it lives in a shared block that
    is reused): copy it to keep it.

    With workers, this process decodes the first chunk itself while the workers start, and it does not wait
    for them to exit at the end: forking a process that has loaded a predictor took ~20 ms here and a worker's
    exit 35-65 ms, time the predictor sat idle before. On an int8 resnet18 (128 JPEGs, 1 worker) the
    ``predict_files`` / bare predictor ratio went from 0.851-0.904 to 0.867-0.935 (docs/performance.md, the
    int8 ``predict_files`` runs). A single chunk starts no workers.
    """
    if num_workers == 0 or len(chunks) <= 1:
        for chunk in chunks:
            yield load_batch(chunk, preprocessing)
        return
    in_flight = PREFETCH_PER_WORKER * num_workers
    shape = (max(map(len, chunks[1:])), *input_size)
    blocks = _blocks_if_room(in_flight + 1, shape)  # +1: the batch the caller is using
    pool = None
    try:
        pool = ProcessPoolExecutor(num_workers, initializer=_init_worker,
                                   initargs=(preprocessing, _worker_cores(num_workers), os.getpid()))
        pending: deque = deque()
        queued = iter(chunks[1:])
        workers: dict = {}  # pid -> Process, to name one that dies

        def submit(chunk: list[str]) -> None:
            if blocks is None:
                pending.append((None, pool.submit(load_batch, chunk)))
            else:
                name = blocks.free.popleft()
                pending.append((name, pool.submit(_load_into_block, chunk, name, shape)))
            workers.update(pool._processes or {})

        try:
            for chunk in itertools.islice(queued, in_flight):  # the first submit starts the workers
                submit(chunk)
            yield load_batch(chunks[0], preprocessing)
            while pending:
                name, future = pending.popleft()
                result = future.result()
                next_chunk = next(queued, None)
                if next_chunk is not None:
                    submit(next_chunk)  # keeps the workers busy while the caller predicts
                if blocks is None:
                    yield result
                else:
                    ok, count, failures = result
                    yield ok, (blocks.rows(name, count) if count else None), failures
                    blocks.free.append(name)  # the caller has moved on: the block can be refilled
        except BrokenProcessPool:  # from a result, or from a submit once the pool knows
            raise _decode_worker_lost(workers) from None
    finally:
        if pool is not None:
            # Queued work is dropped; the workers exit on their own (the executor's thread reaps them). A worker
            # still writing into a block keeps its own mapping, so unlinking the blocks now is safe.
            shut_down_later(pool)  # joined when the command ends (paddletrain.cli), not now
        if blocks is not None:
            blocks.close()


def _decode_worker_lost(workers: dict) -> DataWorkerLost:
    """A decode worker died (the out-of-memory killer, a decoder's crash): the error naming it. The others are
    killed: they ignore SIGTERM, which is what the pool sends them, and its thread would wait for them forever."""
    # The pool's thread reaps the dead worker too: until it has, its exit code can read as None here.
    deadline = time.monotonic() + 2.0
    while True:
        dead = [(pid, -process.exitcode) for pid, process in workers.items()
                if process.exitcode is not None and process.exitcode < 0]
        if dead or time.monotonic() > deadline:
            break
        time.sleep(0.02)
    for process in workers.values():
        if process.exitcode is None:
            process.kill()
    if not dead:  # ended without a signal (os._exit in a decoder library)
        return DataWorkerLost("a decode worker ended unexpectedly")
    pid, signum = dead[0]
    try:
        signal_name = signal.Signals(signum).name
    except ValueError:
        signal_name = f"signal {signum}"
    return worker_killed("a decode worker", pid, signal_name, "num_workers or batch_size")


def _blocks_if_room(count: int, shape: tuple[int, ...]) -> _Blocks | None:
    """``count`` shared blocks of one batch each, or None (with a log line) when ``/dev/shm`` cannot hold them."""
    if _shm_fits(count * int(np.prod(shape)) * 4):
        return _Blocks(count, shape)
    log.info("%s has too little free space for %d decoded batches of %s: batches are sent pickled "
             "(slower); give the container more shared memory (docker --shm-size)", SHM_DIR, count,
             "x".join(map(str, shape)))
    return None
