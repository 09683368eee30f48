"""A dataset of image files laid out as ``root/<split>/<class>/<image>``, checked when it is built.

The class list is always taken from ``root/train`` (sorted directory names), so the validation split shares
the training labels even when it lacks some classes; a validation class unknown to training is an error.
Everything that can be checked without decoding (layout, extensions, empty classes, the class-names file) is
checked in ``__init__`` so a wrong path fails before the first epoch, not in the middle of it.
"""
from __future__ import annotations

import os
from pathlib import Path
from typing import List, Optional, Tuple, Union

from PIL import Image

from paddletrain.data.datasets import BadSampleError, DatasetError, ImageDataset, Transform

IMG_EXTENSIONS = (".jpg", ".jpeg", ".png", ".bmp", ".webp")
_MODES = {1: "L", 3: "RGB"}


def is_image_file(path: Union[str, Path]) -> bool:
    """A visible file with one of ``IMG_EXTENSIONS`` (any case)."""
    name = os.path.basename(path)
    return not name.startswith(".") and name.lower().endswith(IMG_EXTENSIONS)


def _class_dirs(split_dir: Path) -> List[str]:
    return sorted(e.name for e in os.scandir(split_dir) if e.is_dir() and not e.name.startswith("."))


def _split_dir(root: Path, split: str) -> Path:
    if not root.is_dir():
        raise DatasetError(f"imagefolder root {str(root)!r} (data.root) is not a directory")
    split_dir = root / split
    if not split_dir.is_dir():
        raise DatasetError(
            f"imagefolder split directory {str(split_dir)!r} is missing; "
            f"expected {str(root)}/{{train,val}}/<class>/<image>"
        )
    return split_dir


def read_class_names(path: Union[str, Path], expected: int) -> List[str]:
    """Display names, one a line (trailing blank lines ignored); their count must be ``expected``."""
    try:
        lines = Path(path).read_text(encoding="utf-8").splitlines()
    except OSError as e:
        raise DatasetError(f"cannot read class names file {str(path)!r} (data.class_names): {e}") from e
    while lines and not lines[-1].strip():
        lines.pop()
    names = [line.strip() for line in lines]
    blank = [i + 1 for i, name in enumerate(names) if not name]
    if blank:
        raise DatasetError(f"class names file {str(path)!r} has blank line(s) {blank}; give one name per line")
    if len(names) != expected:
        raise DatasetError(
            f"class names file {str(path)!r} has {len(names)} names but the train split has {expected} "
            "class directories"
        )
    return names


def _resolve_class_names(class_names: Union[str, Path], root: Path) -> Path:
    """A relative path is looked up from the working directory, then from the dataset root."""
    path = Path(class_names).expanduser()
    if path.is_absolute() or path.exists() or not (root / path).exists():
        return path
    return root / path


class ImageFolderDataset(ImageDataset):
    """Images under ``root/<split>/<class>/``, labelled by the sorted class directories of ``root/train``.

    Files whose extension is not in ``IMG_EXTENSIONS`` (case-insensitive) and hidden files or directories are
    ignored. ``class_names`` optionally names a text file with one display name per class (in sorted directory
    order) that replaces the directory names in ``classes``. Images are decoded with PIL and converted to RGB
    (``in_chans=3``) or grayscale (``in_chans=1``); a file that fails to decode raises ``BadSampleError`` naming
    it.
    """

    def __init__(
        self,
        root: Union[str, Path],
        split: str = "train",
        transform: Transform = None,
        class_names: Optional[Union[str, Path]] = None,
        in_chans: int = 3,
    ) -> None:
        super().__init__(transform)
        if in_chans not in _MODES:
            raise DatasetError(f"imagefolder in_chans must be 1 or 3, got {in_chans}")
        self.root = Path(root).expanduser()
        self.split = split
        self.in_chans = in_chans
        train_dir = _split_dir(self.root, "train")
        self.class_dirs = _class_dirs(train_dir)
        if not self.class_dirs:
            raise DatasetError(f"no class directories in {str(train_dir)!r}; expected {str(train_dir)}/<class>/<image>")
        self.samples = self._scan(_split_dir(self.root, split))
        self.targets = [label for _, label in self.samples]
        self.classes = (
            read_class_names(_resolve_class_names(class_names, self.root), len(self.class_dirs))
            if class_names
            else list(self.class_dirs)
        )

    def _scan(self, split_dir: Path) -> List[Tuple[str, int]]:
        present = _class_dirs(split_dir)
        if not present:
            raise DatasetError(f"no class directories in {str(split_dir)!r}; expected {str(split_dir)}/<class>/<image>")
        unknown = sorted(set(present) - set(self.class_dirs))
        if unknown:
            raise DatasetError(
                f"class directories {unknown} in {str(split_dir)!r} do not exist in the train split "
                f"{str(self.root / 'train')!r}"
            )
        label_of = {name: i for i, name in enumerate(self.class_dirs)}
        samples: List[Tuple[str, int]] = []
        for name in present:
            class_dir = split_dir / name
            files = sorted(
                os.path.join(dirpath, f)
                for dirpath, dirnames, filenames in os.walk(class_dir, followlinks=True)
                for f in filenames
                if is_image_file(f) and not _hidden_below(dirpath, class_dir)
            )
            if not files:
                raise DatasetError(
                    f"class directory {str(class_dir)!r} has no images (extensions: {', '.join(IMG_EXTENSIONS)})"
                )
            samples.extend((path, label_of[name]) for path in files)
        return samples

    def load_image(self, index: int) -> Image.Image:
        path = self.samples[index][0]
        try:
            with Image.open(path) as image:
                return image.convert(_MODES[self.in_chans])
        except (OSError, ValueError, SyntaxError, Image.DecompressionBombError) as e:
            raise BadSampleError(f"cannot decode image {path!r}: {e}", index, path) from e

    def describe(self, index: int) -> str:
        return self.samples[index][0]


def _hidden_below(dirpath: str, top: Path) -> bool:
    relative = os.path.relpath(dirpath, top)
    return relative != "." and any(part.startswith(".") for part in Path(relative).parts)
