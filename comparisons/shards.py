"""Tar shards against the image folder they were packed from: the training input's images/s, and what it costs.

One image folder (``root``, or ``num_images`` synthetic JPEGs of ``source_size`` px) is packed once (pack's own
images/s is the first figure), then read by ``paddletrain.data.build_loader`` with the training transform
(``transform`` at ``image_size`` px, ``num_workers`` workers) in rounds of interleaved passes:

- ``folder``: ``data=imagefolder`` (one small file opened per image);
- ``shards``: ``data=shards`` on the local shard files;
- ``http_cold``: ``data=shards`` from an HTTP server on loopback (the standard library's, in a process of its
  own) with an empty cache: every shard crosses the connection in the pass (a first epoch);
- ``http_cold_no_ahead``: the same first epoch with ``data.fetch_ahead=0``: each shard is copied only when a
  reader first needs it (what fetch-ahead saves is ``http_cold`` over this arm, measured in the same rounds);
- ``http_cached``: the same URLs with a cache that the first round filled (a second epoch).

Each arm's rate (and its wait from the loader's start to the first batch) is its median over the rounds; the
ratios are medians of the per-round ratios (to ``folder`` for ``shards``, to ``shards`` for the HTTP arms). Then one
longer epoch (``memory_passes`` times the shards, by repeating their list) samples every loader worker's unique
memory (USS) at each tenth of the epoch: it stays flat when nothing grows with the number of samples read.
"""
from __future__ import annotations

import shutil
import statistics
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import psutil

from comparisons.rated_server import serve, stop
from paddletrain.bench.common import check_options, environment, finished, write_jpeg_folder
from paddletrain.config import TRANSFORMS, allowed

ARMS = ("folder", "shards", "http_cold", "http_cold_no_ahead", "http_cached")
# Issue 32's goals: sequential shards at least as fast as small files, and a loopback server within 10% of local
# shards once cached.
GOALS = {"shards_vs_folder": 1.0, "http_cached_vs_shards": 0.9, "http_cold_vs_shards": 0.9}


@dataclass
class ShardsCompareConfig:
    # An image folder (root/train/<class>/<image>); None: synthesise num_images JPEGs of source_size px.
    root: str | None = None
    num_images: int = allowed(2048, ge=1)
    source_size: int = allowed(320, ge=1)
    image_size: int = allowed(224, ge=1)
    transform: str = allowed("imagenet", choices=TRANSFORMS)
    batch_size: int = allowed(64, ge=1)
    num_workers: int = allowed(2, ge=0)
    shard_size_mb: float = allowed(64.0, gt=0)
    rounds: int = allowed(3, ge=1)
    # The memory epoch reads the shards this many times over (0: no memory epoch).
    memory_passes: int = allowed(4, ge=0)
    arms: list[str] = field(default_factory=lambda: list(ARMS))
    # The loopback server's rate for each response, in MB/s, as a link to another machine would set it (0: as fast
    # as loopback goes).
    http_mb_per_s: float = allowed(0.0, ge=0)
    # data.shuffle_buffer of the shard arms: the samples shuffled together (a window of shards read at a time).
    shuffle_buffer: int = allowed(10_000, ge=1)


def _data_config(cfg: ShardsCompareConfig, **keys: Any) -> Any:
    from omegaconf import OmegaConf

    from paddletrain.config import DataConfig

    node = OmegaConf.structured(DataConfig(image_size=cfg.image_size, train_transform=cfg.transform,
                                           batch_size=cfg.batch_size, num_workers=cfg.num_workers, drop_last=False))
    OmegaConf.set_struct(node, False)
    if keys.get("name") == "shards":
        keys.setdefault("shuffle_buffer", cfg.shuffle_buffer)
    for key, value in keys.items():
        node[key] = value
    return node


def _train_dataset(data_cfg: Any) -> Any:
    """The training split with the training transform (an image folder's train/ alone: it needs no val/)."""
    from paddletrain.config import DataConfig, component_options
    from paddletrain.data import build_datasets, build_transform
    from paddletrain.data.formats.imagefolder import ImageFolderDataset

    transform = build_transform(data_cfg, train=True)
    if data_cfg.name == "imagefolder":
        return ImageFolderDataset(data_cfg.root, "train", transform=transform)
    # The shards builder's own keys (data.urls, ...) are its options, as on the command line.
    return build_datasets(data_cfg, transform, None, options=component_options(data_cfg, DataConfig)).train


@dataclass
class _Pass:
    images_per_s: float  # the whole pass, worker start-up included, as in training
    first_batch_s: float  # from the loader's start to its first batch: what the first shards held it up


def _epoch(dataset: Any, data_cfg: Any, epoch: int, on_batch: Any = None) -> _Pass:
    """One epoch of the library's loader over ``dataset``."""
    from paddletrain.data import build_loader

    loader = build_loader(dataset, data_cfg, train=True, seed=0)
    loader.batch_sampler.set_epoch(epoch)
    start, images, first = time.perf_counter(), 0, 0.0
    for number, (batch, _) in enumerate(loader):
        if not number:
            first = time.perf_counter() - start
        images += int(batch.shape[0])
        if on_batch is not None:
            on_batch(number, len(loader))
    return _Pass(images / (time.perf_counter() - start), first)


def _worker_uss_mb() -> list[float]:
    """Each loader worker's unique memory (USS: pages no other process shares, so what it grew by itself)."""
    sizes = []
    for child in psutil.Process().children(recursive=True):
        try:
            sizes.append(child.memory_full_info().uss / 2**20)
        except (psutil.NoSuchProcess, psutil.AccessDenied):
            continue
    return sizes


def run_shards(cfg: ShardsCompareConfig) -> dict[str, Any]:
    from paddletrain.data.shards.pack import pack
    from paddletrain.errors import ConfigError
    from paddletrain.job.runtime import setup_runtime

    check_options(cfg, "shards")
    unknown = sorted(set(cfg.arms) - set(ARMS))
    if unknown or not cfg.arms:
        raise ConfigError(f"shards: arms={cfg.arms} must name some of {', '.join(ARMS)}")
    runtime = setup_runtime("cpu", None)
    env = environment(runtime.cpu_threads)
    work = Path(tempfile.mkdtemp(prefix="shards-compare-"))
    try:
        root = Path(cfg.root) if cfg.root else write_jpeg_folder(work / "images", cfg.num_images, cfg.source_size)
        started = time.perf_counter()
        packed = pack(root / "train", work / "shards", shard_size_mb=cfg.shard_size_mb, prefix="train")
        pack_seconds = time.perf_counter() - started
        split = packed.splits[0]
        names = [p.name for p in split.shards]
        pattern = f"train-{{000000..{len(names) - 1:06d}}}.tar"
        server, url = serve(work / "shards", cfg.http_mb_per_s)
        try:
            configs = {
                "folder": _data_config(cfg, name="imagefolder", root=str(root)),
                "shards": _data_config(cfg, name="shards", urls=str(work / "shards" / pattern),
                                       val_urls=str(split.shards[0]), cache_dir=str(work / "unused")),
                "http_cached": _data_config(cfg, name="shards", urls=f"{url}/{pattern}",
                                            val_urls=f"{url}/{names[0]}", cache_dir=str(work / "cache")),
            }
            datasets = {arm: _train_dataset(configs[arm]) for arm in configs}
            _epoch(datasets["http_cached"], configs["http_cached"], 0)  # fills the cache the cached arm reads
            passes: dict[str, list[_Pass]] = {arm: [] for arm in cfg.arms}
            for number in range(cfg.rounds):
                for arm in cfg.arms:
                    if arm.startswith("http_cold"):
                        ahead = {"fetch_ahead": 0} if arm == "http_cold_no_ahead" else {}
                        cold = _data_config(cfg, name="shards", urls=f"{url}/{pattern}", val_urls=f"{url}/{names[0]}",
                                            cache_dir=str(work / f"{arm}{number}"), **ahead)
                        passes[arm].append(_epoch(_train_dataset(cold), cold, number + 1))
                        shutil.rmtree(work / f"{arm}{number}", ignore_errors=True)
                    else:
                        passes[arm].append(_epoch(datasets[arm], configs[arm], number + 1))
        finally:
            stop(server)
        # Local shards only, and after the server stopped: its process is not one of the loader's workers.
        memory = _memory_epoch(cfg, work, names) if cfg.memory_passes and cfg.num_workers else []
    finally:
        shutil.rmtree(work, ignore_errors=True)
    rates = {arm: [p.images_per_s for p in values] for arm, values in passes.items()}
    rows = [{"arm": arm, "images_per_s": statistics.median(values), "passes": len(values),
             "spread": (max(values) - min(values)) / statistics.median(values),
             "first_batch_s": statistics.median(p.first_batch_s for p in passes[arm]),
             "each_pass": [round(value, 1) for value in values]}
            for arm, values in rates.items()]
    ratios = {}
    for arm, base in (("shards", "folder"), ("http_cold", "shards"), ("http_cold_no_ahead", "shards"),
                      ("http_cold", "http_cold_no_ahead"), ("http_cached", "shards")):
        if arm in rates and base in rates:
            ratios[f"{arm}_vs_{base}"] = statistics.median(a / b for a, b in zip(rates[arm], rates[base], strict=True))
    goals = [{"goal": f"{name} >= {bound}", "measured": ratios[name], "met": ratios[name] >= bound}
             for name, bound in GOALS.items() if name in ratios]
    return {"benchmark": "shards", "config": vars(cfg), "environment": finished(env), "rows": rows,
            "summary": {**ratios, "pack_images_per_s": split.samples / pack_seconds, "images": split.samples,
                        "shards": len(names)},
            "memory": memory, "goals": goals,
            "notes": [f"{split.samples} images in {len(names)} shards of at most {cfg.shard_size_mb:g} MB",
                      f"HTTP responses at {cfg.http_mb_per_s:g} MB/s" if cfg.http_mb_per_s else
                      "HTTP responses as fast as loopback goes"]}


def _memory_epoch(cfg: ShardsCompareConfig, work: Path, names: list[str]) -> list[dict[str, float]]:
    """The largest worker's unique memory at each tenth of one epoch over the shards read ``memory_passes`` times."""
    folder = work / "shards"
    urls = [str(folder / name) for name in names]
    # The same shard files under more names (hard links): a longer epoch of the same bytes.
    for copy in range(1, cfg.memory_passes):
        for name in names:
            (folder / f"copy{copy}-{name}").hardlink_to(folder / name)
            urls.append(str(folder / f"copy{copy}-{name}"))
    # The index names the originals; the copies, which it does not list, are scanned at start-up.
    data_cfg = _data_config(cfg, name="shards", urls=urls, val_urls=urls[0], cache_dir=str(work / "unused"))
    samples: list[dict[str, float]] = []

    def sample(number: int, total: int) -> None:
        if number % max(1, total // 10) == 0 or number == total - 1:
            uss = _worker_uss_mb()
            samples.append({"share_of_epoch": round((number + 1) / total, 3), "workers": len(uss),
                            "worker_uss_mb_max": max(uss, default=0.0)})

    _epoch(_train_dataset(data_cfg), data_cfg, 0, on_batch=sample)
    return samples
