"""A dataset of image files laid out as ``root/<split>/<class>/<image>``, checked when it is built.

The class list is always taken from ``root/train`` (sorted directory names), so the validation split shares
the training labels even when it lacks some classes; a validation class unknown to training is an error.
Everything that can be checked without decoding (layout, extensions, empty classes, the class-names file) is
checked in ``__init__`` so a wrong path fails before the first epoch, not in the middle of it.

The folder may come from someone else, so the scan is bounded and confined (:class:`SplitScan`):

- Nothing outside ``data.root`` is read: a symlink is followed only when its resolved target lies inside the
  resolved root, and never into the other split (a ``train`` link into ``val`` would leak validation images).
- No directory is walked twice (directories are tracked by ``(st_dev, st_ino)``, so loops and bind mounts end),
  and no file is counted twice (a link to a file that is already a sample, or already linked, is a duplicate).
  Images stay labelled by the class directory they physically live in: every class is walked without
  following links before any link is followed.
- Only regular files become samples; FIFOs, sockets and devices are skipped unopened.
- The scan costs one ``scandir`` per directory, one ``stat`` per directory and per symlink, none per plain file.
- Whatever is skipped is counted by reason; one INFO line per split says so, and the reasons a user must act on
  (files outside the root, non-regular files, broken links, unreadable directories) also get a WARNING naming
  examples.
"""
from __future__ import annotations

import logging
import os
import stat
from pathlib import Path
from typing import Any

from PIL import Image

from paddletrain.data.datasets import (
    BadSampleError,
    DatasetError,
    DatasetSplits,
    ImageDataset,
    Transform,
    register_dataset,
    require_root,
)
from paddletrain.data.formats.folder_scan import (
    ScanReport,
    SplitContents,
    SplitScan,
    class_dirs,
    has_links,
    read_class_names,
    relative_paths,
    resolve_class_names,
    scan_split,
    split_dir_of,
)
from paddletrain.data.formats.images import IMG_EXTENSIONS, ImageReadError, is_image_file, open_image
from paddletrain.data.formats.sample_index import SampleIndex
from paddletrain.data.formats.scancache import load_scan, save_scan

__all__ = ["IMG_EXTENSIONS", "ImageFolderDataset", "ScanReport", "SplitContents", "build_imagefolder", "class_dirs",
           "is_image_file", "read_class_names", "scan_split"]

log = logging.getLogger("paddletrain")

_MODES = {1: "L", 3: "RGB"}

class ImageFolderDataset(ImageDataset):
    """Images under ``root/<split>/<class>/``, labelled by the sorted class directories of ``root/train``.

    Files with an extension in ``IMG_EXTENSIONS`` (case-insensitive) are samples; other files, hidden files or
    directories, non-regular files and symlinks leaving ``root`` (or leading into the other split) are skipped
    and counted in ``scan_report``, which is logged as one line per split. ``class_names`` optionally names a
    text file with one display name per class (in sorted directory order) that replaces the directory names in
    ``classes``. Images are decoded by :func:`paddletrain.data.formats.images.open_image` and converted to RGB
    (``in_chans=3``) or grayscale (``in_chans=1``); a file that fails raises ``BadSampleError`` naming it.
    """

    def __init__(
        self,
        root: str | Path,
        split: str = "train",
        transform: Transform = None,
        class_names: str | Path | None = None,
        in_chans: int = 3,
        scan_cache: bool = True,
    ) -> None:
        super().__init__(transform)
        if in_chans not in _MODES:
            raise DatasetError(f"imagefolder in_chans must be 1 or 3, got {in_chans}")
        self.root = Path(root).expanduser()
        self.split = split
        self.in_chans = in_chans
        train_dir = split_dir_of(self.root, "train")
        cached = self._cached_scan() if scan_cache else None
        if cached is None:
            self.class_dirs, self.index, self.scan_report = self._scan(train_dir, scan_cache)
        else:
            self.class_dirs, self.index, self.scan_report = cached
        log.info("%s", self.scan_report.summary())
        for line in self.scan_report.warnings():
            log.warning("%s: %s", self.split, line)
        self.targets = self.index.labels
        self.classes = (
            read_class_names(resolve_class_names(class_names, self.root), len(self.class_dirs))
            if class_names
            else list(self.class_dirs)
        )

    def _cached_scan(self) -> tuple[list[str], SampleIndex, ScanReport] | None:
        """The class list, index and report of this split from the scan cache, if the folder is unchanged."""
        cached = load_scan(self.root, self.split)
        if cached is None:
            return None
        index, meta = cached
        try:
            report = ScanReport.from_dict(meta.get("report"))
        except ValueError as exc:
            log.info("ignoring the cached scan of %s/%s: %s", self.root, self.split, exc)
            return None
        log.info("%s: the scan of %s is unchanged since it was cached; reusing it (data.scan_cache=false scans "
                 "again)", self.split, self.root)
        return list(meta["class_dirs"]), index, report

    def _scan(self, train_dir: Path, cache: bool) -> tuple[list[str], SampleIndex, ScanReport]:
        """Scan the split (and cache the result when ``cache`` and the scan allows it): class directories of
        ``root/train``, the split's index, its report."""
        # Stamps of the directories whose listings the class list and the split's layout come from, each taken
        # before it is listed (see paddletrain.data.formats.scancache).
        top = {rel: os.lstat(self.root / rel) for rel in ("", "train")}
        names = class_dirs(train_dir)
        if not names:
            raise DatasetError(f"no class directories in {str(train_dir)!r}; expected {str(train_dir)}/<class>/<image>")
        split_dir = split_dir_of(self.root, self.split)
        top.setdefault(self.split, os.lstat(split_dir))
        present = class_dirs(split_dir)
        if not present:
            raise DatasetError(f"no class directories in {str(split_dir)!r}; expected {str(split_dir)}/<class>/<image>")
        unknown = sorted(set(present) - set(names))
        if unknown:
            raise DatasetError(
                f"class directories {unknown} in {str(split_dir)!r} do not exist in the train split "
                f"{str(self.root / 'train')!r}"
            )
        found = scan_split(self.root, self.split, names, split_dir)
        for name, why in found.empty.items():
            raise DatasetError(f"class directory {str(split_dir / name)!r} has no images (extensions: "
                               f"{', '.join(IMG_EXTENSIONS)}){why}")
        relpaths = relative_paths(str(self.root), [path for path, _ in found.samples])
        index = SampleIndex.build(self.root, relpaths, [label for _, label in found.samples])
        if cache:
            self._save_scan(found.scan, index, relpaths, names, top, (train_dir, split_dir))
        return names, index, found.report

    def _save_scan(self, scan: SplitScan, index: SampleIndex, relpaths: list[str], class_dirs: list[str],
                   top: dict[str, os.stat_result], listings: tuple[Path, ...]) -> None:
        """Cache the scan, unless a symlink was met on the way (its target lies in directories not stamped)."""
        if scan.met_links or any(stat.S_ISLNK(st.st_mode) for st in top.values()) or any(map(has_links, listings)):
            log.debug("scan of %s/%s not cached: it met a symlink", self.root, self.split)
            return
        listed = relative_paths(str(self.root), [path for path, _ in scan.listed])
        dirs = [*top.items(), *((rel, st) for rel, (_, st) in zip(listed, scan.listed, strict=True))]
        save_scan(self.root, self.split, index, relpaths, {"class_dirs": class_dirs, "report": scan.report.to_dict()},
                  dirs)

    @property
    def samples(self) -> list[tuple[str, int]]:
        """``(path, label)`` of every image, as torchvision's ``ImageFolder`` has them (built from the index)."""
        return [(self.index.path(i), int(label)) for i, label in enumerate(self.index.labels)]

    def load_image(self, index: int) -> Image.Image:
        path = self.index.path(index)
        try:
            return open_image(path, _MODES[self.in_chans])
        except ImageReadError as e:
            raise BadSampleError(f"cannot decode image {path!r}: {e}", index, path) from e

    def describe(self, index: int) -> str:
        return self.index.path(index)


@register_dataset("imagefolder")
def build_imagefolder(cfg: Any, train_transform: Transform, eval_transform: Transform) -> DatasetSplits:
    """``data.name=imagefolder``: ``data.root/{train,val}/<class>/<image>``, named by ``data.class_names``."""
    root = require_root(cfg)
    cache = bool(getattr(cfg, "scan_cache", True))
    return DatasetSplits.of(
        ImageFolderDataset(root, "train", transform=train_transform, class_names=cfg.class_names, scan_cache=cache),
        ImageFolderDataset(root, "val", transform=eval_transform, class_names=cfg.class_names, scan_cache=cache))
