"""``data=shards``: a dataset of WebDataset-layout tar shards, local or over HTTP(S), read by offset.

Each sample is one seek into its shard: the index (``pack``'s, or one built by scanning the shards at start-up)
says where each image's bytes are. A local shard is read in place; a remote one is first copied whole into the
bounded cache (:mod:`paddletrain.data.shards.cache`). The epoch's order is the dataset's own
(:mod:`paddletrain.data.shards.order`, used by the samplers through :meth:`ShardDataset.epoch_order`): shards
shuffled, then samples shuffled within windows of ``data.shuffle_buffer`` samples, so reads stay within a window's
shards. Everything else — transforms, seeded augmentation, the samplers (class balance included), multi-label
rows, ``data.bad_sample_policy``, resuming mid-epoch — is the loaders' own, as for every dataset.

Memory does not grow with the data set: per sample the dataset holds its offset, size and label in NumPy arrays
and its key in one byte buffer (shared by forked workers without copying), and a loader worker holds at most
``MAX_OPEN_SHARDS`` open files, never a sample it has handed on.
"""
from __future__ import annotations

import hashlib
import logging
import os
from collections import OrderedDict
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
from PIL import Image

from paddletrain.data.datasets import (
    BadSampleError,
    DatasetError,
    DatasetSplits,
    ImageDataset,
    Transform,
    register_dataset,
)
from paddletrain.data.formats.class_names import read_names_file
from paddletrain.data.formats.images import ImageReadError, decode_image
from paddletrain.data.formats.sample_index import SampleIndex
from paddletrain.data.formats.scancache import cache_root
from paddletrain.data.shards import order as shard_order
from paddletrain.data.shards.cache import ShardCache, ShardChecksumError
from paddletrain.data.shards.index import MAX_INDEX_BYTES, ShardEntry, ShardIndex, ShardIndexError
from paddletrain.data.shards.layout import DEFAULT_MAX_MEMBER_BYTES, scan_shard
from paddletrain.data.shards.pack import index_name
from paddletrain.data.shards.prefetch import FetchAhead
from paddletrain.data.shards.source import (
    FetchPolicy,
    ShardFetchError,
    base_name,
    exists,
    expand_urls,
    is_remote,
    local_path,
    read_bytes,
    sibling,
)
from paddletrain.errors import ConfigError

log = logging.getLogger("paddletrain")

# Open shard files a process keeps (least recently used closed first).
MAX_OPEN_SHARDS = 16
DEFAULT_SHUFFLE_BUFFER = 10_000
# Remote shards copied ahead of the one being read (0: each is fetched when a reader first needs it).
DEFAULT_FETCH_AHEAD = 2


class ShardDataset(ImageDataset):
    """The samples of ``shards`` (``(url, entry)`` pairs, in order), decoded to RGB or grayscale (``in_chans``)."""

    def __init__(self, shards: Sequence[tuple[str, ShardEntry]], classes: Sequence[str], *, multilabel: bool = False,
                 in_chans: int = 3, transform: Transform = None, cache: ShardCache | None = None,
                 shuffle_buffer: int = DEFAULT_SHUFFLE_BUFFER, fetch_ahead: int = DEFAULT_FETCH_AHEAD) -> None:
        super().__init__(transform)
        if in_chans not in (1, 3):
            raise DatasetError(f"shards in_chans must be 1 or 3, got {in_chans}")
        if any(is_remote(url) for url, _ in shards) and cache is None:
            raise DatasetError("remote shards need a cache (data.cache_dir)")
        self.urls = [url for url, _ in shards]
        self.checksums = [(entry.sha256, entry.bytes) for _, entry in shards]
        self.classes = list(classes)
        self.in_chans = in_chans
        self.cache = cache
        self.shuffle_buffer = int(shuffle_buffer)
        self.ahead = int(fetch_ahead)
        samples = [sample for _, entry in shards for sample in entry.samples]
        self.counts = np.array([len(entry.samples) for _, entry in shards], np.int64)
        self.starts = shard_order.shard_starts(self.counts)
        self.offsets = np.array([s.offset for s in samples], np.int64)
        self.sizes = np.array([s.size for s in samples], np.int64)
        labels = np.array([s.label for s in samples], np.uint8 if multilabel else np.int64)
        if multilabel and labels.ndim != 2:
            labels = labels.reshape(len(samples), len(self.classes))
        # The keys as a SampleIndex's "paths": one byte buffer, shared by forked workers.
        self.keys = SampleIndex.build("", [s.key for s in samples], labels)
        self.targets = self.keys.labels
        self._open: OrderedDict[int, int] = OrderedDict()  # shard number -> file descriptor
        self._pid = os.getpid()
        self._refused: dict[int, str] = {}
        # Shards whose fetch gave up, with why: their other samples fail at once rather than fetch again.
        self._unreachable: dict[int, str] = {}

    @property
    def multilabel(self) -> bool:
        return self.keys.multilabel

    def shard_of(self, index: int) -> int:
        """The number of the shard holding sample ``index``."""
        return int(np.searchsorted(self.starts, index, side="right") - 1)

    def describe(self, index: int) -> str:
        return f"{self.urls[self.shard_of(index)]}#{self.keys.relpath(index)}"

    @property
    def order_key(self) -> str:
        """What the epoch order depends on besides (seed, epoch): the samplers save it, and refuse to continue an
        epoch mid-way under another one (a changed ``data.shuffle_buffer``, or other shards)."""
        digest = hashlib.sha256(self.counts.astype("<i8").tobytes()).hexdigest()[:12]
        return f"shards:{digest}:buffer={self.shuffle_buffer}"

    def epoch_order(self, seed: int, epoch: int, weights: np.ndarray | None = None) -> np.ndarray:
        """The epoch's global order (:func:`paddletrain.data.shards.order.epoch_order`); the samplers call it."""
        return shard_order.epoch_order(self.counts, seed, epoch, self.shuffle_buffer, weights=weights)

    def fetch_ahead(self, indices: Sequence[int]) -> FetchAhead | None:
        """Start copying the remote shards that ``indices`` (the samples about to be dealt, in order) read, at
        most ``data.fetch_ahead`` shards beyond the one being dealt (:mod:`paddletrain.data.shards.prefetch`);
        None when no shard is remote or fetch-ahead is off. The batch sampler calls it once per epoch."""
        if not self.ahead or self.cache is None or not len(indices) or not any(is_remote(u) for u in self.urls):
            return None
        shards = np.searchsorted(self.starts, np.asarray(indices, np.int64), side="right") - 1
        unique, first = np.unique(shards, return_index=True)
        touched = [(int(first[i]), int(unique[i])) for i in np.argsort(first, kind="stable")
                   if is_remote(self.urls[int(unique[i])])]
        return FetchAhead(self._copy, [shard for _, shard in touched], [at for at, _ in touched], self.ahead)

    def _copy(self, shard: int) -> None:
        """Fetch-ahead's copy: none when a reader (or another thread) is copying the shard already."""
        sha256, size = self.checksums[shard]
        self.cache.path(self.urls[shard], sha256, size, wait=False)

    def load_image(self, index: int) -> Image.Image:
        shard = self.shard_of(index)
        offset, size = int(self.offsets[index]), int(self.sizes[index])
        data = self._read(shard, offset, size, index)
        if len(data) != size:
            raise BadSampleError(f"{self.describe(index)}: the shard ends at byte {offset + len(data)}, inside "
                                 f"this image (bytes {offset}..{offset + size}): truncated", index,
                                 self.describe(index))
        try:
            return decode_image(data, "L" if self.in_chans == 1 else "RGB")
        except ImageReadError as exc:
            raise BadSampleError(f"cannot decode {self.describe(index)}: {exc}", index, self.describe(index)) from exc

    def __getitem__(self, index: int):
        if not self.multilabel:
            return super().__getitem__(index)
        index = self._check_index(index)
        image = self.load_image(index)
        return (self.transform(image) if self.transform is not None else image), \
            self.targets[index].astype(np.float32)

    def _read(self, shard: int, offset: int, size: int, index: int) -> bytes:
        if os.getpid() != self._pid:  # a forked worker: its descriptors are its own from here on
            self._open = OrderedDict()
            self._pid = os.getpid()
        if shard in self._refused:
            raise BadSampleError(self._refused[shard], index, self.describe(index))
        if shard in self._unreachable:  # its fetch gave up: the shard's other samples do not ask again
            raise ShardFetchError(self._unreachable[shard])
        fd = self._open.get(shard)
        if fd is None:
            fd = self._open_shard(shard, index)
        else:
            self._open.move_to_end(shard)
        return os.pread(fd, size, offset)

    def _open_shard(self, shard: int, index: int) -> int:
        url = self.urls[shard]
        sha256, size = self.checksums[shard]
        for attempt in range(3):
            try:
                path = self.cache.path(url, sha256, size) if is_remote(url) and self.cache else local_path(url)
                fd = os.open(path, os.O_RDONLY | getattr(os, "O_CLOEXEC", 0))
                break
            except ShardChecksumError as exc:  # every sample of the shard is refused, by data.bad_sample_policy
                self._refused[shard] = str(exc)
                raise BadSampleError(str(exc), index, self.describe(index)) from None
            except ShardFetchError as exc:  # the fetch retried all it may (data.retries, data.deadline)
                self._unreachable[shard] = str(exc)
                raise
            except FileNotFoundError as exc:  # a local shard gone, or a copy evicted between the check and the open
                if not is_remote(url) or attempt == 2:
                    raise BadSampleError(f"cannot open shard {url}: {exc}", index, self.describe(index)) from None
        self._open[shard] = fd
        while len(self._open) > MAX_OPEN_SHARDS:
            _, old = self._open.popitem(last=False)
            os.close(old)
        return fd

    def __getstate__(self) -> dict[str, Any]:  # spawned workers open their own files
        state = dict(self.__dict__)
        state["_open"] = OrderedDict()
        return state


def _entries(urls: list[str], index: ShardIndex | None, cache: ShardCache, *, key: str, multilabel: bool,
             num_classes: int | None, policy: str, max_member_bytes: int) -> tuple[list[tuple[str, ShardEntry]], int]:
    """Each URL with its index entry; a shard the index does not list is scanned (through the cache if remote).

    Returns the pairs and the number of samples left out as unreadable (``policy`` "skip"; "fail" raises).
    """
    pairs, skipped = [], 0
    for url in urls:
        entry = index.entry(base_name(url)) if index is not None else None
        if entry is not None:
            pairs.append((url, entry))
            continue
        path = cache.path(url) if is_remote(url) else local_path(url)
        try:
            with open(path, "rb") as file:
                scan = scan_shard(file, os.fstat(file.fileno()).st_size, num_classes=num_classes,
                                  multilabel=multilabel, max_member_bytes=max_member_bytes)
        except OSError as exc:
            raise DatasetError(f"{key}: cannot read shard {url}: {exc}") from None
        if scan.problems:
            first = scan.problems[0]
            if policy == "fail":
                more = f" (and {len(scan.problems) - 1} more)" if len(scan.problems) > 1 else ""
                raise DatasetError(f"{key}: shard {url}: {first}{more}. Fix the shard, or set "
                                   "data.bad_sample_policy=skip to leave such samples out.")
            skipped += len(scan.problems)
            log.warning("%s: shard %s: %d samples left out (data.bad_sample_policy=skip), e.g. %s", key, url,
                        len(scan.problems), first)
        pairs.append((url, ShardEntry(base_name(url), None, None, scan.samples)))
    return pairs, skipped


def _read_index(where: str | None, urls: list[str], policy: FetchPolicy, key: str) -> ShardIndex | None:
    """The index named by ``where``, else ``<prefix>.index.json`` beside the first shard if it is there."""
    if where is None:
        first = base_name(urls[0])
        prefix = first.rsplit("-", 1)[0] if "-" in first else first.rsplit(".", 1)[0]
        candidate = sibling(urls[0], index_name(prefix))
        try:
            if not exists(candidate, policy):
                log.info("%s: no %s beside the shards: scanning them", key, index_name(prefix))
                return None
        except ShardFetchError:
            return None
        where = candidate
    try:
        return ShardIndex.from_bytes(read_bytes(where, max_bytes=MAX_INDEX_BYTES, policy=policy),
                                     f"shard index {where!r}")
    except ShardFetchError as exc:
        raise ShardIndexError(f"{key}: {exc}") from None


def _option(value: Any, key: str, kind: type, minimum: float | None = None) -> Any:
    ok = isinstance(value, kind) and not isinstance(value, bool) if kind is not bool else isinstance(value, bool)
    if kind is float and isinstance(value, int) and not isinstance(value, bool):
        value, ok = float(value), True
    if not ok or (minimum is not None and value < minimum):
        bound = f" >= {minimum:g}" if minimum is not None else ""
        raise ConfigError(f"data.{key}={value!r} must be a {kind.__name__}{bound}")
    return value


@register_dataset("shards", eval_sources={"urls": "val_urls", "index": "val_index"})
def build_shards(cfg: Any, train_transform: Transform, eval_transform: Transform, *,
                 urls: str | list[str] | None = None, val_urls: str | list[str] | None = None,
                 index: str | None = None, val_index: str | None = None, cache_dir: str | None = None,
                 cache_max_gb: float = 20.0, shuffle_buffer: int = DEFAULT_SHUFFLE_BUFFER, in_chans: int = 3,
                 timeout: float = 15.0, retries: int = 5, deadline: float = 120.0,
                 max_member_mb: float = DEFAULT_MAX_MEMBER_BYTES / 1024**2,
                 fetch_ahead: int = DEFAULT_FETCH_AHEAD) -> DatasetSplits:
    """``data.name=shards``: ``data.urls`` (training) and ``data.val_urls`` (validation), each a brace pattern
    or a list of them, local paths or HTTP(S) URLs; see docs/data.md#tar-shards."""
    if not urls or not val_urls:
        raise ConfigError("data=shards reads data.urls (training shards) and data.val_urls (validation shards), "
                          "e.g. \"data.urls='/data/train-{000000..000009}.tar'\" data.val_urls=/data/val-000000.tar")
    shuffle_buffer = _option(shuffle_buffer, "shuffle_buffer", int, 1)
    fetch_ahead = _option(fetch_ahead, "fetch_ahead", int, 0)
    in_chans = _option(in_chans, "in_chans", int, 1)
    policy = FetchPolicy(timeout=_option(timeout, "timeout", float, 0.001), retries=_option(retries, "retries", int, 0),
                         deadline=_option(deadline, "deadline", float, 0.0))
    max_bytes = int(_option(cache_max_gb, "cache_max_gb", float, 1e-9) * 1024**3)
    max_member = int(_option(max_member_mb, "max_member_mb", float, 1e-6) * 1024**2)
    for key, value in (("index", index), ("val_index", val_index), ("cache_dir", cache_dir)):
        if value is not None and not isinstance(value, str):
            raise ConfigError(f"data.{key}={value!r} must be a path (or null)")
    cache = ShardCache(Path(cache_dir) if cache_dir else cache_root() / "shards", max_bytes, policy)
    splits = []
    names = None
    if getattr(cfg, "class_names", None):
        names = read_names_file(cfg.class_names, f"data.class_names={cfg.class_names!r}", DatasetError)
    multilabel = bool(getattr(cfg, "multilabel", False))
    for key, spec, index_key, where, transform in (("data.urls", urls, "data.index", index, train_transform),
                                                   ("data.val_urls", val_urls, "data.val_index", val_index,
                                                    eval_transform)):
        expanded = expand_urls(spec, key)
        found = _read_index(where, expanded, policy, index_key)
        if found is not None:
            names = names or found.classes
            if found.multilabel != multilabel:  # the loss, metrics and exports follow data.multilabel
                raise ConfigError(f"{key}: the shards' index is {'multi' if found.multilabel else 'single'}-label, "
                                  f"but data.multilabel={str(multilabel).lower()}; set data.multilabel="
                                  f"{str(found.multilabel).lower()}")
        pairs, _ = _entries(expanded, found, cache, key=key, multilabel=multilabel,
                            num_classes=len(names) if names else None, policy=cfg.bad_sample_policy,
                            max_member_bytes=max_member)
        if not any(entry.samples for _, entry in pairs):
            raise DatasetError(f"{key}: the shards hold no sample ({len(pairs)} shards)")
        splits.append((pairs, transform))
    if names is None:  # shards without an index or data.class_names: the labels say how many classes
        labels = [s.label for pairs, _ in splits for _, e in pairs for s in e.samples]
        count = len(labels[0]) if multilabel else 1 + max(labels)  # type: ignore[arg-type, type-var]
        names = [str(i) for i in range(count)]
    train, val = (ShardDataset(pairs, names, multilabel=multilabel, in_chans=in_chans, transform=transform,
                               cache=cache, shuffle_buffer=shuffle_buffer, fetch_ahead=fetch_ahead)
                  for pairs, transform in splits)
    log.info("data=shards: %d training samples in %d shards, %d validation samples in %d shards", len(train),
             len(train.urls), len(val), len(val.urls))
    return DatasetSplits.of(train, val)
