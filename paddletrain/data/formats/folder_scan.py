"""The scan of an image folder, root/<split>/<class>/<image>, bounded and confined, with nothing of a framework:
the dataset (:mod:`paddletrain.data.formats.imagefolder`) and the dataset doctor (``python -m paddletrain.data check``)
share it.

Nothing outside ``data.root`` is read, no directory is walked twice, only regular files become samples, and
whatever is skipped is counted by reason (:class:`ScanReport`); the module :mod:`~paddletrain.data.formats.imagefolder`
says why each rule is there.
"""
from __future__ import annotations

import logging
import os
import stat
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from paddletrain.data.errors import DatasetError
from paddletrain.data.formats.class_names import read_names_file
from paddletrain.data.formats.images import file_kind, is_image_file

log = logging.getLogger("paddletrain")


SPLITS = ("train", "val")
_EXAMPLES = 3  # paths named per skip reason in warnings and errors

# Why an entry was skipped. The first three are always in the summary line, the others when they happened.
EXTENSION = "extension"
OUTSIDE_ROOT = "outside root"
NON_REGULAR = "non-regular"
OTHER_SPLIT = "other split"
VISITED = "visited"
BROKEN_LINK = "broken link"
UNREADABLE = "unreadable"
HIDDEN = "hidden"
_REASON_TEXT = {
    EXTENSION: "by extension",
    OUTSIDE_ROOT: "symlinks out of root",
    NON_REGULAR: "non-regular files",
    OTHER_SPLIT: "leading into another split",
    VISITED: "already visited (loops, duplicate links)",
    BROKEN_LINK: "broken symlinks",
    UNREADABLE: "unreadable directories",
    HIDDEN: "hidden",
}
_ALWAYS_SHOWN = (EXTENSION, OUTSIDE_ROOT, NON_REGULAR)
_WARN = {
    OUTSIDE_ROOT: "paddletrain reads images only inside data.root; point data.root at the folder that really "
                  "holds the images, or copy or hard-link them into it",
    NON_REGULAR: "a FIFO, socket or device is not an image, and reading one can block forever",
    OTHER_SPLIT: "followed, they would put the other split's images in this one",
    BROKEN_LINK: "their targets do not exist",
    UNREADABLE: "their images are missing from the split; check the permissions",
}

DirKey = tuple[int, int]


@dataclass
class ScanReport:
    """What the scan of one split found, and what it skipped by reason, with a few example paths each."""

    split: str
    images: int = 0
    classes: int = 0
    skipped: Counter = field(default_factory=Counter)
    extensions: Counter = field(default_factory=Counter)  # the extensions of the files skipped by extension
    examples: dict[str, list[str]] = field(default_factory=dict)
    # (reason, path, detail) of every skip, when the caller asked for them all (a dataset check); else None
    every_skip: list[tuple[str, str, str]] | None = None

    def skip(self, reason: str, path: str, detail: str = "") -> None:
        self.skipped[reason] += 1
        if self.every_skip is not None:
            self.every_skip.append((reason, path, detail))
        if reason == EXTENSION:
            self.extensions[os.path.splitext(path)[1].lower() or "(no extension)"] += 1
        shown = self.examples.setdefault(reason, [])
        if len(shown) < _EXAMPLES:
            shown.append(f"{path!r}{detail}")

    def describe_skips(self, reasons: tuple[str, ...] = _ALWAYS_SHOWN) -> str:
        """E.g. ``1 by extension (.gif: 1), 0 symlinks out of root, 0 non-regular files``; ``reasons`` are shown
        even when nothing was skipped for them."""
        parts = []
        for reason in _REASON_TEXT:
            count = self.skipped[reason]
            if reason in reasons or count:
                text = f"{count} {_REASON_TEXT[reason]}"
                if reason == EXTENSION and count:
                    text += " (" + ", ".join(f"{ext}: {n}" for ext, n in sorted(self.extensions.items())) + ")"
                parts.append(text)
        return ", ".join(parts)

    def summary(self) -> str:
        """The line logged per split, e.g. ``train: 245 images in 2 classes; skipped 1 by extension (.gif: 1), ...``."""
        return f"{self.split}: {self.images} images in {self.classes} classes; skipped {self.describe_skips()}"

    def warnings(self) -> list[str]:
        """One line per skip reason the user should act on, naming examples and what to do."""
        return [f"skipped {self.skipped[reason]} {_REASON_TEXT[reason]}: "
                f"{', '.join(self.examples[reason])}{' ...' if self.skipped[reason] > _EXAMPLES else ''} "
                f"- {advice}" for reason, advice in _WARN.items() if self.skipped[reason]]

    def to_dict(self) -> dict[str, Any]:
        """Plain JSON data (for the scan cache); :meth:`from_dict` reads it back."""
        return {"split": self.split, "images": self.images, "classes": self.classes, "skipped": dict(self.skipped),
                "extensions": dict(self.extensions), "examples": self.examples}

    @classmethod
    def from_dict(cls, data: Any) -> ScanReport:
        """The report :meth:`to_dict` wrote; ValueError if ``data`` does not have its shape (a damaged cache)."""
        def counts(value: Any) -> Counter:
            if not isinstance(value, dict) or not all(isinstance(k, str) and isinstance(n, int) and n >= 0
                                                      for k, n in value.items()):
                raise ValueError("a count table is not names and counts")
            return Counter(value)

        if not isinstance(data, dict) or not isinstance(data.get("split"), str) or not all(
                isinstance(data.get(k), int) for k in ("images", "classes")):
            raise ValueError("not a scan report")
        examples = data.get("examples")
        if not isinstance(examples, dict) or not all(
                isinstance(v, list) and len(v) <= _EXAMPLES and all(isinstance(x, str) for x in v)
                for v in examples.values()):
            raise ValueError("its examples are not lists of paths")
        return cls(data["split"], data["images"], data["classes"], counts(data.get("skipped")),
                   counts(data.get("extensions")), examples)


def _inside(path: str, directory: str) -> bool:
    return path == directory or path.startswith(directory.rstrip(os.sep) + os.sep)


def _key(st: os.stat_result) -> DirKey:
    return st.st_dev, st.st_ino


class SplitScan:
    """Walk the class directories of one split once, confined to the root; see the module docstring.

    Every class is first walked without following links (so an image reached by a link as well as directly
    keeps its own class); the links met on the way are then followed in sorted order, breadth first, each
    linked directory walked the same way.
    """

    def __init__(self, root: Path, split: str, split_dir: Path, other_splits: tuple[str, ...] = SPLITS,
                 record_skips: bool = False) -> None:
        self.report = ScanReport(split, every_skip=[] if record_skips else None)
        self.real_root = os.path.realpath(root)
        real_split = os.path.realpath(split_dir)
        if not _inside(real_split, self.real_root):
            raise DatasetError(f"imagefolder split directory {str(split_dir)!r} is a symlink to {real_split!r}, "
                               f"outside data.root {str(root)!r}: {_WARN[OUTSIDE_ROOT]}")
        # The root and the split directory are ancestors of every class: a link back to them is a loop.
        self.visited: set[DirKey] = {_key(os.stat(self.real_root)), _key(os.stat(real_split))}
        self.walked: set[DirKey] = set()  # directories whose image files are samples
        self.linked: set[tuple[int, int, str]] = set()  # (parent directory key, name) of files taken via links
        self.forbidden: set[DirKey] = set()
        self.forbidden_paths: list[str] = []
        for other in dict.fromkeys((*other_splits, split)):
            other_dir = root / other
            if other == split or not other_dir.is_dir():
                continue
            real_other = os.path.realpath(other_dir)
            if _inside(real_other, real_split) or _inside(real_split, real_other):
                raise DatasetError(f"imagefolder splits {str(split_dir)!r} and {str(other_dir)!r} overlap (one is "
                                   "inside the other or both are the same folder): they would share images")
            self.forbidden.add(_key(os.stat(other_dir)))
            self.forbidden_paths.append(real_other)
        self.files: dict[int, list[str]] = {}
        self.class_skips: dict[int, ScanReport] = {}
        self._links: list[tuple[str, int]] = []
        # For the scan cache: every directory walked with its stat (taken before it was listed), and whether a
        # symlink was met (then the result depends on directories the walk did not list).
        self.listed: list[tuple[str, os.stat_result]] = []
        self.met_links = False

    def run(self, class_dirs: list[tuple[Path, int]]) -> list[tuple[str, int]]:
        """(path, label) of every image, by label then path; class directories are ``(path, label)``."""
        roots = []
        for path, label in class_dirs:
            self.files[label] = []
            self.class_skips[label] = ScanReport(self.report.split)
            linked = path.is_symlink()
            self.met_links |= linked
            key = self._enter_linked_class(str(path), label) if linked else \
                self._enter(str(path), os.stat(path), label)
            if key:
                roots.append((str(path), key, label))
        for path, key, label in roots:  # claim every class root before walking any, so links between classes are seen
            self._walk(path, key, label)
        while self._links:
            links, self._links = sorted(self._links), []
            for path, label in links:
                self._follow(path, label)
        self.report.classes = len(class_dirs)
        samples = [(path, label) for label in sorted(self.files) for path in sorted(self.files[label])]
        self.report.images = len(samples)
        return samples

    def _skip(self, reason: str, path: str, label: int, detail: str = "") -> None:
        self.report.skip(reason, path, detail)
        self.class_skips[label].skip(reason, path, detail)

    def _enter(self, path: str, st: os.stat_result, label: int) -> DirKey | None:
        """Mark a directory as walked and return its key, unless it is another split's or walked already."""
        key = _key(st)
        if key in self.forbidden:
            self._skip(OTHER_SPLIT, path, label)
        elif key in self.visited:
            self._skip(VISITED, path, label)
        else:
            self.visited.add(key)
            self.walked.add(key)
            self.listed.append((path, st))
            return key
        return None

    def _walk(self, top: str, top_key: DirKey, label: int) -> None:
        """Every directory under ``top`` (without following links) adds its image files to ``label``."""
        stack = [(top, top_key)]
        while stack:
            directory, (dev, ino) = stack.pop()
            try:
                with os.scandir(directory) as it:
                    entries = list(it)
            except OSError as exc:
                self._skip(UNREADABLE, directory, label, f" ({exc.strerror})")
                continue
            for entry in entries:
                if entry.name.startswith("."):
                    self._skip(HIDDEN, entry.path, label)
                elif entry.is_symlink():
                    self._links.append((entry.path, label))
                    self.met_links = True
                elif entry.is_dir(follow_symlinks=False):
                    key = self._enter(entry.path, entry.stat(follow_symlinks=False), label)
                    if key:
                        stack.append((entry.path, key))
                elif not entry.is_file(follow_symlinks=False):  # from d_type: plain files cost no stat
                    kind = file_kind(entry.stat(follow_symlinks=False).st_mode)
                    self._skip(NON_REGULAR, entry.path, label, f" ({kind})")
                elif not is_image_file(entry.name):
                    self._skip(EXTENSION, entry.path, label)
                elif self.linked and (dev, ino, entry.name) in self.linked:  # taken already through a file link
                    self._skip(VISITED, entry.path, label)
                else:
                    self.files[label].append(entry.path)

    def _resolve(self, link: str, label: int) -> tuple[str, os.stat_result] | None:
        """The target of ``link`` and its stat, or None (counted) when it leads out of the root, into another
        split or nowhere. A target outside the root is never stat-ed, listed or opened."""
        real = os.path.realpath(link)
        if not _inside(real, self.real_root):
            self._skip(OUTSIDE_ROOT, link, label, f" -> {real!r}")
            return None
        if any(_inside(real, other) for other in self.forbidden_paths):
            self._skip(OTHER_SPLIT, link, label, f" -> {real!r}")
            return None
        try:
            return real, os.stat(real)
        except OSError as exc:
            self._skip(BROKEN_LINK, link, label, f" ({exc.strerror})")
            return None

    def _enter_linked_class(self, link: str, label: int) -> DirKey | None:
        """A class directory that is itself a symlink: claimed like any class root if its target is allowed."""
        resolved = self._resolve(link, label)
        if resolved is None:
            return None
        return self._enter(link, resolved[1], label)  # a class is listed only if its target is a directory

    def _follow(self, link: str, label: int) -> None:
        resolved = self._resolve(link, label)
        if resolved is None:
            return
        real, st = resolved
        if stat.S_ISDIR(st.st_mode):
            key = self._enter(link, st, label)
            if key:
                self._walk(link, key, label)  # through the link, so the samples' paths stay under their class
        elif not stat.S_ISREG(st.st_mode):
            self._skip(NON_REGULAR, link, label, f" -> {real!r} ({file_kind(st.st_mode)})")
        elif not is_image_file(link):
            self._skip(EXTENSION, link, label)
        else:
            parent, name = os.path.split(real)
            parent_key = _key(os.stat(parent))
            if (parent_key in self.walked and is_image_file(name)) or (*parent_key, name) in self.linked:
                self._skip(VISITED, link, label, f" -> {real!r}")
            else:
                self.linked.add((*parent_key, name))
                self.files[label].append(link)


def relative_paths(root: str, paths: list[str]) -> list[str]:
    """``paths`` relative to ``root``; the scan builds them all from the root, so slicing is enough (and fast)."""
    prefix = os.path.join(root, "")
    return [p[len(prefix):] if p.startswith(prefix) else os.path.relpath(p, root) for p in paths]


def class_dirs(split_dir: Path) -> list[str]:
    """The class directories of a split, sorted: its visible sub-directories (or links to directories)."""
    return sorted(e.name for e in os.scandir(split_dir) if e.is_dir() and not e.name.startswith("."))


def has_links(directory: Path) -> bool:
    """Whether ``directory`` holds a symlink (its class list then depends on where the link leads)."""
    with os.scandir(directory) as it:
        return any(entry.is_symlink() for entry in it)
@dataclass
class SplitContents:
    """What :func:`scan_split` found: ``(path, label)`` samples by label then path, the scan's report, the class
    directories without any image (mapped to what was skipped in them) and those unknown to the class list (not
    scanned)."""

    samples: list[tuple[str, int]]
    report: ScanReport
    empty: dict[str, str]
    unknown: list[str]
    scan: SplitScan  # what the walk met (symlinks, the directories it listed), for the scan cache


def scan_split(root: Path, split: str, classes: list[str], split_dir: Path | None = None, *,
               other_splits: tuple[str, ...] = SPLITS, record_skips: bool = False) -> SplitContents:
    """Scan ``split_dir`` (default ``root/split``) confined to ``root``: each class directory named in ``classes``
    gives the samples of its index; a split directory in ``other_splits`` is never entered.

    ``record_skips`` keeps every skipped path in ``report.every_skip`` (not only a few examples).
    """
    split_dir = root / split if split_dir is None else split_dir
    present = class_dirs(split_dir)
    label_of = {name: i for i, name in enumerate(classes)}
    scan = SplitScan(root, split, split_dir, other_splits, record_skips)
    samples = scan.run([(split_dir / name, label_of[name]) for name in present if name in label_of])
    empty = {}
    for name in present:
        label = label_of.get(name)
        if label is not None and not scan.files[label]:
            skips = scan.class_skips[label]
            why = skips.warnings() or ([f"skipped {skips.describe_skips(())}"] if skips.skipped else [])
            empty[name] = "".join("; " + line for line in why)
    return SplitContents(samples, scan.report, empty, [name for name in present if name not in label_of], scan)


def scan_class_folder(folder: Path) -> tuple[list[str], SplitContents, list[str]]:
    """A folder of ``<class>/<image>`` folders scanned as a split is (confined to it): its class names, what the
    scan found, and the scan's warnings, each naming the folder (``data split`` and ``data pack`` read folders so).

    Raises:
        DatasetError: no class folder, or what :func:`scan_split` refuses.
    """
    classes = class_dirs(folder)
    if not classes:
        raise DatasetError(f"no class folders in {str(folder)!r}; expected {folder}/<class>/<image>")
    contents = scan_split(folder, folder.name, classes, folder, other_splits=())
    return classes, contents, [f"{folder}: {line}" for line in contents.report.warnings()]


def split_dir_of(root: Path, split: str) -> Path:
    if not root.is_dir():
        raise DatasetError(f"imagefolder root {str(root)!r} (data.root) is not a directory")
    split_dir = root / split
    if not split_dir.is_dir():
        raise DatasetError(
            f"imagefolder split directory {str(split_dir)!r} is missing; "
            f"expected {str(root)}/{{train,val}}/<class>/<image>"
        )
    return split_dir


def read_class_names(path: str | Path, expected: int) -> list[str]:
    """Display names, one a line (trailing blank lines ignored); their count must be ``expected``."""
    names = read_names_file(path, f"class names file {str(path)!r} (data.class_names)", DatasetError)
    if len(names) != expected:
        raise DatasetError(
            f"class names file {str(path)!r} has {len(names)} names but the train split has {expected} "
            "class directories"
        )
    return names


def resolve_class_names(class_names: str | Path, root: Path) -> Path:
    """A relative path is looked up from the working directory, then from the dataset root."""
    path = Path(class_names).expanduser()
    if path.is_absolute() or path.exists() or not (root / path).exists():
        return path
    return root / path
