"""Data pipeline throughput: image-folder decode + augment, bare and through the library's loader.

- ``bare``: ``dataset[i]`` (PIL decode + the training transform) in a plain loop on one core: the rate the
  loader should reach with ``num_workers=0`` (goal: >= 0.9x).
- ``loader``: ``paddletrain.data.build_loader`` (seeded per-sample augmentation, bad-sample checks,
  collate, tensors) for each worker count: steady images/s from the first batch to the last, and the
  first batch's wait (worker start-up) separately. Passes are interleaved (bare, w0, w1, ... per epoch)
  and ``vs_bare`` is the median of the per-pass ratios.
- ``trainer``: ``Trainer.fit`` of ``model`` on that loader for two epochs; the second epoch's
  ``train/data_time_share`` is the share of step time spent waiting for data (goal: < 10% when workers
  suffice) and ``train/throughput`` its images/s.
"""
from __future__ import annotations

import statistics
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import paddle

from paddletrain.bench.common import bench_model, check_options, environment, finished, paired_ratio, write_jpeg_folder
from paddletrain.config import TRANSFORMS, allowed
from paddletrain.errors import ConfigError


@dataclass
class DataBenchConfig:
    # An image folder (root/train/<class>/<image>); None: synthesise num_images JPEGs of source_size px.
    root: str | None = None
    num_images: int = allowed(2048, ge=1)
    source_size: int = allowed(64, ge=1)
    image_size: int = allowed(32, ge=1)
    transform: str = allowed("small", choices=TRANSFORMS)  # a data.train_transform preset
    batch_size: int = allowed(64, ge=1)
    workers: list[int] = allowed(factory=lambda: [0, 1, 2], ge=0)
    # Timed passes over the images (bare and per worker count); the median is reported. This machine's speed
    # drifts by up to 15% between sub-second passes: fewer or shorter passes make the ratio noisy.
    epochs: int = allowed(5, ge=1)
    # Model for the Trainer's data-wait share; null skips that part.
    model: str | None = "resnet20"
    train_batches: int = allowed(16, ge=1)
    # paddle 3.3.1's persistent workers wait ~0.5 s at every epoch start (see docs/performance.md).
    persistent_workers: bool = False
    cpu_threads: int | None = allowed(None, ge=1)


def _data_config(cfg: DataBenchConfig, num_workers: int) -> Any:
    from omegaconf import OmegaConf

    from paddletrain.config import DataConfig

    return OmegaConf.structured(DataConfig(name="imagefolder", root=cfg.root, image_size=cfg.image_size,
                                           train_transform=cfg.transform, batch_size=cfg.batch_size,
                                           num_workers=num_workers, persistent_workers=cfg.persistent_workers,
                                           drop_last=False))


def _dataset(cfg: DataBenchConfig) -> Any:
    from paddletrain.data import build_transform
    from paddletrain.data.formats.imagefolder import ImageFolderDataset

    return ImageFolderDataset(cfg.root, "train", transform=build_transform(_data_config(cfg, 0), train=True))


def bare_pass(dataset: Any) -> float:
    """Images/s of one pass of ``dataset[i]`` in a plain loop."""
    start = time.perf_counter()
    for i in range(len(dataset)):
        dataset[i]
    return len(dataset) / (time.perf_counter() - start)


def loader_pass(loader: Any, epoch: int) -> tuple[float, float]:
    """One epoch of ``loader``: steady images/s (first batch to last) and the first batch's wait in seconds.

    The steady rate leaves out worker start-up, which ``first_batch_s`` reports instead.
    """
    loader.batch_sampler.set_epoch(epoch)
    start = time.perf_counter()
    arrivals, sizes = [], []
    for batch in loader:
        arrivals.append(time.perf_counter())
        sizes.append(int(batch[0].shape[0]))
    if len(arrivals) < 2:
        raise ConfigError(f"bench data: need at least 2 batches per epoch; lower batch_size={loader.batch_size} "
                          "or add images")
    return sum(sizes[1:]) / (arrivals[-1] - arrivals[0]), arrivals[0] - start


def interleaved_rates(dataset: Any, loaders: dict[int, Any], epochs: int) -> list[dict[str, Any]]:
    """Rows for the bare loop and each loader; every pass runs bare, w0, w1, ... so load drift hits all alike."""
    bare: list[float] = []
    timings: dict[int, list[tuple[float, float]]] = {w: [] for w in loaders}
    for epoch in range(epochs):
        bare.append(bare_pass(dataset))
        for workers, loader in loaders.items():
            timings[workers].append(loader_pass(loader, epoch))
    rows: list[dict[str, Any]] = [{"pipeline": "bare decode+augment (1 core)", "num_workers": None,
                                   "images_per_s": statistics.median(bare), "vs_bare": 1.0}]
    for workers, passes in timings.items():
        rates = [rate for rate, _ in passes]
        rows.append({"pipeline": "build_loader", "num_workers": workers, "images_per_s": statistics.median(rates),
                     "vs_bare": paired_ratio(rates, bare),
                     "first_batch_s": statistics.median(first for _, first in passes)})
    return rows


def trainer_data_wait(cfg: DataBenchConfig, loader: Any, num_classes: int) -> dict[str, float]:
    """The Trainer's own data-wait share and throughput in its second epoch on ``loader``."""
    from paddletrain.engine.limits import Limits
    from paddletrain.engine.trainer import Trainer

    model = bench_model(cfg.model, num_classes)
    optimizer = paddle.optimizer.Momentum(0.01, momentum=0.9, parameters=model.parameters())
    trainer = Trainer(model, optimizer, limits=Limits(max_epochs=2, limit_train_batches=cfg.train_batches),
                      num_classes=num_classes, handle_signals=False)
    metrics = trainer.fit(loader)
    return {"data_time_share": metrics["train/data_time_share"], "train_images_per_s": metrics["train/throughput"]}


def run_data(cfg: DataBenchConfig) -> dict[str, Any]:
    """Bare decode+augment rate, loader rate per worker count and the Trainer's data-wait share."""
    from paddletrain.data import build_loader
    from paddletrain.job.runtime import setup_runtime

    check_options(cfg, "data")
    if not cfg.workers:
        raise ConfigError("bench data: workers=[] names no worker count; e.g. workers=[0,1,2]")
    runtime = setup_runtime("auto", cfg.cpu_threads)
    env = environment(runtime.cpu_threads)
    with tempfile.TemporaryDirectory(prefix="paddletrain-bench-") as tmp:
        if cfg.root is None:
            cfg.root = str(write_jpeg_folder(Path(tmp), cfg.num_images, cfg.source_size))
            synthetic = True
        else:
            synthetic = False
        dataset = _dataset(cfg)
        loaders = {w: build_loader(dataset, _data_config(cfg, w), train=True, seed=0) for w in cfg.workers}
        rows = interleaved_rates(dataset, loaders, cfg.epochs)
        if cfg.model:
            for row in rows[1:]:
                row.update(trainer_data_wait(cfg, loaders[row["num_workers"]], len(dataset.classes)))
        del loaders  # stops persistent workers, if any, before the folder goes
    if synthetic:
        cfg.root = None
    workers0 = next((r for r in rows[1:] if r["num_workers"] == 0), None)
    goals = [] if workers0 is None else [
        {"goal": "num_workers=0 >= 0.9 x bare", "measured": workers0["vs_bare"], "met": workers0["vs_bare"] >= 0.9}]
    source = "synthetic JPEGs" if synthetic else cfg.root
    return {"benchmark": "data", "config": vars(cfg), "environment": finished(env), "rows": rows,
            "goals": goals, "notes": [f"images: {len(dataset)} from {source}, transform preset {cfg.transform!r} "
                                      f"at {cfg.image_size}px"]}
