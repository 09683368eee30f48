"""Label lists, read as users keep them: every problem found at start-up, named by list and line.

Three formats, one reader:

- PaddleClas's list: ``<path relative to data.root><delimiter><class index>`` a line (``data.delimiter``, a
  space by default). The path is everything before the last delimiter, so a path may contain spaces.
- CSV with a header (a ``.csv`` file, as Kaggle ships): the ``path`` and ``label`` columns, others ignored.
- PaddleClas's multi-label list (``multilabel=True``): ``<path><TAB><0/1 per class, comma-separated>``, split on
  the tab whatever the delimiter, as PaddleClas's ``MultiLabelDataset`` does.

A list is what the user wrote, so each line is checked before any training: not UTF-8, a byte-order mark, a CR
(Windows) line ending, a blank line, no label, a label that is not an integer or out of range, a path that is
empty, absolute or leaves ``data.root`` (``..`` or a symlink out), a duplicate path, a missing or non-regular
file. ``bad_lines="error"`` (the default) refuses the list at its first bad line, naming the list, the line and
the count of others; ``"skip"`` drops each bad line with a warning. A summary line says how many lines were used.
:func:`check_label_list` returns every bad line with its kind instead (for ``python -m paddletrain.data check``).
The list may come from someone else: its size is bounded and no file outside ``data.root`` is read.
"""
from __future__ import annotations

import logging
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
    require_root,
)
from paddletrain.data.formats.class_names import read_names_file
from paddletrain.data.formats.images import ImageReadError, open_image
from paddletrain.data.formats.label_list_file import (
    BAD_LINE_POLICIES,
    LINE_PROBLEM_KINDS,
    LabelList,
    LineProblem,
    ListCheck,
    check_label_list,
    read_label_list,
    resolve_list_path,
)
from paddletrain.data.formats.sample_index import SampleIndex

__all__ = ["BAD_LINE_POLICIES", "LINE_PROBLEM_KINDS", "LabelList", "LabelListDataset", "LineProblem", "ListCheck",
           "build_labellist", "check_label_list", "read_label_list", "resolve_list_path"]

log = logging.getLogger("paddletrain")

class LabelListDataset(ImageDataset):
    """The images of a :class:`SampleIndex` (a checked label list), decoded to RGB (``in_chans=3``) or grayscale.

    Labels are class indices (``int64``) or, for a multi-label index, multi-hot ``float32`` rows.
    """

    def __init__(self, index: SampleIndex, classes: list[str], transform: Transform = None, in_chans: int = 3) -> None:
        super().__init__(transform)
        if in_chans not in (1, 3):
            raise DatasetError(f"labellist in_chans must be 1 or 3, got {in_chans}")
        self.index = index
        self.classes = list(classes)
        self.targets = index.labels
        self.in_chans = in_chans

    def load_image(self, index: int) -> Image.Image:
        path = self.index.path(index)
        try:
            return open_image(path, "L" if self.in_chans == 1 else "RGB")
        except ImageReadError as e:
            raise BadSampleError(f"cannot decode image {path!r}: {e}", index, path) from e

    def describe(self, index: int) -> str:
        return self.index.path(index)

    @property
    def multilabel(self) -> bool:
        """Whether labels are multi-hot rows (the loaders stack them instead of reading class indices)."""
        return self.index.multilabel

    def __getitem__(self, index: int):
        if not self.index.multilabel:
            return super().__getitem__(index)
        index = self._check_index(index)
        image = self.load_image(index)
        return (self.transform(image) if self.transform is not None else image), self.targets[index].astype(
            np.float32)


def _list_key(cfg: Any, key: str) -> str:
    value = getattr(cfg, key, None)
    if not value:
        raise DatasetError(f"missing required value for data.{key}: data.name=labellist reads its samples from a "
                           f"list file (data.{key}=<file> of '<path> <label>' lines)")
    return str(value)


@register_dataset("labellist", eval_sources={"train_list": "val_list"})
def build_labellist(cfg: Any, train_transform: Transform, eval_transform: Transform) -> DatasetSplits:
    """``data.name=labellist``: ``data.train_list`` / ``data.val_list`` of paths relative to ``data.root``.

    ``data.class_names`` names the classes (line i names class i); without it the indices are the names and the
    training list's largest label sets the class count.
    """
    root = require_root(cfg)
    names = None
    if getattr(cfg, "class_names", None):
        names_path = resolve_list_path(cfg.class_names, root)
        names = read_names_file(names_path, f"data.class_names={str(names_path)!r}", DatasetError)
    options = dict(delimiter=getattr(cfg, "delimiter", " "), multilabel=bool(getattr(cfg, "multilabel", False)),
                   bad_lines=getattr(cfg, "bad_lines", "error"))
    train = read_label_list(resolve_list_path(_list_key(cfg, "train_list"), root), root, key="data.train_list",
                            num_classes=len(names) if names else None, **options)
    val = read_label_list(resolve_list_path(_list_key(cfg, "val_list"), root), root, key="data.val_list",
                          num_classes=train.num_classes, **options)
    classes = names or [str(i) for i in range(train.num_classes)]
    return DatasetSplits.of(LabelListDataset(train.index, classes, train_transform),
                            LabelListDataset(val.index, classes, eval_transform))
