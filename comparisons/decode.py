"""Decode pipeline: JPEG files -> preprocessed float32 batches for the Predictor, by each way ``predict`` could do it.

Arms (the same files, preprocessing, batches and worker count; windows interleaved A B C A B C ...):

- ``pool``: :func:`paddletrain.deploy.decoding.decoded_batches`, what ``predict`` uses: a process pool whose workers
  write each image straight into its row of a shared-memory block that the main process reads in place.
- ``dataloader``: the same work through ``paddle.io.DataLoader`` (``use_shared_memory=True``, workers set up as
  ``predict``'s: stop signals ignored, dying with the parent, pinned to the last cores), the batch handed over with
  ``np.from_dlpack`` (no copy). It exists to be compared: the pool stays only while it is measurably faster.
- ``main``: decoding in the calling process (``num_workers=0``), what the workers are there to beat while the
  main process runs the predictor.

A window is one whole pass over the files, worker start-up included (``predict`` pays it once per run);
``first_batch_s`` and ``rest_images_per_s`` split it into start-up and steady state, ``worker_cpu_s`` is the CPU
time the worker processes spent on the pass. The consumer copies each batch into a preallocated input buffer, as
the Predictor's ``copy_from_cpu`` does.
"""
from __future__ import annotations

import itertools
import math
import multiprocessing
import os
import resource
import statistics
import tempfile
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import paddle

from paddletrain.bench.common import (
    check_options,
    environment,
    finished,
    interleave,
    paired_ratio,
    summarize,
    write_jpeg_folder,
)
from paddletrain.config import allowed
from paddletrain.data.loading.loaders import _shut_down_workers
from paddletrain.deploy.decoding import Batch, _decode_each, _worker_cores, decoded_batches
from paddletrain.errors import ConfigError
from paddletrain.job.processes import call_with_worker_setup, stop_signals_held

ARMS = ("pool", "dataloader", "main")
# A decode worker exits within milliseconds of its pool's shutdown; this only bounds a stuck one.
WORKER_EXIT_TIMEOUT_S = 30


@dataclass
class DecodeBenchConfig:
    # Optional/List rather than `X | None`/list[...]: OmegaConf evaluates these annotations (Python >= 3.9).
    images: int = allowed(256, ge=1)
    # The model's input side; the JPEGs are image_size / 0.875 px (resize then centre crop, as ImageNet eval).
    image_size: int = allowed(224, ge=8)
    batch_size: int = allowed(32, ge=1)
    # Decode processes for the pool and the DataLoader; None = predict's default (half the cores).
    num_workers: int | None = allowed(None, ge=1)
    arms: list[str] = allowed(factory=lambda: list(ARMS), choices=ARMS)
    windows: int = allowed(5, ge=1)
    warmup: int = allowed(1, ge=0)


class _PathDataset(paddle.io.Dataset):
    """``dataset[i]`` = (path, its preprocessed input or None, the failure reason); never raises (a raising
    ``__getitem__`` hangs paddle's loader)."""

    def __init__(self, paths: list[str], preprocessing: Any) -> None:
        super().__init__()
        self.paths = paths
        self.preprocessing = preprocessing

    def __len__(self) -> int:
        return len(self.paths)

    def __getitem__(self, index: int) -> tuple[str, np.ndarray | None, str]:
        return next(_decode_each([self.paths[index]], self.preprocessing))


class _GivenBatches(paddle.io.BatchSampler):
    """The batches of indices ``predict`` already cut (nothing of BatchSampler's own set-up applies)."""

    def __init__(self, sizes: list[int]) -> None:  # no super().__init__(): it wants a sampler or a dataset
        starts = np.cumsum([0, *sizes]).tolist()
        self.batches = [list(range(a, b)) for a, b in itertools.pairwise(starts)]

    def __iter__(self) -> Iterator[list[int]]:
        return iter(self.batches)

    def __len__(self) -> int:
        return len(self.batches)


def _collate(items: list[tuple[str, np.ndarray | None, str]]) -> list[Any]:
    ok = [path for path, array, _ in items if array is not None]
    arrays = [array for _, array, _ in items if array is not None]
    failures = [[path, reason] for path, array, reason in items if array is None]
    # Paddle silently ends the iteration at a batch that holds no array, so one is always there.
    return [ok, np.stack(arrays) if arrays else None, failures, np.array([len(items)], np.int64)]


class _PinTo:
    def __init__(self, cores: list[int] | None) -> None:
        self.cores = cores

    def __call__(self, worker_id: int) -> None:
        if self.cores:
            os.sched_setaffinity(0, self.cores)


def dataloader_batches(chunks: list[list[str]], preprocessing: Any, num_workers: int,
                       input_size: tuple[int, int, int]) -> Iterator[Batch]:
    """:func:`paddletrain.deploy.decoding.decoded_batches`' contract through ``paddle.io.DataLoader`` (workers >= 1)."""
    del input_size  # the pool needs it to size its blocks; the DataLoader sizes its own
    paths = [path for chunk in chunks for path in chunk]
    setup = call_with_worker_setup(_PinTo(_worker_cores(num_workers)), os.getpid())
    batches = _GivenBatches([len(chunk) for chunk in chunks])
    loader = paddle.io.DataLoader(_PathDataset(paths, preprocessing), batch_sampler=batches, num_workers=num_workers,
                                  collate_fn=_collate, use_shared_memory=True, places=paddle.CPUPlace(),
                                  prefetch_factor=2, worker_init_fn=setup)
    with stop_signals_held():
        iterator = iter(loader)
    try:
        for ok, inputs, failures, _ in iterator:
            yield ok, (None if inputs is None else np.from_dlpack(inputs)), [tuple(f) for f in failures]
    finally:
        _shut_down_workers(iterator)


def _preprocessing(image_size: int) -> Any:
    from omegaconf import OmegaConf

    from paddletrain.config import DataConfig
    from paddletrain.data import preprocessing_info
    from paddletrain.deploy.predictor import Preprocessing

    imagenet = dict(mean=[0.485, 0.456, 0.406], std=[0.229, 0.224, 0.225])
    data = OmegaConf.structured(DataConfig(image_size=image_size, eval_transform="imagenet", **imagenet))
    return Preprocessing(preprocessing_info(data))


def _children_cpu_s() -> float:
    """CPU seconds of this process's finished (joined) child processes: the decode workers."""
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def _arm(pipeline: Callable[..., Iterator[Batch]], chunks: list[list[str]], preprocessing: Any, workers: int,
         input_size: tuple[int, int, int], measured: dict[str, list[float]]) -> Callable[[int], float]:
    """Whole passes over ``chunks``; records each pass's seconds to its first batch and its workers' CPU seconds."""
    buffer = np.empty((max(map(len, chunks)), *input_size), np.float32)
    expected = sum(map(len, chunks))

    def one_pass() -> float:
        already_running = set(multiprocessing.active_children())  # e.g. a test's forking server: not this pass's
        decoded, start, cpu = 0, time.perf_counter(), _children_cpu_s()
        for ok, inputs, failures in pipeline(chunks, preprocessing, workers, input_size):
            if failures:
                raise RuntimeError(f"bench decode: {len(failures)} synthetic images failed: {failures[0]}")
            if not decoded:
                measured["first_batch_s"].append(time.perf_counter() - start)
            buffer[:len(ok)] = inputs  # what the Predictor's copy_from_cpu does with it
            decoded += len(ok)
        seconds = time.perf_counter() - start
        # The pool does not wait for its workers to exit (predict does not either); their CPU time is counted
        # once they are reaped, outside the timed pass.
        for child in set(multiprocessing.active_children()) - already_running:
            child.join(WORKER_EXIT_TIMEOUT_S)
        measured["worker_cpu_s"].append(_children_cpu_s() - cpu)
        if decoded != expected:
            raise RuntimeError(f"bench decode: {decoded} images decoded of {expected}")
        return seconds

    return lambda passes: sum(one_pass() for _ in range(passes))


def run_decode(cfg: DecodeBenchConfig) -> dict[str, Any]:
    """Images/s of each arm (median over windows), split into start-up and steady state, and paired ratios."""
    from paddletrain.deploy.batch_prediction import default_num_workers

    check_options(cfg, "decode")
    if not cfg.arms:
        raise ConfigError(f"bench decode: arms=[] names no arm; choose from {list(ARMS)}")
    env = environment()
    workers = default_num_workers() if cfg.num_workers is None else cfg.num_workers
    pipelines = {"pool": (decoded_batches, workers), "dataloader": (dataloader_batches, workers),
                 "main": (decoded_batches, 0)}
    input_size = (3, cfg.image_size, cfg.image_size)
    preprocessing = _preprocessing(cfg.image_size)
    source = max(cfg.image_size, round(cfg.image_size / 0.875))
    with tempfile.TemporaryDirectory(prefix="paddletrain-bench-") as tmp:
        root = write_jpeg_folder(Path(tmp) / "images", cfg.images, source)
        paths = sorted(str(p) for p in root.rglob("*.jpg"))
        chunks = [paths[i:i + cfg.batch_size] for i in range(0, len(paths), cfg.batch_size)]
        measured = {name: {"first_batch_s": [], "worker_cpu_s": []} for name in cfg.arms}
        arms = {name: _arm(pipelines[name][0], chunks, preprocessing, pipelines[name][1], input_size,
                           measured[name]) for name in cfg.arms}
        per_pass = interleave(arms, cfg.windows, 1, cfg.warmup)
    rows = []
    for name, seconds in per_pass.items():
        timing = summarize(seconds, len(paths))
        first = statistics.median(measured[name]["first_batch_s"][cfg.warmup:])
        rows.append({"arm": name, "num_workers": pipelines[name][1], "images": len(paths),
                     "seconds_per_pass": timing["ms_per_step"] / 1e3, "images_per_s": timing["images_per_s"],
                     "first_batch_s": first,
                     # The steady state: the images after the first batch, without worker start-up.
                     "rest_images_per_s": (len(paths) - len(chunks[0])) / (statistics.median(seconds) - first),
                     "worker_cpu_s": statistics.median(measured[name]["worker_cpu_s"][cfg.warmup:]),
                     "spread": timing["spread"], "windows_s": [round(ms / 1e3, 3) for ms in timing["windows_ms"]]})
    summary: dict[str, float] = {}
    goals = []
    if "pool" in per_pass and "dataloader" in per_pass:
        # Throughput ratio = the pool's time / the DataLoader's: >= 0.95 means the DataLoader is as fast.
        summary["dataloader_vs_pool"] = paired_ratio(per_pass["pool"], per_pass["dataloader"])
        goals.append({"goal": "pool measurably faster: dataloader_vs_pool < 0.95 (else the DataLoader replaces it)",
                      "measured": summary["dataloader_vs_pool"], "met": summary["dataloader_vs_pool"] < 0.95})
    for name in ("pool", "dataloader"):
        if "main" in per_pass and name in per_pass:
            summary[f"{name}_vs_main"] = paired_ratio(per_pass["main"], per_pass[name])
    return {"benchmark": "decode", "config": vars(cfg), "environment": finished(env), "rows": rows,
            "summary": summary, "goals": goals,
            "notes": [f"{len(paths)} JPEGs of {source} px -> {cfg.image_size} px float32 batches of "
                      f"{cfg.batch_size} ({math.ceil(len(paths) / cfg.batch_size)} a pass), {workers} decode "
                      "worker(s); a window is one pass, worker start-up included"]}
