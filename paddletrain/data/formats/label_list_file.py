"""Reading and checking PaddleClas label lists (``<path> <label>`` a line, or multi-hot rows), with nothing of a
framework: the dataset (:mod:`paddletrain.data.formats.label_list`) and the dataset doctor (``python -m paddletrain.data
check``) share it. Every line is checked and every problem named by its kind (:data:`LINE_PROBLEM_KINDS`).
"""
from __future__ import annotations

import csv
import logging
import os
import re
import stat
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from paddletrain.data.errors import DatasetError
from paddletrain.data.formats.images import file_kind
from paddletrain.data.formats.sample_index import SampleIndex

log = logging.getLogger("paddletrain")


BAD_LINE_POLICIES = ("error", "skip")
# 1.28 M ImageNet lines are ~40 MB; ImageNet-21k's 14 M under 1 GiB. Anything larger is not a label list.
MAX_LIST_BYTES = 2**31
# More classes than any dataset has: a label this large is a typo (and would build a huge classifier).
MAX_CLASSES = 1_000_000
_WARNED_LINES = 100  # bad lines warned one by one under bad_lines=skip; the rest are counted
_BOM = b"\xef\xbb\xbf"
_INTEGER = re.compile(r"[0-9]+")


# The kinds of bad line, for a report that groups them (every one of them stops training under bad_lines=error).
BAD_LINE = "bad-line"  # unreadable as a line of this format: encoding, BOM, CR, blank, no delimiter, label text
OUT_OF_RANGE = "label-out-of-range"
BAD_PATH = "bad-path"  # empty, absolute, leaving data.root, or not a regular file
MISSING_FILE = "missing-file"
LISTED_TWICE = "listed-twice"
LINE_PROBLEM_KINDS = (BAD_LINE, OUT_OF_RANGE, BAD_PATH, MISSING_FILE, LISTED_TWICE)


class _BadLine(ValueError):
    """One line's problem (the message says what is wrong with it, ``kind`` which kind of problem it is)."""

    def __init__(self, message: str, kind: str = BAD_LINE) -> None:
        super().__init__(message)
        self.kind = kind


@dataclass(frozen=True, order=True)
class LineProblem:
    """What is wrong with line ``line`` (1-based) of a list: one of :data:`LINE_PROBLEM_KINDS` and a message that
    completes ``line N ...``, e.g. ``has label 7, out of range for 3 classes (0..2)``."""

    line: int
    kind: str
    message: str


@dataclass
class _Entries:
    """The lines whose path and label passed, as columns: a million tuples would cost more than the parse."""

    numbers: list[int] = field(default_factory=list)
    paths: list[str] = field(default_factory=list)  # normalised, relative to data.root
    labels: list = field(default_factory=list)

    def without(self, lines: set[int]) -> _Entries:
        keep = [i for i, number in enumerate(self.numbers) if number not in lines]
        return _Entries([self.numbers[i] for i in keep], [self.paths[i] for i in keep],
                        [self.labels[i] for i in keep])


@dataclass(frozen=True)
class LabelList:
    """A list read and checked: its samples, the class count its labels need, and what was dropped."""

    index: SampleIndex
    num_classes: int
    lines: int
    skipped: int


@dataclass(frozen=True)
class ListCheck:
    """Every bad line of a list (by line number), and the list of its good lines (None when none is good);
    ``sample_lines[i]`` is the line of ``found.index``'s sample ``i``."""

    found: LabelList | None
    problems: list[LineProblem]
    lines: int
    sample_lines: list[int]


def resolve_list_path(path: str | Path, root: str | Path) -> Path:
    """A relative list (or class-names) path is looked up from the working directory, then from ``root``."""
    candidate = Path(path).expanduser()
    if candidate.is_absolute() or candidate.exists() or not (Path(root) / candidate).exists():
        return candidate
    return Path(root) / candidate


def read_label_list(path: str | Path, root: str | Path, *, key: str, delimiter: str = " ",
                    multilabel: bool = False, num_classes: int | None = None, bad_lines: str = "error",
                    check_files: bool = True) -> LabelList:
    """Read and check the label list at ``path`` whose image paths are relative to ``root``.

    Args:
        key: the config key that named the list (``data.train_list``), for messages.
        delimiter: between path and label (PaddleClas's ``delimiter``); multi-label lists always split on a tab.
        num_classes: labels must be below it (multi-label: rows must have this many values); None takes the
            count from the list itself (the largest label + 1, or the first row's length).
        bad_lines: ``"error"`` refuses the list at its first bad line, ``"skip"`` drops bad lines with a warning.
        check_files: check on disk that each file exists, is a regular file and stays inside ``root``.

    Raises:
        DatasetError: the list cannot be read, a line is bad (``bad_lines="error"``), or no line is usable.
    """
    if bad_lines not in BAD_LINE_POLICIES:
        raise DatasetError(f"data.bad_lines={bad_lines!r} is not one of {', '.join(BAD_LINE_POLICIES)}")
    where = f"{key}={str(path)!r}"
    checked = check_label_list(path, root, key=key, delimiter=delimiter, multilabel=multilabel,
                               num_classes=num_classes, check_files=check_files)
    _report(checked.problems, where, bad_lines)
    found = checked.found
    if found is None:
        raise DatasetError(f"{where} has no usable line (read {checked.lines} lines; each one a path and its label "
                           f"relative to data.root={str(root)!r})")
    log.info("%s: %d of %d lines used%s", where, len(found.index), found.lines,
             f", {found.skipped} bad lines skipped (data.bad_lines=skip)" if found.skipped else "")
    return found


def check_label_list(path: str | Path, root: str | Path, *, key: str, delimiter: str = " ",
                     multilabel: bool = False, num_classes: int | None = None, check_files: bool = True) -> ListCheck:
    """Check every line of the label list at ``path`` and return the problems rather than raising at the first.

    The same checks as :func:`read_label_list` (which calls it), with the same arguments; ``found`` holds the
    good lines (what ``bad_lines="skip"`` trains on), or None when no line is good.

    Raises:
        DatasetError: the list as a whole cannot be read (not a file, too large, a CSV list without its header)
            or ``delimiter`` cannot separate anything.
    """
    if not delimiter or delimiter in "\r\n":
        raise DatasetError(f"data.delimiter={delimiter!r} must be a character that separates path and label")
    where = f"{key}={str(path)!r}"
    data = _read_bounded(Path(path), where)
    parse = _MultiLabelParser(num_classes) if multilabel else _LabelParser(num_classes)
    if multilabel or Path(path).suffix.lower() == ".csv":
        lines = _lines(data)
        rows, problems = _split_rows(lines, "\t") if multilabel else _csv_rows(lines, where)
        entries, more = _parse_rows(rows, parse)
        problems += more
        total = len(lines)
    else:
        entries, problems, total = _single_label_entries(data, delimiter, parse)
    if check_files and entries.numbers:
        problems += _file_problems(entries, Path(root))
    problems.sort()
    if problems:
        entries = entries.without({problem.line for problem in problems})
    if not entries.numbers:
        return ListCheck(None, problems, total, [])
    labels = np.array(entries.labels, np.uint8 if multilabel else np.int64)
    index = SampleIndex.build(root, entries.paths, labels)
    count = parse.num_classes if multilabel else int(labels.max()) + 1
    found = LabelList(index, num_classes if num_classes is not None else count, total, total - len(entries.numbers))
    return ListCheck(found, problems, total, list(entries.numbers))


def _read_bounded(path: Path, where: str) -> bytes:
    try:
        if not path.is_file():
            raise DatasetError(f"{where} is not a file (give the list of '<path> <label>' lines)")
        size = path.stat().st_size
        if size > MAX_LIST_BYTES:
            raise DatasetError(f"{where} is {size} bytes, more than the {MAX_LIST_BYTES} any label list needs")
        return path.read_bytes()
    except OSError as exc:
        raise DatasetError(f"cannot read {where}: {exc}") from exc


def _lines(data: bytes) -> list[bytes]:
    """The list's lines, without the newline that ends the last one."""
    lines = data.split(b"\n")
    if lines and lines[-1] == b"":
        lines.pop()
    return lines


def _decoded(lines: list[bytes], first: int = 1) -> Iterator[tuple[int, str | _BadLine]]:
    """(line number, its text or its problem) for every line, the first numbered ``first``: the problems every
    format shares."""
    for number, raw in enumerate(lines, first):
        if number == 1 and raw.startswith(_BOM):
            yield number, _BadLine("starts with a UTF-8 byte-order mark (save the list without BOM)")
        elif raw.endswith(b"\r"):
            yield number, _BadLine("ends with CR, a Windows line ending (convert the list with dos2unix)")
        elif not raw.strip():
            yield number, _BadLine("is blank")
        else:
            try:
                yield number, raw.decode("utf-8").rstrip(" ")
            except UnicodeDecodeError as exc:
                yield number, _BadLine(f"is not UTF-8 (byte {raw[exc.start]:#04x} at column {exc.start + 1})")


def _split_rows(lines: list[bytes], delimiter: str, first: int = 1,
                ) -> tuple[list[tuple[int, str, str]], list[LineProblem]]:
    rows, problems = [], []
    for number, text in _decoded(lines, first):
        if isinstance(text, _BadLine):
            problems.append(LineProblem(number, text.kind, str(text)))
            continue
        relpath, found, label = text.rpartition(delimiter)
        if not found:
            problems.append(LineProblem(number, BAD_LINE, f"has no {delimiter!r} between the path and its label"))
        else:
            rows.append((number, relpath, label))
    return rows, problems


def _csv_rows(lines: list[bytes], where: str) -> tuple[list[tuple[int, str, str]], list[LineProblem]]:
    """The ``path`` and ``label`` columns of a CSV list; its first line is the header."""
    rows, problems, columns = [], [], None
    for number, text in _decoded(lines):
        if isinstance(text, _BadLine):
            problems.append(LineProblem(number, text.kind, str(text)))
            continue
        fields = next(csv.reader([text]))
        if columns is None:
            names = [name.strip().lower() for name in fields]
            if number != 1 or "path" not in names or "label" not in names:
                raise DatasetError(f"{where}: a CSV list needs a header line with 'path' and 'label' columns, got "
                                   f"{text[:200]!r} on line {number}")
            columns = names.index("path"), names.index("label")
        elif len(fields) <= max(columns):
            problems.append(LineProblem(number, BAD_LINE,
                                        f"has {len(fields)} CSV fields, the header {max(columns) + 1} or more"))
        else:
            rows.append((number, fields[columns[0]], fields[columns[1]].strip()))
    return rows, problems


class _LabelParser:
    """Class indices below ``num_classes`` (or below MAX_CLASSES when the list sets the count)."""

    def __init__(self, num_classes: int | None) -> None:
        self.limit = num_classes if num_classes is not None else MAX_CLASSES

    def __call__(self, text: str) -> int:
        if not _INTEGER.fullmatch(text):
            raise _BadLine(f"has label {text[:40]!r}, not a class index (a non-negative integer)")
        label = int(text)
        if label >= self.limit:
            raise _BadLine(f"has label {label}, out of range for {self.limit} classes (0..{self.limit - 1})",
                           OUT_OF_RANGE)
        return label


class _MultiLabelParser:
    """Multi-hot rows of 0/1 values, all as long as ``num_classes`` (or as the first good row)."""

    def __init__(self, num_classes: int | None) -> None:
        self.num_classes = num_classes

    def __call__(self, text: str) -> list[int]:
        values = text.split(",")
        if any(v.strip() not in ("0", "1") for v in values):
            raise _BadLine(f"has labels {text[:60]!r}, not comma-separated 0/1 values (one per class)")
        if self.num_classes is None:
            self.num_classes = len(values)
        elif len(values) != self.num_classes:
            raise _BadLine(f"has {len(values)} label values, not one per class ({self.num_classes})", OUT_OF_RANGE)
        return [int(v) for v in values]


def _parse_rows(rows: list[tuple[int, str, str]], parse: _LabelParser | _MultiLabelParser,
                ) -> tuple[_Entries, list[LineProblem]]:
    """Check each row's path (as text) and label; a path listed twice is a problem on its second line."""
    entries, problems, first_line = _Entries(), [], {}
    for number, relpath, label_text in rows:
        try:
            clean = _clean_relpath(relpath)
            if clean in first_line:
                raise _BadLine(f"lists {relpath!r} again (first on line {first_line[clean]})", LISTED_TWICE)
            first_line[clean] = number
            label = parse(label_text)
        except _BadLine as exc:
            problems.append(LineProblem(number, exc.kind, str(exc)))
            continue
        entries.numbers.append(number)
        entries.paths.append(clean)
        entries.labels.append(label)
    return entries, problems


# The longest label the fast path converts itself: any 9-digit integer fits int64, and MAX_CLASSES has 7 digits.
_FAST_LABEL_DIGITS = 9


def _single_label_entries(data: bytes, delimiter: str, parse: _LabelParser,
                          ) -> tuple[_Entries, list[LineProblem], int]:
    """PaddleClas's ``<path><delimiter><label>`` lines: (entries, problems, line count), as the general path
    (:func:`_split_rows` then :func:`_parse_rows`) finds them, in a third of its time on a clean list.

    A line whose label is a short run of ASCII digits and whose path is plain (see below) is taken as it is;
    every other line (the first, which may carry a BOM, and any blank, CR-ended, odd or bad one) goes through
    the general checks, which write the messages. Label ranges and duplicates are checked for all lines at once.
    A list that is not UTF-8 as a whole takes the general path line by line.
    """
    try:
        texts = data.decode("utf-8").split("\n")
    except UnicodeDecodeError:
        lines = _lines(data)
        rows, problems = _split_rows(lines, delimiter)
        entries, more = _parse_rows(rows, parse)
        return entries, problems + more, len(lines)
    if texts and texts[-1] == "":
        texts.pop()
    entries, problems = _Entries(), []
    numbers, paths, labels = entries.numbers, entries.paths, entries.labels
    raw_paths: dict[int, str] = {}  # a general line's path as written, for the duplicate message
    label_problems: dict[int, _BadLine] = {}
    for number, line in enumerate(texts, 1):
        path, found, label = line.rstrip(" ").rpartition(delimiter)
        # A plain path is one _clean_relpath would return unchanged, told by cheap tests: not empty, no leading
        # space, '/' or '.' (absolute, '..', './', hidden), no drive ('C:'), no empty or dot component ('//',
        # '/.') and no trailing '/', so normpath has nothing to change. A path that is not plain is not
        # necessarily bad: it goes through _clean_relpath, which decides.
        if (found and number > 1 and label.isascii() and label.isdigit() and len(label) <= _FAST_LABEL_DIGITS
                and path and not path[0].isspace() and path[0] not in "/." and path[1:2] != ":"
                and "/." not in path and "//" not in path and path[-1] != "/"):
            numbers.append(number)
            paths.append(path)
            labels.append(int(label))
            continue
        # Re-encoding gives the line's exact bytes back: the whole list decoded as strict UTF-8.
        rows, line_problems = _split_rows([line.encode("utf-8")], delimiter, first=number)
        if line_problems:
            problems.append(line_problems[0])
            continue
        _, relpath, label_text = rows[0]
        try:
            clean = _clean_relpath(relpath)
        except _BadLine as exc:
            problems.append(LineProblem(number, exc.kind, str(exc)))
            continue
        numbers.append(number)
        paths.append(clean)
        raw_paths[number] = relpath
        try:
            labels.append(parse(label_text))
        except _BadLine as exc:
            labels.append(-1)
            label_problems[number] = exc
    values = np.array(labels, np.int64)
    for i in np.flatnonzero(values >= parse.limit).tolist():
        try:
            parse(str(labels[i]))
        except _BadLine as exc:
            label_problems[numbers[i]] = exc
    duplicates = _duplicates(numbers, paths, raw_paths)
    # As in _parse_rows: a duplicate is reported as such whatever its label; the first line of a path counts
    # even when its own label is bad.
    problems += duplicates
    duplicated = {problem.line for problem in duplicates}
    problems += [LineProblem(n, exc.kind, str(exc)) for n, exc in label_problems.items() if n not in duplicated]
    if duplicated or label_problems:  # entries hold the good lines only, as _parse_rows's do
        entries = entries.without(duplicated | set(label_problems))
    return entries, problems, len(texts)


def _duplicates(numbers: list[int], paths: list[str], raw_paths: dict[int, str]) -> list[LineProblem]:
    """A problem for each line whose path an earlier line listed (one set when there is none, the usual case)."""
    if len(set(paths)) == len(paths):
        return []
    first_line: dict[str, int] = {}
    problems = []
    for number, clean in zip(numbers, paths, strict=True):
        if clean in first_line:
            problems.append(LineProblem(number, LISTED_TWICE, f"lists {raw_paths.get(number, clean)!r} again "
                                                              f"(first on line {first_line[clean]})"))
        else:
            first_line[clean] = number
    return problems


def _clean_relpath(relpath: str) -> str:
    if not relpath.strip():
        raise _BadLine("has an empty path", BAD_PATH)
    if os.path.isabs(relpath) or re.match(r"[A-Za-z]:[\\/]", relpath):
        raise _BadLine(f"has an absolute path {relpath!r}; paths are relative to data.root", BAD_PATH)
    clean = os.path.normpath(relpath)
    if clean == ".." or clean.startswith("../"):
        raise _BadLine(f"has path {relpath!r}, which leaves data.root", BAD_PATH)
    return clean


# A folder naming at least this many files of the list is listed once (scandir) instead of lstat-ing each file.
_LISTED_FOLDER = 32


def _file_problems(entries: _Entries, root: Path) -> list[LineProblem]:
    """Missing, non-regular and out-of-root files: one realpath per folder and per symlink, and per folder either
    one ``scandir`` (its plain files cost nothing more: their type comes with the listing) or an lstat per file.

    A name the listing does not show as a plain file (missing, a symlink, anything else) gets the lstat check,
    which writes the message, so both ways report the same problems.
    """
    real_root = os.path.realpath(root)
    if not os.path.isdir(real_root):
        raise DatasetError(f"data.root={str(root)!r} is not a directory")
    folders: dict[str, list[int]] = {}
    for i, relpath in enumerate(entries.paths):
        folders.setdefault(relpath.rpartition("/")[0], []).append(i)
    problems = []
    for folder, members in folders.items():
        directory = os.path.join(real_root, folder)
        inside = _inside(os.path.realpath(directory), real_root)
        plain = _plain_files(directory) if inside and len(members) >= _LISTED_FOLDER else frozenset()
        for i in members:
            relpath = entries.paths[i]
            if relpath.rpartition("/")[2] in plain:
                continue
            problem = _file_problem(os.path.join(real_root, relpath), real_root, inside)
            if problem:
                problems.append(LineProblem(entries.numbers[i], problem[0], f"names {relpath!r}, {problem[1]}"))
    return problems


def _plain_files(directory: str) -> frozenset[str]:
    """The names of the regular files (not symlinks) in ``directory``; empty when it cannot be listed."""
    try:
        with os.scandir(directory) as it:
            return frozenset(entry.name for entry in it if entry.is_file(follow_symlinks=False))
    except OSError:
        return frozenset()


def _file_problem(path: str, real_root: str, folder_inside: bool) -> tuple[str, str] | None:
    """(kind, what is wrong) for a listed file that cannot be a sample, else None."""
    if not folder_inside:
        return BAD_PATH, "whose folder is a symlink out of data.root"
    try:
        mode = os.lstat(path).st_mode
        if stat.S_ISLNK(mode):
            target = os.path.realpath(path)
            if not _inside(target, real_root):
                return BAD_PATH, "a symlink out of data.root"
            mode = os.stat(target).st_mode
    except FileNotFoundError:
        return MISSING_FILE, "which does not exist"
    except OSError as exc:
        return MISSING_FILE, f"which cannot be read ({exc.strerror})"
    return None if stat.S_ISREG(mode) else (BAD_PATH, f"which is {file_kind(mode)}, not an image file")


def _inside(path: str, directory: str) -> bool:
    return path == directory or path.startswith(directory.rstrip(os.sep) + os.sep)


def _report(problems: list[LineProblem], where: str, bad_lines: str) -> None:
    if not problems:
        return
    if bad_lines == "error":
        line, message = problems[0].line, problems[0].message
        more = f" ({len(problems) - 1} more bad lines)" if len(problems) > 1 else ""
        raise DatasetError(f"{where} line {line} {message}{more}; fix the list, or set data.bad_lines=skip to "
                           "skip bad lines with a warning each")
    for problem in problems[:_WARNED_LINES]:
        log.warning("%s line %d %s: skipped", where, problem.line, problem.message)
    if len(problems) > _WARNED_LINES:
        log.warning("%s: %d more bad lines skipped", where, len(problems) - _WARNED_LINES)
