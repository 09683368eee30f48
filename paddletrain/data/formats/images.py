"""Reading one image file: which files count as images, opening them safely, converting them to 8 bits.

The one home of image decoding: the image-folder dataset, the predict decode workers and the eval/export
preprocessing all go through :func:`open_image` and :func:`to_mode`, so a file is accepted, refused or
converted the same way in training and in inference.

- Only regular files are opened. A FIFO, socket or device named ``x.jpg`` is refused after a ``stat``
  (never opened: opening a FIFO blocks until a writer appears, which may be never); the ``open`` that follows
  is non-blocking and checked again with ``fstat``, so a file swapped for a FIFO in between cannot hang either.
- An image above ``PIL.Image.MAX_IMAGE_PIXELS`` is an error, not PIL's warning: its size is read from the
  header, before anything is decoded, so a decompression bomb costs nothing.
- 16-bit images are scaled to 8 bits by their full range (``value >> 8``), where PIL's own ``convert`` clips
  every value above 255 to white. PIL already reads 48-bit RGB and 64-bit RGBA files this way.
"""
from __future__ import annotations

import io
import os
import stat
import warnings
from pathlib import Path
from typing import BinaryIO

import numpy as np
from PIL import Image, UnidentifiedImageError

# What a torchvision ImageFolder user expects, every one of them decoded by Pillow. GIF is left out, as in
# torchvision: usually an animation or a placeholder ("imageNotFound.gif" in a scraped dataset).
IMG_EXTENSIONS = (".jpg", ".jpeg", ".png", ".ppm", ".pgm", ".bmp", ".tif", ".tiff", ".webp")

SIXTEEN_BIT_MODES = ("I;16", "I;16L", "I;16B", "I;16N")
_MAX_16_BIT = 65535


class ImageReadError(ValueError):
    """A file could not be read as an image; the message says why (the caller names the file)."""


def is_image_file(path: str | Path) -> bool:
    """A visible file whose name ends with one of ``IMG_EXTENSIONS`` (any case)."""
    name = os.path.basename(path)
    return not name.startswith(".") and name.lower().endswith(IMG_EXTENSIONS)


def file_kind(mode: int) -> str:
    """A short name for a ``st_mode`` that is not a regular file, for messages."""
    kinds = ((stat.S_ISFIFO, "a FIFO"), (stat.S_ISSOCK, "a socket"), (stat.S_ISCHR, "a character device"),
             (stat.S_ISBLK, "a block device"), (stat.S_ISDIR, "a directory"))
    return next((name for test, name in kinds if test(mode)), "not a regular file")


def open_image(path: str | Path, mode: str | None = None) -> Image.Image:
    """Decode the image file at ``path`` (following symlinks), converted to ``mode`` ("RGB", "L") when given.

    Raises:
        ImageReadError: the path is not a regular file, cannot be opened or decoded, is larger than
            ``PIL.Image.MAX_IMAGE_PIXELS`` or has a pixel format without a known range (32-bit float).
    """
    try:
        with open_regular(path) as file:
            return _decode(file, mode)
    except ImageReadError:
        raise
    except OSError as exc:
        raise ImageReadError(f"{type(exc).__name__}: {exc}") from exc


def decode_image(data: bytes, mode: str | None = None) -> Image.Image:
    """Decode an image held in memory (a member of a tar shard), with the checks of :func:`open_image`.

    Raises:
        ImageReadError: the bytes are not an image Pillow reads, decode to more than ``PIL.Image.MAX_IMAGE_PIXELS``
            or have a pixel format without a known range.
    """
    return _decode(io.BytesIO(data), mode)


def _decode(file: BinaryIO, mode: str | None) -> Image.Image:
    try:
        with warnings.catch_warnings():  # process-wide filters, changed only for this one open
            # PIL only warns between MAX_IMAGE_PIXELS and twice that; here any excess is an error.
            warnings.simplefilter("error", Image.DecompressionBombWarning)
            image = Image.open(file)
            image.load()
        return to_mode(image, mode) if mode else image
    except ImageReadError:
        raise
    except UnidentifiedImageError as exc:  # PIL's own text names the file object, not the path
        raise ImageReadError("UnidentifiedImageError: not an image format Pillow reads, or a corrupt header") from exc
    except (Image.DecompressionBombWarning, Image.DecompressionBombError) as exc:
        raise ImageReadError(f"{exc} Raise PIL.Image.MAX_IMAGE_PIXELS if the image is genuine.") from exc
    except Exception as exc:  # PIL raises many types (OSError, ValueError, SyntaxError, struct.error, ...)
        raise ImageReadError(f"{type(exc).__name__}: {exc}") from exc


def open_regular(path: str | Path) -> BinaryIO:
    """``path`` opened for binary reading, only if it is a regular file (symlinks followed).

    Raises:
        ImageReadError: it is a FIFO, socket, device or directory (checked before opening, so nothing blocks,
            and again on the open file, in case it was swapped in between).
        OSError: it does not exist or cannot be opened.
    """
    _require_regular(os.stat(path).st_mode)
    fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | getattr(os, "O_CLOEXEC", 0))
    file = os.fdopen(fd, "rb")
    try:
        _require_regular(os.fstat(file.fileno()).st_mode)  # in case it was swapped since the stat
    except ImageReadError:
        file.close()
        raise
    return file


def _require_regular(kind: int) -> None:
    if not stat.S_ISREG(kind):
        raise ImageReadError(f"{file_kind(kind)}, not a regular file: not read (it could block forever)")


def to_mode(image: Image.Image, mode: str) -> Image.Image:
    """``image`` in ``mode`` ("RGB", "L", ...), with 16-bit pixels scaled to 8 bits rather than clipped.

    Integer mode "I" (how PIL reads 16-bit PGM) is taken as 16-bit when its values fit 0..65535; other
    ranges, and float images (mode "F"), have no known full scale and are refused with ``ImageReadError``.
    """
    if image.mode == mode:
        return image
    if image.mode in SIXTEEN_BIT_MODES or image.mode == "I":
        image = _sixteen_to_eight_bits(image)
    elif image.mode == "F" or image.mode.startswith("I;"):
        raise ImageReadError(f"pixel format {image.mode!r} (32-bit or float) has no known range to scale to "
                             "8 bits; save the image with 8 or 16 bits per channel")
    return image if image.mode == mode else image.convert(mode)


def _sixteen_to_eight_bits(image: Image.Image) -> Image.Image:
    pixels = np.asarray(image)
    if image.mode == "I" and pixels.size and (pixels.min() < 0 or pixels.max() > _MAX_16_BIT):
        raise ImageReadError(f"32-bit integer pixels range {pixels.min()}..{pixels.max()}, beyond 16 bits: no "
                             "known range to scale to 8 bits; save the image with 8 or 16 bits per channel")
    return Image.fromarray((pixels.astype(np.uint32) >> 8).astype(np.uint8))  # a 2-D uint8 array: mode "L"
