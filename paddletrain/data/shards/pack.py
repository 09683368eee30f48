"""Packing an image folder or a label list into WebDataset-layout tar shards with an index.

``python -m paddletrain.data pack <input> --out <dir> --shard-size <MB>`` calls :func:`pack`. The input is read as
training reads it (``data=imagefolder``'s confined scan, or a label list checked like ``data=labellist``'s);
every image is stored as the file it was (no re-encoding), with its label beside it:

- ``<key>.<ext>`` the image's bytes, ``<key>.cls`` its class index as text, or, for a multi-label list,
  ``<key>.json`` its multi-hot row;
- the key is the image's path relative to the input without its extension (a dot in a file name becomes ``_``,
  since WebDataset cuts the key at the first dot), made unique with ``_<n>`` where two paths collide;
- the order is seeded and stratified: each class is shuffled by ``(seed, class)`` and the classes interleaved by
  their share, so every shard holds every class in about its share of the data (a shard-level shuffle then
  mixes well);
- a shard closes before it would pass ``shard_size`` bytes (it always holds at least one sample); members carry
  no owner and the time 0, so the same input and seed pack to the same bytes and checksums;
- each shard is written to a temporary name and renamed when complete; the index (``<prefix>.index.json``: each
  shard's sha256, size and samples with their offsets, read back from the written shard) comes last.

A root with ``train/`` and ``val/`` folders packs both, as ``train-*.tar`` and ``val-*.tar``.
"""
from __future__ import annotations

import logging
import os
import tarfile
import time
import zlib
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from paddletrain.data.errors import DatasetError
from paddletrain.data.formats import folder_scan
from paddletrain.data.formats.class_names import read_names_file
from paddletrain.data.formats.label_list_file import read_label_list
from paddletrain.data.shards.cache import file_sha256
from paddletrain.data.shards.index import ShardEntry, ShardIndex
from paddletrain.data.shards.layout import IMAGE_EXTENSIONS, member_bytes, member_info, scan_shard, write_member
from paddletrain.errors import UserError

log = logging.getLogger("paddletrain")

DEFAULT_SHARD_MB = 256.0


def _archive_bytes(members: int) -> int:
    """The size of a tar file whose members take ``members`` bytes: two zero blocks end it, and tarfile pads the
    whole to a multiple of its record size."""
    return -(-(members + 2 * tarfile.BLOCKSIZE) // tarfile.RECORDSIZE) * tarfile.RECORDSIZE


@dataclass
class PackedSplit:
    """One split written by :func:`pack`: its index file, shard files, sample count and packing speed."""

    prefix: str
    index_path: Path
    shards: list[Path]
    samples: int
    seconds: float

    @property
    def images_per_second(self) -> float:
        return self.samples / self.seconds if self.seconds > 0 else float("inf")


@dataclass
class PackResult:
    splits: list[PackedSplit] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)


@dataclass
class _Item:
    path: str
    relpath: str
    label: int | list[int]


def index_name(prefix: str) -> str:
    """The index file of the shards ``<prefix>-NNNNNN.tar``."""
    return f"{prefix}.index.json"


def stratified_order(labels: Sequence[int], seed: int, class_names: Sequence[str]) -> np.ndarray:
    """A seeded order of sample numbers in which every class is spread evenly through the whole sequence.

    Class ``c``'s samples are shuffled by ``(seed, CRC-32 of its name)``; its ``k``-th sample of ``n_c`` is placed at
    ``(k + u) / n_c`` for a seeded ``u`` in [0, 1); sorting by place interleaves the classes by their share.
    """
    labels = np.asarray(labels, np.int64)
    places = np.zeros(len(labels), np.float64)
    for c in np.unique(labels):
        members = np.flatnonzero(labels == c)
        name = class_names[c] if c < len(class_names) else str(c)
        rng = np.random.default_rng([seed, zlib.crc32(name.encode("utf-8", "surrogateescape"))])
        members = members[rng.permutation(len(members))]
        places[members] = (np.arange(len(members)) + rng.random(len(members))) / len(members)
    return np.lexsort((np.arange(len(labels)), places))


def _keys(relpaths: Sequence[str]) -> list[str]:
    keys, used = [], set()
    for relpath in relpaths:
        head, _, base = relpath.replace(os.sep, "/").rpartition("/")
        stem = base.rsplit(".", 1)[0].replace(".", "_") or "image"
        key = f"{head}/{stem}" if head else stem
        unique, n = key, 1
        while unique in used:
            unique, n = f"{key}_{n}", n + 1
        used.add(unique)
        keys.append(unique)
    return keys


def _folder_items(folder: Path) -> tuple[list[str], list[_Item], list[str]]:
    classes, contents, warnings = folder_scan.scan_class_folder(folder)
    items = [_Item(path, os.path.relpath(path, folder), int(label)) for path, label in contents.samples]
    return classes, items, warnings


def _list_items(list_file: Path, root: Path, class_names: str | None, multilabel: bool,
                delimiter: str) -> tuple[list[str], list[_Item]]:
    names = read_names_file(class_names, f"--class-names {class_names!r}") if class_names else None
    try:
        listed = read_label_list(list_file, root, key="pack", delimiter=delimiter, multilabel=multilabel,
                                 num_classes=len(names) if names else None)
    except DatasetError as exc:
        raise UserError(str(exc)) from exc
    index = listed.index
    items = []
    for i in range(len(index)):
        path = index.path(i)
        label = index.labels[i]
        items.append(_Item(path, os.path.relpath(path, root),
                           [int(v) for v in label] if multilabel else int(label)))
    classes = names or [str(i) for i in range(listed.num_classes)]
    return classes, items


def _write_split(items: list[_Item], classes: list[str], multilabel: bool, out: Path, prefix: str,
                 shard_bytes: int, seed: int) -> PackedSplit:
    started = time.monotonic()
    labels = [0 if multilabel else item.label for item in items]  # multi-label rows: no strata, keys still seeded
    order = stratified_order(labels, seed, classes)  # type: ignore[arg-type]
    items = [items[i] for i in order]
    keys = _keys([item.relpath for item in items])
    shards: list[Path] = []
    entries: list[ShardEntry] = []
    archive: tarfile.TarFile | None = None
    part: Path | None = None
    held = 0

    def close() -> None:
        nonlocal archive, part
        if archive is None or part is None:
            return
        archive.close()
        final = out / f"{prefix}-{len(shards):06d}.tar"
        os.replace(part, final)
        shards.append(final)
        size = final.stat().st_size
        with open(final, "rb") as file:
            scan = scan_shard(file, size, num_classes=len(classes), multilabel=multilabel)
        if scan.problems:  # what was just written reads back wrong: a bug, not the user's data
            raise RuntimeError(f"{final} does not read back: {scan.problems[0]}")
        entries.append(ShardEntry(final.name, file_sha256(final), size, scan.samples))
        archive, part = None, None

    for item, key in zip(items, keys, strict=True):
        ext = item.relpath.rsplit(".", 1)[-1].lower()
        if ext not in IMAGE_EXTENSIONS:  # the scan and the list check let only image files through
            raise UserError(f"{item.path!r} is not named as an image ({', '.join(IMAGE_EXTENSIONS)})")
        try:
            with open(item.path, "rb") as file:
                data = file.read()
        except OSError as exc:
            raise UserError(f"cannot read {item.path!r}: {exc}") from None
        label = (str(item.label) if not multilabel else "[" + ",".join(map(str, item.label)) + "]").encode()
        image_info = member_info(f"{key}.{ext}", len(data))
        label_info = member_info(f"{key}.{'json' if multilabel else 'cls'}", len(label))
        if archive is None:
            part = out / f".{prefix}-{len(shards):06d}.tar.part"
            archive = tarfile.open(part, "w", format=tarfile.PAX_FORMAT)
            held = 0
        need = member_bytes(image_info, archive) + member_bytes(label_info, archive)
        if held and _archive_bytes(held + need) > shard_bytes:
            close()
            part = out / f".{prefix}-{len(shards):06d}.tar.part"
            archive = tarfile.open(part, "w", format=tarfile.PAX_FORMAT)
            held = 0
        write_member(archive, image_info, data)
        write_member(archive, label_info, label)
        held += need
    close()
    index_path = out / index_name(prefix)
    ShardIndex(list(classes), multilabel, entries).write(index_path)
    return PackedSplit(prefix, index_path, shards, len(items), time.monotonic() - started)


def _splits(source: Path, result: PackResult, prefix: str | None, root: str | Path | None, class_names: str | None,
            multilabel: bool, delimiter: str) -> list[tuple[str, list[str], list[_Item]]]:
    """``(prefix, classes, items)`` of each split ``source`` holds (a list, one folder, or train/ and val/)."""
    if source.is_file():
        list_root = Path(root).expanduser() if root else source.parent
        classes, items = _list_items(source, list_root, class_names, multilabel, delimiter)
        return [(prefix or source.stem, classes, items)]
    if not (source / "train").is_dir():
        classes, items, warnings = _folder_items(source)
        result.warnings += warnings
        return [(prefix or source.name, classes, items)]
    classes, train, warnings = _folder_items(source / "train")
    result.warnings += warnings
    splits = [(f"{prefix}-train" if prefix else "train", classes, train)]
    if (source / "val").is_dir():
        val_classes, val, warnings = _folder_items(source / "val")
        result.warnings += warnings
        unknown = sorted(set(val_classes) - set(classes))
        if unknown:
            raise UserError(f"{source / 'val'} has classes that train has not: {', '.join(unknown[:5])}")
        remap = {i: classes.index(name) for i, name in enumerate(val_classes)}
        for item in val:
            item.label = remap[item.label]  # type: ignore[index]
        splits.append((f"{prefix}-val" if prefix else "val", classes, val))
    return splits


def pack(source: str | Path, out: str | Path, *, shard_size_mb: float = DEFAULT_SHARD_MB, seed: int = 0,
         prefix: str | None = None, root: str | Path | None = None, class_names: str | None = None,
         multilabel: bool = False, delimiter: str = " ", force: bool = False) -> PackResult:
    """Pack ``source`` (a folder of class folders, a root with ``train/`` and ``val/``, or a label list) into
    ``out``; see the module docstring.

    Raises:
        UserError: the input is missing or empty, ``out`` holds shards already (without ``force``), or a value is
            out of range.
    """
    source, out = Path(source).expanduser(), Path(out).expanduser()
    if not shard_size_mb > 0:
        raise UserError(f"--shard-size {shard_size_mb} must be a positive number of megabytes")
    shard_bytes = int(shard_size_mb * 1024 * 1024)
    if not source.exists():
        raise UserError(f"{str(source)!r} does not exist; give an image folder or a label list")
    result = PackResult()
    splits = _splits(source, result, prefix, root, class_names, multilabel, delimiter)
    multilabel = multilabel and source.is_file()  # --multilabel is a list's; folders hold one class an image
    try:
        out.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise UserError(f"cannot make --out {str(out)!r}: {exc}") from None
    for name, _, items in splits:
        if not items:
            raise UserError(f"no images to pack for {name!r} in {str(source)!r}")
        existing = sorted(out.glob(f"{name}-*.tar")) + ([out / index_name(name)] if (out / index_name(name)).exists()
                                                       else [])
        if existing and not force:
            raise UserError(f"{existing[0]} exists already; pass --force to overwrite the shards of {name!r}")
        for old in existing:
            old.unlink()
    for name, split_classes, items in splits:
        packed = _write_split(items, split_classes, multilabel, out, name, shard_bytes, seed)
        log.info("packed %d images of %r into %d shards in %s (%.0f images/s)", packed.samples, name,
                 len(packed.shards), out, packed.images_per_second)
        result.splits.append(packed)
    for line in result.warnings:
        log.warning("%s", line)
    return result
