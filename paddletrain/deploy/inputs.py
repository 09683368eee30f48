"""The image files a user names on the command line: a folder, a list file, a glob or one image.

Shared by ``paddletrain.predict`` (``input=``) and ``paddletrain.deploy.quantize`` (``calibration=``), which must not
import each other (predict exports checkpoints, and export quantizes).
"""
from __future__ import annotations

import glob
import os
from pathlib import Path

from paddletrain.errors import UserError

GLOB_CHARS = "*?["
# A single input file that is not an image is read as a list of paths when it has one of these suffixes.
LIST_SUFFIXES = ("", ".txt", ".lst", ".list")


def resolve_inputs(spec: str) -> list[str]:
    """The image paths ``spec`` names: a folder (recursive, image extensions), a list file, a glob or one image."""
    from paddletrain.data.formats.images import IMG_EXTENSIONS, is_image_file

    path = Path(spec)
    if path.is_file():
        if is_image_file(path):
            return [str(path)]
        if path.suffix.lower() not in LIST_SUFFIXES:
            raise UserError(f"input={spec!r}: {path.suffix} files are not supported; images must end with "
                            f"{', '.join(IMG_EXTENSIONS)} (any case), and a list of paths with .txt or .lst")
        return _nonempty(_read_list(path), f"the list file input={spec!r} names no paths")
    if path.is_dir():
        found = [os.path.join(root, name) for root, _, names in os.walk(path) for name in names if is_image_file(name)]
        return _nonempty(sorted(found), f"no image files under input={spec!r}")
    if any(c in spec for c in GLOB_CHARS):
        found = [p for p in glob.glob(spec, recursive=True) if os.path.isfile(p)]
        return _nonempty(sorted(found), f"the pattern input={spec!r} matches no files")
    raise UserError(f"input={spec!r} is neither a folder, a file nor a glob pattern that matches")


def _nonempty(paths: list[str], message: str) -> list[str]:
    if not paths:
        raise UserError(message)
    return paths


def _read_list(path: Path) -> list[str]:
    """Paths one a line (blank lines and ``#`` comments skipped), relative ones taken from the list's folder."""
    try:
        lines = path.read_text(encoding="utf-8").splitlines()
    except (OSError, UnicodeDecodeError) as exc:
        raise UserError(f"cannot read the list file input={str(path)!r}: {exc}") from exc
    entries = [line.strip() for line in lines if line.strip() and not line.strip().startswith("#")]
    return [entry if os.path.isabs(entry) else str(path.parent / entry) for entry in entries]
