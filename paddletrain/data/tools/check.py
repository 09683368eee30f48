"""A dataset check: everything the loader would read, read without training, and every problem named.

``python -m paddletrain.data check`` (:mod:`paddletrain.data.__main__`) prints :func:`check_dataset`'s report. The
inputs are read by the loader's own readers, so the check accepts and refuses exactly what training does:

- an image folder by :func:`~paddletrain.data.formats.folder_scan.scan_split` (the confined scan of
``data=imagefolder``),
  a root ``root/{train,val}/<class>/...`` as its two splits, or a single split folder ``<folder>/<class>/...``;
- label lists by :func:`~paddletrain.data.formats.label_list.check_label_list` (every bad line, not only the first);
- every image by :func:`~paddletrain.data.formats.images.open_image` and ``to_mode(image, "RGB")``, as a training sample
  is decoded, in worker processes, each decode bounded in time. No image stays in memory: a file leaves behind a
  16-byte BLAKE2b digest of its bytes (for leaks and duplicates) and its problems.

Each problem has a kind (:data:`KINDS`) of severity ``error`` (training fails on it, or its result cannot be
trusted) or ``warning`` (it trains, maybe not as the user thinks). The report also holds each split's class
histogram, the first split's imbalance ratio and the class weights it suggests (scikit-learn's ``"balanced"``
rule, ``n_samples / (n_classes * count)``).
"""
from __future__ import annotations

import hashlib
import multiprocessing
import os
import signal
import sys
import threading
from collections.abc import Iterator, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
from PIL import UnidentifiedImageError
from tqdm import tqdm

from paddletrain.data.errors import DatasetError
from paddletrain.data.formats import folder_scan
from paddletrain.data.formats.class_names import read_names_file
from paddletrain.data.formats.images import (
    IMG_EXTENSIONS,
    SIXTEEN_BIT_MODES,
    ImageReadError,
    open_image,
    open_regular,
    to_mode,
)
from paddletrain.data.formats.label_list_file import LINE_PROBLEM_KINDS, check_label_list
from paddletrain.errors import ExitCode, UserError

__all__ = ["DEFAULT_MIN_SIZE", "KINDS", "CheckReport", "Kind", "Problem", "SplitReport", "check_dataset",
           "inspect_image"]

ERROR, WARNING = "error", "warning"
# Smaller than MNIST (28 px) and CIFAR (32 px), which are genuine datasets: below it an image is a thumbnail,
# an icon or a tracking pixel.
DEFAULT_MIN_SIZE = 16
DEFAULT_TIMEOUT = 60.0  # seconds to decode one file; a genuine photo takes well under one
_CHUNK = 1 << 20  # bytes hashed at a time
_DIGEST_BYTES = 16  # 128 bits: no accidental collision among billions of files
_ORIENTATION = 0x0112
_ROTATIONS = {2: "mirrored", 3: "rotated 180°", 4: "flipped upside down", 5: "mirrored and rotated 90° CCW",
              6: "rotated 90° clockwise", 7: "mirrored and rotated 90° clockwise", 8: "rotated 90° CCW"}
# Scan skips a user should hear about, and why; hidden files and second links to a visited place are deliberate.
_SKIPS_REPORTED = {
    folder_scan.EXTENSION: "{ext} files are not read by the loader (it reads " + " ".join(IMG_EXTENSIONS) + ")",
    folder_scan.OUTSIDE_ROOT: "a symlink out of the root, not followed",
    folder_scan.NON_REGULAR: "not a regular file, not opened",
    folder_scan.OTHER_SPLIT: "a link into another split, not followed",
    folder_scan.BROKEN_LINK: "a broken symlink",
    folder_scan.UNREADABLE: "a folder that cannot be listed: its images are not in the split",
}


@dataclass(frozen=True)
class Kind:
    """A kind of problem: how serious it is and what it means (docs/data.md shows this table)."""

    severity: str
    meaning: str


KINDS: dict[str, Kind] = {
    # what training refuses, or what makes its result wrong
    "unreadable": Kind(ERROR, "cannot be opened or decoded: truncated, corrupt, larger than "
                              "PIL.Image.MAX_IMAGE_PIXELS, a pixel format without a known range (32-bit float), or "
                              "decoding took too long"),
    "not-an-image": Kind(ERROR, "not an image format Pillow reads (a text or HTML page saved as .jpg)"),
    "missing-file": Kind(ERROR, "a listed file that does not exist or cannot be opened"),
    "bad-line": Kind(ERROR, "a list line that cannot be read: not UTF-8, byte-order mark, CR line ending, blank, "
                            "no delimiter, a label that is not a class index"),
    "bad-path": Kind(ERROR, "a listed path that is empty, absolute, leaves the root or is not a regular file"),
    "listed-twice": Kind(ERROR, "the same path on two lines of one list"),
    "label-out-of-range": Kind(ERROR, "a class index at or above the class count (--class-names, or the first list's)"),
    "empty-class": Kind(ERROR, "a class folder without any image, or a class without a sample in the first list"),
    "unknown-class": Kind(ERROR, "a class folder of a later split that the first split does not have"),
    "leak": Kind(ERROR, "the same file (by the hash of its bytes) in two splits: validation scores it as seen"),
    # what trains, maybe not as the user thinks
    "duplicate": Kind(WARNING, "the same file twice in one split (it weighs double; conflicting labels are named)"),
    "cmyk": Kind(WARNING, "a CMYK image: converted to RGB without its colour profile, so colours shift"),
    "16-bit": Kind(WARNING, "16 bits per channel: scaled to 8 bits (value >> 8) for training"),
    "palette-transparency": Kind(WARNING, "a palette image with transparency: the transparent pixels get their "
                                          "palette colour (often black) in RGB"),
    "exif-rotated": Kind(WARNING, "an EXIF orientation other than 1: viewers show it turned, training reads the "
                                  "pixels as stored"),
    "tiny": Kind(WARNING, "smaller than --min-size pixels on a side"),
    "skipped": Kind(WARNING, "a file the loader skips (not an image extension, not a regular file, a link out of "
                             "the root or into another split, a broken link) or an unreadable folder"),
}
assert set(LINE_PROBLEM_KINDS) <= set(KINDS)


@dataclass(frozen=True)
class Problem:
    """One problem: its kind, the file (an image, a list or a folder), the list line when the file is a list, where
    an image was listed (``train_list.txt:3``) and what is wrong."""

    kind: str
    path: str
    message: str
    line: int | None = None
    listed: str | None = None

    @property
    def severity(self) -> str:
        return KINDS[self.kind].severity

    def __str__(self) -> str:
        where = self.path + (f":{self.line}" if self.line is not None else "")
        where += f" ({self.listed})" if self.listed else ""
        return f"{where}: {self.severity} {self.kind}: {self.message}"


@dataclass(frozen=True)
class SplitReport:
    """One split (a split folder or a list): its name, its sample count and its samples per class."""

    name: str
    images: int
    counts: list[int]


@dataclass
class CheckReport:
    """What :func:`check_dataset` found. ``weights`` and ``imbalance`` are those of the first split (training);
    a class without samples has no weight (None) and does not count in the imbalance ratio."""

    inputs: list[str]
    classes: list[str]
    splits: list[SplitReport]
    problems: list[Problem]
    min_size: int
    multilabel: bool = False
    weights: list[float | None] = field(default_factory=list)
    imbalance: float | None = None

    @property
    def errors(self) -> list[Problem]:
        return [p for p in self.problems if p.severity == ERROR]

    @property
    def warnings(self) -> list[Problem]:
        return [p for p in self.problems if p.severity == WARNING]

    @property
    def ok(self) -> bool:
        """No error (warnings alone leave a dataset usable)."""
        return not self.errors

    @property
    def exit_code(self) -> ExitCode:
        """``OK`` without errors, else ``BAD_RESULT`` (the check ran, the data is not fit to train on)."""
        return ExitCode.OK if self.ok else ExitCode.BAD_RESULT

    def counts_by_kind(self) -> dict[str, int]:
        counts: dict[str, int] = {}
        for problem in self.problems:
            counts[problem.kind] = counts.get(problem.kind, 0) + 1
        return dict(sorted(counts.items()))

    def to_dict(self) -> dict[str, Any]:
        """The report as one JSON-ready document (``--json``)."""
        first = self.splits[0].counts if self.splits else [0] * len(self.classes)
        return {
            "ok": self.ok,
            "inputs": self.inputs,
            "min_size": self.min_size,
            "multilabel": self.multilabel,
            "counts": {"errors": len(self.errors), "warnings": len(self.warnings), "by_kind": self.counts_by_kind()},
            "classes": self.classes,
            "splits": [{"name": s.name, "images": s.images, "histogram": dict(zip(self.classes, s.counts, strict=True))}
                       for s in self.splits],
            "histogram": dict(zip(self.classes, first, strict=True)),
            "imbalance_ratio": self.imbalance,
            "class_weights": dict(zip(self.classes, self.weights, strict=True)),
            "problems": [{"severity": p.severity, **asdict(p)} for p in self.problems],
        }


def balanced_weights(counts: Sequence[int]) -> list[float | None]:
    """scikit-learn's ``class_weight="balanced"``: ``n_samples / (n_classes * count)`` per class (None for a class
    without samples). For multi-label counts ``n_samples`` is the number of positive labels."""
    total, classes = int(sum(counts)), len(counts)
    return [total / (classes * int(c)) if c else None for c in counts]


def imbalance_ratio(counts: Sequence[int]) -> float | None:
    """The largest class count over the smallest non-zero one (None without samples)."""
    present = [int(c) for c in counts if c]
    return max(present) / min(present) if present else None


# ---------------------------------------------------------------------------------------------------------------
# One file, in a worker


class _DecodeTimeout(BaseException):
    """Raised by the timer inside a decode; a BaseException so that open_image's ``except Exception`` lets it by."""


def _on_timer(signum: int, frame: Any) -> None:
    raise _DecodeTimeout


def _digest(path: str) -> bytes:
    digest = hashlib.blake2b(digest_size=_DIGEST_BYTES)
    with open_regular(path) as file:
        while chunk := file.read(_CHUNK):
            digest.update(chunk)
    return digest.digest()


def _image_problems(image: Any, min_size: int) -> list[tuple[str, str]]:
    """The warnings a decoded image deserves, as (kind, message)."""
    found = []
    if image.mode == "CMYK":
        found.append(("cmyk", "CMYK pixels; save it as RGB (with its colour profile applied)"))
    if image.mode in SIXTEEN_BIT_MODES or image.mode == "I":
        found.append(("16-bit", f"mode {image.mode}: 16-bit values, trained as value >> 8"))
    if image.mode in ("P", "PA") and "transparency" in image.info:
        found.append(("palette-transparency", "palette image with a transparent colour; save it as RGBA or RGB"))
    orientation = image.getexif().get(_ORIENTATION)
    if orientation in _ROTATIONS:
        found.append(("exif-rotated", f"EXIF orientation {orientation} ({_ROTATIONS[orientation]} when shown); "
                                      "trained as stored, unrotated (apply PIL.ImageOps.exif_transpose and save)"))
    width, height = image.size
    if min(width, height) < min_size:
        found.append(("tiny", f"{width}x{height} pixels, smaller than --min-size {min_size}"))
    return found


def inspect_image(path: str, min_size: int = DEFAULT_MIN_SIZE, timeout: float | None = None,
                  ) -> tuple[bytes | None, list[tuple[str, str]]]:
    """The digest of the file at ``path`` (None if unreadable) and its problems as ``(kind, message)``.

    It is decoded as training decodes it (``open_image``, then ``to_mode(image, "RGB")``). ``timeout`` bounds the
    decode in seconds, with a timer signal, so only in a main thread and where ``signal.setitimer`` exists; a
    decoder stuck in C without returning to Python cannot be stopped this way.
    """
    try:
        digest = _digest(path)
    except (OSError, ImageReadError) as exc:
        return None, [("unreadable", str(exc) if isinstance(exc, ImageReadError) else f"cannot read: {exc.strerror}")]
    timed = bool(timeout) and hasattr(signal, "setitimer") and threading.current_thread() is threading.main_thread()
    previous = signal.signal(signal.SIGALRM, _on_timer) if timed else None
    try:
        if timed:
            signal.setitimer(signal.ITIMER_REAL, timeout)
        image = open_image(path)
        problems = _image_problems(image, min_size)
        to_mode(image, "RGB")  # refuses what training refuses (float pixels, 32-bit integers)
    except _DecodeTimeout:
        return digest, [("unreadable", f"decoding took more than {timeout:g} s")]
    except ImageReadError as exc:
        kind = "not-an-image" if isinstance(exc.__cause__, UnidentifiedImageError) else "unreadable"
        return digest, [(kind, str(exc))]
    finally:
        if timed:
            signal.setitimer(signal.ITIMER_REAL, 0)
            signal.signal(signal.SIGALRM, previous)
    return digest, problems


def _inspect_star(args: tuple[str, int, float | None]) -> tuple[bytes | None, list[tuple[str, str]]]:
    return inspect_image(*args)


def _init_worker(parent_pid: int) -> None:
    from paddletrain.job.processes import die_with_parent

    # A Ctrl-C reaches the whole process group: the checking process stops the workers (Pool.terminate, whose
    # SIGTERM they must therefore not ignore), rather than each worker printing a traceback of its own.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, signal.SIG_DFL)  # not Paddle's handler (forked with it), which prints a report
    die_with_parent(signal.SIGKILL, parent_pid)


def _inspected(paths: list[str], min_size: int, timeout: float | None, workers: int,
               ) -> Iterator[tuple[bytes | None, list[tuple[str, str]]]]:
    """``inspect_image`` of each path, in order; in ``workers`` processes when there are any."""
    tasks = ((path, min_size, timeout) for path in paths)
    if workers <= 0 or len(paths) < 2:
        yield from map(_inspect_star, tasks)
        return
    # fork where there is one: a spawned worker would import Paddle again (paddletrain.data's __init__), seconds each
    methods = multiprocessing.get_all_start_methods()
    context = multiprocessing.get_context("fork" if "fork" in methods else None)
    pool = context.Pool(min(workers, len(paths)), initializer=_init_worker, initargs=(os.getpid(),))
    try:
        # imap keeps the input order; the pipe feeding the workers bounds how far ahead it reads
        yield from pool.imap(_inspect_star, tasks, chunksize=8)
        pool.close()  # every task is done: the workers exit on their own
    except BaseException:
        pool.terminate()  # an error or Ctrl-C here (or the caller stopped early): stop the workers
        raise
    finally:
        pool.join()


# ---------------------------------------------------------------------------------------------------------------
# The inputs: folders or lists, as splits


@dataclass
class _Split:
    name: str
    paths: list[str]
    labels: np.ndarray
    listed: list[str] | None = None  # where each sample is listed ("list.txt:3"), for lists


def _input_kind(path: Path) -> str:
    if not path.exists() and not path.is_symlink():
        raise UserError(f"{str(path)!r} does not exist")
    if path.is_dir():
        return "folder"
    if path.is_file():
        return "list"
    raise UserError(f"{str(path)!r} is neither a folder nor a list file")


def _folder_splits(inputs: list[Path]) -> list[tuple[Path, str, Path, tuple[str, ...]]]:
    """(root, split name, split folder, other splits of the root) for every split of the folder inputs."""
    found = []
    for folder in inputs:
        if (folder / "train").is_dir():
            for split in folder_scan.SPLITS:
                if (folder / split).is_dir():
                    found.append((folder, split, folder / split, folder_scan.SPLITS))
        else:
            found.append((folder, folder.name, folder, ()))
    return found


def _scan_folders(inputs: list[Path], problems: list[Problem]) -> tuple[list[str], list[_Split]]:
    splits, classes = [], None
    for root, split, split_dir, others in _folder_splits(inputs):
        if classes is None:
            classes = folder_scan.class_dirs(split_dir)
            if not classes:
                raise UserError(f"no class folders in {str(split_dir)!r}; expected <folder>/<class>/<image> or "
                                "<folder>/{train,val}/<class>/<image>")
        try:
            contents = folder_scan.scan_split(root, split, classes, split_dir, other_splits=others, record_skips=True)
        except DatasetError as exc:  # the split is a link out of the root, or the splits overlap
            raise UserError(str(exc)) from exc
        for reason, path, detail in contents.report.every_skip or []:
            if reason in _SKIPS_REPORTED:
                ext = os.path.splitext(path)[1].lower() or "extensionless"
                problems.append(Problem("skipped", path, _SKIPS_REPORTED[reason].format(ext=ext) + detail))
        for name, why in contents.empty.items():
            problems.append(Problem("empty-class", str(split_dir / name), f"class folder without images{why}"))
        for name in contents.unknown:
            problems.append(Problem("unknown-class", str(split_dir / name),
                                    f"class {name!r} is not a class folder of the first split; not checked"))
        samples = contents.samples
        splits.append(_Split(str(split_dir), [p for p, _ in samples], np.array([lb for _, lb in samples], np.int64)))
    return classes or [], splits


def _read_lists(inputs: list[Path], root: Path | None, options: dict[str, Any], class_names: str | None,
                problems: list[Problem]) -> tuple[list[str], list[_Split]]:
    names = read_names_file(class_names, f"--class-names {class_names!r}") if class_names else None
    num_classes = len(names) if names else None
    splits = []
    for list_path in inputs:
        list_root = root if root is not None else list_path.parent
        if not list_root.is_dir():
            raise UserError(f"--root {str(list_root)!r} is not a folder")
        try:
            checked = check_label_list(list_path, list_root, key="list", num_classes=num_classes, **options)
        except DatasetError as exc:
            raise UserError(str(exc)) from exc
        problems.extend(Problem(p.kind, str(list_path), p.message, p.line) for p in checked.problems)
        found = checked.found
        if found is None:
            splits.append(_Split(str(list_path), [], np.zeros((0,), np.int64), []))
            continue
        num_classes = found.num_classes if num_classes is None else num_classes  # the first list's, as training
        index = found.index
        splits.append(_Split(str(list_path), [index.path(i) for i in range(len(index))], index.labels,
                             [f"{list_path}:{line}" for line in checked.sample_lines]))
    return names or [str(i) for i in range(num_classes or 0)], splits


def _counts(split: _Split, num_classes: int) -> list[int]:
    if split.labels.ndim == 2:
        return split.labels.sum(axis=0, dtype=np.int64).tolist() if len(split.labels) else [0] * num_classes
    return np.bincount(split.labels, minlength=num_classes).astype(np.int64).tolist()


# ---------------------------------------------------------------------------------------------------------------
# Leaks and duplicates, by content


def _same_bytes(splits: list[_Split], digests: dict[bytes, list[tuple[int, int]]],
                classes: list[str]) -> list[Problem]:
    problems = []
    for members in digests.values():
        if len(members) < 2:
            continue
        first_split, first_index = members[0]
        original = f"{splits[first_split].paths[first_index]} in {splits[first_split].name}"
        first_in: dict[int, int] = {}
        for s, i in members:
            split = splits[s]
            listed = split.listed[i] if split.listed else None
            if s in first_in:
                seen = splits[s].paths[first_in[s]]
                conflict = _label_conflict(split.labels[first_in[s]], split.labels[i], classes)
                problems.append(Problem("duplicate", split.paths[i], f"same bytes as {seen}{conflict}", listed=listed))
                continue
            first_in[s] = i
            if s != first_split:
                problems.append(Problem("leak", split.paths[i], f"same bytes as {original}", listed=listed))
    return problems


def _label_conflict(first: np.ndarray, other: np.ndarray, classes: list[str]) -> str:
    if np.array_equal(first, other):
        return ""
    if np.ndim(first) == 0:
        return f", labelled {classes[int(other)]!r} here and {classes[int(first)]!r} there"
    return ", with other labels"


# ---------------------------------------------------------------------------------------------------------------
# The check


def check_dataset(inputs: Sequence[str | Path], *, root: str | Path | None = None, delimiter: str = " ",
                  multilabel: bool = False, class_names: str | None = None, min_size: int = DEFAULT_MIN_SIZE,
                  workers: int | None = None, timeout: float | None = DEFAULT_TIMEOUT,
                  progress: bool = False) -> CheckReport:
    """Check the dataset of ``inputs``: image folders (a root with ``train``/``val``, or split folders of class
    folders) or label lists, not both. Splits are compared for leaks in the order given; the first is training.

    Args:
        root: the folder list paths are relative to (default: each list's own folder).
        delimiter, multilabel: as ``data.delimiter`` and ``data.multilabel`` for lists.
        class_names: a file naming the classes of the lists, one a line (their count bounds the labels).
        min_size: an image with a side below it is reported as ``tiny``.
        workers: decode processes (default: the usable cores; 0 decodes in this process).
        timeout: seconds one file may take to decode (None: no bound).
        progress: show a progress bar on stderr (drawn only when the check lasts more than a second).

    Raises:
        UserError: an input is missing or not a folder or file, folders and lists are mixed, a folder has no
            class folders, or a list cannot be read as a whole.
    """
    paths = [Path(p).expanduser() for p in inputs]
    if not paths:
        raise UserError("nothing to check: give an image folder or label list files")
    kinds = {_input_kind(p) for p in paths}
    if len(kinds) > 1:
        raise UserError("give image folders or label lists, not both: their classes cannot be matched")
    problems: list[Problem] = []
    if kinds == {"folder"}:
        classes, splits = _scan_folders(paths, problems)
    else:
        options = dict(delimiter=delimiter, multilabel=multilabel)
        classes, splits = _read_lists(paths, Path(root).expanduser() if root else None, options, class_names,
                                      problems)
    reports = [SplitReport(s.name, len(s.paths), _counts(s, len(classes))) for s in splits]
    if reports and kinds == {"list"}:  # a folder's empty classes were found by the scan
        problems += [Problem("empty-class", splits[0].name, f"class {i} ({name!r}) has no sample in this list")
                     for i, (name, count) in enumerate(zip(classes, reports[0].counts, strict=True)) if not count]
    problems += _decode_all(splits, classes, min_size, timeout, _workers(workers), progress)
    problems.sort(key=lambda p: (p.path, p.line or 0, p.kind))
    weights = balanced_weights(reports[0].counts) if reports else []
    return CheckReport([str(p) for p in inputs], classes, reports, problems, min_size, multilabel, weights,
                       imbalance_ratio(reports[0].counts) if reports else None)


def _workers(workers: int | None) -> int:
    if workers is not None:
        return workers
    from paddletrain.devices import usable_cores

    return usable_cores()


def _decode_all(splits: list[_Split], classes: list[str], min_size: int, timeout: float | None, workers: int,
                progress: bool) -> list[Problem]:
    order = [(s, i) for s, split in enumerate(splits) for i in range(len(split.paths))]
    paths = [splits[s].paths[i] for s, i in order]
    digests: dict[bytes, list[tuple[int, int]]] = {}
    problems = []
    with tqdm(total=len(paths), unit="img", file=sys.stderr, disable=not progress, delay=1.0,
              desc="checking") as bar:
        for (s, i), (digest, found) in zip(order, _inspected(paths, min_size, timeout, workers), strict=True):
            split = splits[s]
            listed = split.listed[i] if split.listed else None
            problems += [Problem(kind, split.paths[i], message, listed=listed) for kind, message in found]
            if digest is not None:
                digests.setdefault(digest, []).append((s, i))
            bar.update()
    return problems + _same_bytes(splits, digests, classes)
