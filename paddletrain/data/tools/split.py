"""Splitting a folder of class folders into PaddleClas label lists: stratified, reproducible, nothing copied.

``python -m paddletrain.data split <folder> --val 0.1 --seed 0`` (:mod:`paddletrain.data.__main__`) calls
:func:`split_folder`. The folder is ``<folder>/<class>/<image>``, scanned as ``data=imagefolder`` scans a split
(confined to the folder, the same extensions and skips). Each class keeps its share:

- a class of ``n`` images puts ``round(n * val)`` of them in val, halves rounded up, at most ``n - 1`` (a class
  always keeps a training image): 10 images at 0.1 give 1, 5 give 1 (0.5 rounds up), 4 give 0. The fraction is
  taken as the decimal written (``0.1`` is exactly a tenth), so no float error moves a count;
- a class that gets none in val is named in a warning; a class folder without images is left out (warned);
- which images go to val is a permutation seeded by ``(seed, CRC-32 of the class name)``: the same seed gives the
  same lists, and adding or removing a class does not reshuffle the others.

The lists name each image by its path relative to the folder (so ``data.root=<folder>``), with its class index in
sorted class-name order, one ``<path> <index>`` a line sorted by class then path; ``class_names.txt`` names the
classes one a line. Existing lists are kept unless ``force``; each file is written whole or not at all.
"""
from __future__ import annotations

import logging
import math
import os
import tempfile
import zlib
from dataclasses import dataclass, field
from fractions import Fraction
from pathlib import Path

import numpy as np

from paddletrain.data.formats import folder_scan
from paddletrain.errors import UserError

__all__ = ["LIST_FILES", "SplitResult", "split_folder", "val_count"]

log = logging.getLogger("paddletrain")

LIST_FILES = ("train_list.txt", "val_list.txt", "class_names.txt")


@dataclass
class SplitResult:
    """The lists written: their paths, the class names, the images per class in each split, and the warnings."""

    files: list[Path]
    classes: list[str]
    train_counts: list[int]
    val_counts: list[int]
    warnings: list[str] = field(default_factory=list)


def val_count(images: int, val: float | str | Fraction) -> int:
    """Images of a class of ``images`` that go to val: ``images * val`` rounded half up, at most ``images - 1``."""
    share = Fraction(str(val)) if not isinstance(val, Fraction) else val
    return max(0, min(math.floor(images * share + Fraction(1, 2)), images - 1))


def _fraction(val: float | str) -> Fraction:
    try:
        share = Fraction(str(val))
    except ValueError:
        share = None
    if share is None or not 0 < share < 1:
        raise UserError(f"--val {val} must be a fraction between 0 and 1 (e.g. 0.1 for a tenth of each class)")
    return share


def _scan(folder: Path) -> tuple[list[str], list[list[str]], list[str]]:
    """The class names, each class's image paths relative to ``folder`` (sorted) and warnings."""
    if not folder.is_dir():
        raise UserError(f"{str(folder)!r} is not a folder; give <folder> of <class>/<image> folders")
    if (folder / "train").is_dir():
        raise UserError(f"{str(folder)!r} has a train folder, so it is split already; check it with "
                        f"python -m paddletrain.data check {folder}")
    classes, contents, warnings = folder_scan.scan_class_folder(folder)
    by_class: list[list[str]] = [[] for _ in classes]
    prefix = os.path.join(str(folder), "")
    for path, label in contents.samples:
        relpath = path[len(prefix):] if path.startswith(prefix) else os.path.relpath(path, folder)
        if "\n" in relpath or "\r" in relpath or not _utf8(relpath):
            warnings.append(f"{relpath!r} left out: a label list line holds UTF-8 text without line breaks")
        else:
            by_class[label].append(relpath)
    kept = [i for i, paths in enumerate(by_class) if paths]
    warnings += [f"class folder {classes[i]!r} has no images: left out of the classes"
                 for i in range(len(classes)) if not by_class[i]]
    if not kept:
        raise UserError(f"no images in the class folders of {str(folder)!r}")
    return [classes[i] for i in kept], [sorted(by_class[i]) for i in kept], warnings


def _utf8(text: str) -> bool:
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:  # a name that is not UTF-8 on disk decodes to surrogates
        return False
    return True


def _write(path: Path, text: str) -> None:
    """``text`` to ``path`` whole or not at all: a temporary file beside it, then renamed over it."""
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", dir=path.parent)
    try:
        with os.fdopen(fd, "w", encoding="utf-8", newline="\n") as file:
            file.write(text)
        os.replace(tmp, path)
    except BaseException:
        os.unlink(tmp)
        raise


def split_folder(folder: str | Path, *, val: float | str = 0.1, seed: int = 0, out: str | Path | None = None,
                 force: bool = False) -> SplitResult:
    """Write ``train_list.txt``, ``val_list.txt`` and ``class_names.txt`` for ``folder`` into ``out`` (default:
    ``folder``); see the module docstring for the rules.

    Raises:
        UserError: the folder is missing, already split or has no images, ``val`` is not in (0, 1), ``out`` is
            not a folder, or a list exists and ``force`` is false.
    """
    folder = Path(folder).expanduser()
    share = _fraction(val)
    out_dir = folder if out is None else Path(out).expanduser()
    files = [out_dir / name for name in LIST_FILES]
    existing = [str(f) for f in files if os.path.lexists(f)]
    if existing and not force:
        raise UserError(f"{', '.join(existing)} exist already; pass --force to overwrite")
    classes, by_class, warnings = _scan(folder)
    train_lines, val_lines, train_counts, val_counts = [], [], [], []
    for label, (name, paths) in enumerate(zip(classes, by_class, strict=True)):
        k = val_count(len(paths), share)
        if k == 0:
            needed = max(2, math.ceil(1 / (2 * share)))
            warnings.append(f"class {name!r} has {len(paths)} image{'s' * (len(paths) != 1)}, too few to put one in "
                            f"val at --val {val} (that takes {needed}): all of them are in train")
        rng = np.random.default_rng([seed, zlib.crc32(name.encode("utf-8", "surrogateescape"))])
        in_val = set(rng.permutation(len(paths))[:k].tolist())
        for i, relpath in enumerate(paths):
            (val_lines if i in in_val else train_lines).append(f"{relpath} {label}\n")
        train_counts.append(len(paths) - k)
        val_counts.append(k)
    if not val_lines:
        warnings.append(f"no class has enough images for one in val at --val {val}: val_list.txt is empty, and "
                        "training needs validation images")
    try:
        out_dir.mkdir(parents=True, exist_ok=True)
        for path, text in zip(files, ("".join(train_lines), "".join(val_lines), "".join(f"{c}\n" for c in classes)),
                              strict=True):
            _write(path, text)
    except OSError as exc:
        raise UserError(f"cannot write the lists into {str(out_dir)!r}: {exc}") from exc
    for line in warnings:
        log.warning("%s", line)
    return SplitResult(files, classes, train_counts, val_counts, warnings)
