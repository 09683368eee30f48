"""The index of a set of shards: class names, and per shard its checksum, size and samples (key, offset, label).

``python -m paddletrain.data pack`` writes it as ``index.json`` beside the shards; ``data=shards`` reads it (or,
for shards written by another tool, scans the shards at start-up and builds the same thing). With each image's
byte offset in the index, a sample is read with one seek into a shard held on disk, whatever order the epoch asks.

The file may come from someone else: it is read with a size bound, must be plain JSON of the shape below, and a
shard name in it is a plain file name (no ``/``, no ``..``), looked up beside the index or in ``data.urls``::

    {"format": "paddletrain-shards", "version": 1, "classes": ["ants", "bees"], "multilabel": false,
     "shards": [{"name": "train-000000.tar", "sha256": "...", "bytes": 1048576,
                 "samples": [["ants/0013035", "jpg", 1536, 43210, 0], ...]}]}

A sample row is ``[key, image extension, image offset, image size, label]``, the label a class index or (multi-label)
a list of 0/1.
"""
from __future__ import annotations

import json
import os
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from paddletrain.data.errors import DatasetError
from paddletrain.data.shards.layout import IMAGE_EXTENSIONS, Sample

INDEX_FORMAT = "paddletrain-shards"
INDEX_VERSION = 1
INDEX_NAME = "index.json"
# About 80 bytes a sample: 25 M samples. Larger is not an index anyone wrote for this.
MAX_INDEX_BYTES = 2 * 1024**3


class ShardIndexError(DatasetError):
    """An index file that is not what ``pack`` writes; the message names the file and the field."""


@dataclass
class ShardEntry:
    """One shard of an index: its file name, checksum and size (None when unknown), and its samples in order."""

    name: str
    sha256: str | None
    bytes: int | None
    samples: list[Sample] = field(default_factory=list)


@dataclass
class ShardIndex:
    """The classes and shards of one split."""

    classes: list[str]
    multilabel: bool
    shards: list[ShardEntry]

    @property
    def num_samples(self) -> int:
        return sum(len(s.samples) for s in self.shards)

    def entry(self, name: str) -> ShardEntry | None:
        """The shard called ``name`` (a base name), or None."""
        return next((s for s in self.shards if s.name == name), None)

    def to_json(self) -> dict[str, Any]:
        return {"format": INDEX_FORMAT, "version": INDEX_VERSION, "classes": list(self.classes),
                "multilabel": self.multilabel,
                "shards": [{"name": s.name, "sha256": s.sha256, "bytes": s.bytes,
                            "samples": [[x.key, x.image_ext, x.offset, x.size, x.label] for x in s.samples]}
                           for s in self.shards]}

    def write(self, path: str | Path) -> None:
        """Write the index to ``path`` whole or not at all (a temporary file renamed over it)."""
        path = Path(path)
        fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", dir=path.parent)
        try:
            with os.fdopen(fd, "w", encoding="utf-8") as file:
                json.dump(self.to_json(), file, separators=(",", ":"))
            os.replace(tmp, path)
        except BaseException:
            os.unlink(tmp)
            raise

    @classmethod
    def from_bytes(cls, data: bytes, where: str) -> ShardIndex:
        """Parse and check an index; ``where`` names it in every error.

        Raises:
            ShardIndexError: not JSON, another format or version, or a field of the wrong type or value.
        """
        try:
            raw = json.loads(data)
        except (ValueError, UnicodeDecodeError) as exc:
            raise ShardIndexError(f"{where} is not a JSON shard index: {exc}") from None
        return _parse(raw, where)

    @classmethod
    def read(cls, path: str | Path) -> ShardIndex:
        """Read the index file at ``path`` (size-bounded)."""
        path = Path(path)
        where = f"shard index {str(path)!r}"
        try:
            size = path.stat().st_size
            if size > MAX_INDEX_BYTES:
                raise ShardIndexError(f"{where} is {size} bytes, more than the {MAX_INDEX_BYTES} an index may be")
            return cls.from_bytes(path.read_bytes(), where)
        except OSError as exc:
            raise ShardIndexError(f"cannot read {where}: {exc}") from None


def plain_shard_name(name: Any) -> bool:
    """A shard name an index may hold: a non-empty file name without a directory, ``..`` or control characters."""
    return (isinstance(name, str) and bool(name) and "/" not in name and "\\" not in name and name not in (".", "..")
            and not any(ord(c) < 32 for c in name))


def _parse(raw: Any, where: str) -> ShardIndex:
    def fail(what: str) -> ShardIndexError:
        return ShardIndexError(f"{where}: {what}")

    if not isinstance(raw, dict) or raw.get("format") != INDEX_FORMAT:
        raise fail(f"not a paddletrain shard index (no \"format\": \"{INDEX_FORMAT}\")")
    if raw.get("version") != INDEX_VERSION:
        raise fail(f"version {raw.get('version')!r}; this paddletrain reads version {INDEX_VERSION}")
    classes = raw.get("classes")
    if not isinstance(classes, list) or not classes or not all(isinstance(c, str) for c in classes):
        raise fail("\"classes\" must be a non-empty list of class names")
    multilabel = raw.get("multilabel", False)
    if not isinstance(multilabel, bool):
        raise fail("\"multilabel\" must be true or false")
    shards = raw.get("shards")
    if not isinstance(shards, list):
        raise fail("\"shards\" must be a list")
    entries = []
    seen: set[str] = set()
    for i, shard in enumerate(shards):
        entry = _shard(shard, f"shards[{i}]", len(classes), multilabel, fail)
        if entry.name in seen:
            raise fail(f"shards[{i}].name {entry.name!r} is listed twice")
        seen.add(entry.name)
        entries.append(entry)
    return ShardIndex(list(classes), multilabel, entries)


def _shard(shard: Any, at: str, num_classes: int, multilabel: bool, fail: Any) -> ShardEntry:
    if not isinstance(shard, dict) or not plain_shard_name(shard.get("name")):
        raise fail(f"{at}.name must be a plain file name (no folder, no '..')")
    digest, size = shard.get("sha256"), shard.get("bytes")
    if digest is not None and not (isinstance(digest, str) and len(digest) == 64
                                   and all(c in "0123456789abcdef" for c in digest)):
        raise fail(f"{at}.sha256 must be 64 lower-case hex digits or null")
    if size is not None and not _count(size):
        raise fail(f"{at}.bytes must be a non-negative integer or null")
    rows = shard.get("samples")
    if not isinstance(rows, list):
        raise fail(f"{at}.samples must be a list")
    samples = [_sample(row, f"{at}.samples[{j}]", num_classes, multilabel, size, fail) for j, row in enumerate(rows)]
    return ShardEntry(shard["name"], digest, size, samples)


def _count(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value >= 0


def _sample(row: Any, at: str, num_classes: int, multilabel: bool, shard_bytes: int | None, fail: Any) -> Sample:
    if not isinstance(row, list) or len(row) != 5:
        raise fail(f"{at} must be [key, extension, offset, size, label]")
    key, ext, offset, size, label = row
    if not isinstance(key, str) or not key:
        raise fail(f"{at}: the key must be a non-empty string")
    if ext not in IMAGE_EXTENSIONS:
        raise fail(f"{at}: image extension {ext!r} is not one of {', '.join(IMAGE_EXTENSIONS)}")
    if not (_count(offset) and _count(size)) or (shard_bytes is not None and offset + size > shard_bytes):
        raise fail(f"{at}: offset and size must be non-negative integers within the shard")
    if multilabel:
        if not (isinstance(label, list) and len(label) == num_classes and all(v in (0, 1) and not isinstance(v, bool)
                                                                              for v in label)):
            raise fail(f"{at}: a multi-label row needs {num_classes} values of 0 or 1")
    elif not (_count(label) and label < num_classes):
        raise fail(f"{at}: label {label!r} is not a class index below {num_classes}")
    return Sample(key, ext, offset, size, label)
