"""A million files: the sample index at ImageNet's size, without any image.

- ``parse``: :func:`~paddletrain.data.formats.label_list.read_label_list` of a generated PaddleClas list of ``lines``
lines
  (``check_files=False``), and the existence checks (``check_files=True``) on a generated folder of
  ``folder_files`` empty files, given per million lines.
- ``memory``: the :class:`~paddletrain.data.formats.sample_index.SampleIndex` of that list in bytes, against the
Python list of
  ``(path, label)`` tuples a torchvision-style dataset keeps (its list, tuples, strings and integers).
- ``workers``: one epoch through :func:`~paddletrain.data.build_loader` with ``workers`` worker processes over
  each of the two, with a reader that returns a tiny constant image after looking its path up (so the only
  memory a worker can gain is what reading the index costs it); each worker's unique memory (USS, PSS and RSS
  too) at the first batch and at the last.
- ``scan``: ``ImageFolderDataset`` on a generated folder of ``folder_files`` empty ``.jpg`` files in
  ``folder_classes`` class directories: scanned (``data.scan_cache=false``), scanned and cached (first start),
  and from the cache (second start).
"""
from __future__ import annotations

import gc
import os
import statistics
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from paddletrain.bench.common import check_options, environment, finished
from paddletrain.config import allowed
from paddletrain.data.datasets import ImageDataset
from paddletrain.data.formats.label_list import LabelListDataset
from paddletrain.data.formats.sample_index import SampleIndex

# ImageNet-1k's training set.
IMAGENET_TRAIN = 1_281_167
_TINY_IMAGE = np.zeros((2, 2, 3), np.uint8)


@dataclass
class IndexBenchConfig:
    # Lines of the generated PaddleClas list (ImageNet-1k's training set by default) and its classes.
    lines: int = allowed(IMAGENET_TRAIN, ge=1)
    classes: int = allowed(1000, ge=1)
    # Timed repeats of the parse and of each scan arm (min and median are reported).
    repeats: int = allowed(3, ge=1)
    # Worker processes and batch size of the epoch whose worker memory is measured (0 workers skips it).
    workers: int = allowed(2, ge=0)
    batch_size: int = allowed(1024, ge=1)
    # The generated image folder: empty .jpg files in class directories (0 files skips the scan and the
    # existence check).
    folder_files: int = allowed(100_000, ge=0)
    folder_classes: int = allowed(1000, ge=1)


class TinyReader(LabelListDataset):
    """The real index-backed dataset, whose images are a constant 2x2 array once the path is looked up."""

    def load_image(self, index: int) -> np.ndarray:
        self.index.path(index)  # what a real reader does with the index, and all it does
        return _TINY_IMAGE


class TupleListReader(ImageDataset):
    """The baseline: samples as a Python list of ``(path, label)`` tuples (and ``targets`` a list of ints), as
    torchvision's ImageFolder keeps them; images as :class:`TinyReader`'s."""

    def __init__(self, samples: list[tuple[str, int]], classes: list[str]) -> None:
        super().__init__(None)
        self.samples = samples
        self.targets = [label for _, label in samples]
        self.classes = classes
        self.in_chans = 3

    def load_image(self, index: int) -> np.ndarray:
        path, _ = self.samples[index]  # the lookup a real reader makes: it writes the objects' reference counts
        return _TINY_IMAGE

    def describe(self, index: int) -> str:
        return self.samples[index][0]


def index_arrays(index: SampleIndex) -> tuple[np.ndarray, ...]:
    """The arrays a :class:`SampleIndex` keeps its samples in."""
    return index.path_bytes, index.offsets, index.labels


def write_list(path: Path, lines: int, classes: int) -> None:
    """An ImageNet-like PaddleClas list: ``train/n<class>/n<class>_<i>.JPEG <class>`` per line."""
    with open(path, "w") as f:
        for start in range(0, lines, 100_000):
            f.write("".join(f"train/n{i % classes:08d}/n{i % classes:08d}_{i}.JPEG {i % classes}\n"
                            for i in range(start, min(lines, start + 100_000))))


def write_empty_folder(root: Path, files: int, classes: int) -> list[str]:
    """``root/train/<class>/<i>.jpg`` empty files (and an empty ``val``); returns their relative paths."""
    relpaths = []
    for c in range(classes):
        (root / "train" / f"n{c:08d}").mkdir(parents=True)
    (root / "val").mkdir()
    for i in range(files):
        rel = f"train/n{i % classes:08d}/{i}.jpg"
        os.close(os.open(root / rel, os.O_CREAT | os.O_WRONLY, 0o644))
        relpaths.append(rel)
    # Dated an hour back: the scan cache does not keep a folder modified in its last seconds.
    past = time.time_ns() - 3600 * 10**9
    for directory, _, _ in os.walk(root):
        os.utime(directory, ns=(past, past))
    return relpaths


def tuple_list_bytes(samples: list[tuple[str, int]]) -> int:
    """The memory of a list of ``(path, label)`` tuples: the list, each tuple, each string, each int object
    (CPython shares the ints -5..256, so those count once)."""
    total = sys.getsizeof(samples)
    ints = {}
    for path, label in samples:
        total += sys.getsizeof((path, label)) + sys.getsizeof(path)
        ints[id(label)] = sys.getsizeof(label)
    return total + sum(ints.values())


def _timed(fn: Callable[[], Any]) -> tuple[float, Any]:
    start = time.perf_counter()
    result = fn()
    return time.perf_counter() - start, result


def pages_held_alone(pid: int, arrays: Sequence[np.ndarray]) -> int | None:
    """Bytes of ``arrays``' pages that process ``pid`` (forked from this one) holds alone, i.e. has copied.

    Read from ``/proc/<pid>/pagemap``: bit 63 says a page is present, bit 56 that only this process maps it.
    A page still shared with the main process is not counted, so unlike the worker's whole USS this sees only
    what reading these arrays cost it, not the pages its garbage collector or allocator touched elsewhere.
    ``None`` where the kernel does not let us read it.
    """
    page = os.sysconf("SC_PAGE_SIZE")
    held = 0
    try:
        with open(f"/proc/{pid}/pagemap", "rb") as pagemap:
            for array in arrays:
                if not array.nbytes:
                    continue
                first, last = array.ctypes.data // page, (array.ctypes.data + array.nbytes - 1) // page
                pagemap.seek(first * 8)
                entries = np.frombuffer(pagemap.read((last - first + 1) * 8), np.uint64)
                alone = (entries >> np.uint64(63)) & (entries >> np.uint64(56)) & np.uint64(1)
                held += int(alone.sum()) * page
    except OSError:
        return None
    return held


def worker_memory(dataset: Any, workers: int, batch_size: int,
                  arrays: Sequence[np.ndarray] = ()) -> list[dict[str, float]]:
    """Each worker's USS, PSS and RSS (MB) at the first and the last batch of one epoch of ``dataset``, and
    (``arrays_held_alone_mb``, where ``arrays`` are given) the MB of those arrays' pages it holds alone at the last
    batch (see :func:`pages_held_alone`)."""
    import psutil
    from omegaconf import OmegaConf

    from paddletrain.config import DataConfig
    from paddletrain.data import build_loader

    cfg = OmegaConf.structured(DataConfig(batch_size=batch_size, num_workers=workers, drop_last=False))
    loader = build_loader(dataset, cfg, train=True, seed=0)
    me = psutil.Process()
    others = {c.pid for c in me.children()}  # processes this one started before (a test runner's, say)
    last = len(loader) - 1
    before: dict[int, Any] = {}
    after: dict[int, Any] = {}
    held: dict[int, int | None] = {}
    for i, _ in enumerate(loader):  # the workers are alive until the loop ends
        if i in (0, last):
            (before if i == 0 else after).update({c.pid: c.memory_full_info() for c in me.children()
                                                  if c.pid not in others})
        if i == last and arrays:
            held = {pid: pages_held_alone(pid, arrays) for pid in after}
    rows = []
    for pid in sorted(before.keys() & after.keys()):
        row: dict[str, float] = {"pid": pid}
        if held.get(pid) is not None:
            row["arrays_held_alone_mb"] = held[pid] / 2**20
        for field in ("uss", "pss", "rss"):
            if hasattr(before[pid], field):
                row[f"{field}_start_mb"] = getattr(before[pid], field) / 2**20
                row[f"{field}_growth_mb"] = (getattr(after[pid], field) - getattr(before[pid], field)) / 2**20
        rows.append(row)
    return rows


def _epoch_rows(index: Any, classes: list[str], cfg: IndexBenchConfig) -> list[dict[str, Any]]:
    """Worker memory over one epoch for the index and for the tuple-list baseline (samples named as ImageFolder's)."""
    samples = [(index.path(i), int(label)) for i, label in enumerate(index.labels.tolist())]
    arms = {"SampleIndex": (TinyReader(index, classes), index.nbytes, index_arrays(index)),
            "list of (path, label)": (TupleListReader(samples, classes), tuple_list_bytes(samples), ())}
    rows = []
    for arm, (dataset, nbytes, arrays) in arms.items():
        gc.collect()
        for worker in worker_memory(dataset, cfg.workers, cfg.batch_size, arrays):
            rows.append({"samples held as": arm, "size_mb": nbytes / 2**20, **{k: v for k, v in worker.items()
                                                                             if k != "pid"},
                         "uss_growth_vs_size": worker["uss_growth_mb"] / (nbytes / 2**20)})
    del samples, arms
    return rows


def _scan_rows(root: Path, cfg: IndexBenchConfig) -> list[dict[str, Any]]:
    """ImageFolderDataset's start on the generated folder: scanned, scanned and cached, from the cache."""
    from paddletrain.data.formats.imagefolder import ImageFolderDataset
    from paddletrain.data.formats.scancache import CACHE_DIR_ENV

    os.environ[CACHE_DIR_ENV] = str(root.parent / "cache")
    first, _ = _timed(lambda: ImageFolderDataset(root, "train"))  # scans and writes the cache
    scanned, cached = [], []
    for _ in range(cfg.repeats):  # interleaved, so drift hits both alike
        scanned.append(_timed(lambda: ImageFolderDataset(root, "train", scan_cache=False))[0])
        cached.append(_timed(lambda: ImageFolderDataset(root, "train"))[0])
    fresh = ImageFolderDataset(root, "train", scan_cache=False)
    reused = ImageFolderDataset(root, "train")
    same = bool(np.array_equal(fresh.index.path_bytes, reused.index.path_bytes)
                and np.array_equal(fresh.index.labels, reused.index.labels))
    return [{"measure": "scan, data.scan_cache=false", "min_s": min(scanned), "median_s": statistics.median(scanned)},
            {"measure": "first start: scan + write the cache", "min_s": first, "median_s": first},
            {"measure": "second start: from the cache", "min_s": min(cached), "median_s": statistics.median(cached),
             "vs_scan": statistics.median(s / c for s, c in zip(scanned, cached, strict=True)),
             "same_index": same}]


def run_index(cfg: IndexBenchConfig) -> dict[str, Any]:
    """Parse time, index memory, worker memory over an epoch and the scan cache, at ImageNet's size."""
    from paddletrain.data.formats.label_list_file import read_label_list

    check_options(cfg, "index")
    env = environment()
    rows: list[dict[str, Any]] = []
    with tempfile.TemporaryDirectory(prefix="paddletrain-bench-index-") as tmp:
        tmp_path = Path(tmp)
        write_list(tmp_path / "list.txt", cfg.lines, cfg.classes)
        parses = []
        for _ in range(cfg.repeats):
            seconds, found = _timed(lambda: read_label_list(tmp_path / "list.txt", tmp_path, key="list",
                                                            check_files=False))
            parses.append(seconds)
        rows.append({"measure": f"parse {cfg.lines} lines, check_files=False", "min_s": min(parses),
                     "median_s": statistics.median(parses)})
        index, classes = found.index, [str(i) for i in range(found.num_classes)]
        del found
        if cfg.folder_files:
            root = tmp_path / "folder"
            relpaths = write_empty_folder(root, cfg.folder_files, cfg.folder_classes)
            (root / "list.txt").write_text("".join(f"{p} {i % cfg.folder_classes}\n" for i, p in enumerate(relpaths)))
            checks = [_timed(lambda: read_label_list(root / "list.txt", root, key="list"))[0]
                      - _timed(lambda: read_label_list(root / "list.txt", root, key="list", check_files=False))[0]
                      for _ in range(cfg.repeats)]
            per_million = [c / cfg.folder_files * 1e6 for c in checks]
            rows.append({"measure": f"existence checks of {cfg.folder_files} files, per million lines",
                         "min_s": min(per_million), "median_s": statistics.median(per_million)})
            rows += _scan_rows(root, cfg)
        samples = [(index.path(i), int(label)) for i, label in enumerate(index.labels.tolist())]
        memory = {"index_mb": index.nbytes / 2**20, "tuple_list_mb": tuple_list_bytes(samples) / 2**20}
        del samples
        memory["tuple_list_vs_index"] = memory["tuple_list_mb"] / memory["index_mb"]
        workers = _epoch_rows(index, classes, cfg) if cfg.workers else []
    parse = rows[0]["median_s"]
    goals = [{"goal": f"parse {IMAGENET_TRAIN} lines < 5 s (median)", "measured": parse, "met": parse < 5}] \
        if cfg.lines >= IMAGENET_TRAIN else []
    index_growth = [w["uss_growth_vs_size"] for w in workers if w["samples held as"] == "SampleIndex"]
    if index_growth:
        goals.append({"goal": "each worker's USS grows < 10% of the index over an epoch",
                      "measured": max(index_growth), "met": max(index_growth) < 0.1})
    return {"benchmark": "index", "config": vars(cfg), "environment": finished(env), "rows": rows,
            "pipeline": workers, "summary": memory, "goals": goals,
            "notes": ["worker memory: USS is what the worker holds alone (pages it wrote); RSS also counts the "
                      "pages it shares with the main process; measured at the first and the last batch; "
                      "arrays_held_alone_mb: the index's own pages the worker has copied, at the last batch"]}
