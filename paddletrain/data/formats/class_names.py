"""Class-name files: one display name a line, in class-index order (``data.class_names``, predict's ``labels``).

Such a file may come from anyone, so it is bounded in size and read as UTF-8 text; the one reader here is shared
by training (image folders) and inference, which therefore accept and refuse the same files.
"""
from __future__ import annotations

from pathlib import Path

from paddletrain.errors import UserError

# A name file is a few bytes per class; refuse anything far larger than any real class list before reading it.
MAX_NAMES_FILE_BYTES = 16 * 2**20


def read_names_file(path: str | Path, what: str, error: type[UserError] = UserError) -> list[str]:
    """The names in ``path``, one a line (trailing blank lines ignored, surrounding spaces stripped).

    ``what`` names the file in messages (e.g. ``labels='labels.txt'``); every problem (not a file, too large, not
    UTF-8, a blank line between names) raises ``error`` in one line.
    """
    path = Path(path)
    try:
        if not path.is_file():
            raise error(f"{what} is not a file; give a text file with one class name per line")
        size = path.stat().st_size
        if size > MAX_NAMES_FILE_BYTES:
            raise error(f"{what} is {size} bytes, more than the {MAX_NAMES_FILE_BYTES} a list of class names "
                        "needs; is it the right file?")
        lines = path.read_text(encoding="utf-8").splitlines()
    except (OSError, UnicodeDecodeError) as exc:
        raise error(f"cannot read {what}: {exc}") from exc
    while lines and not lines[-1].strip():
        lines.pop()
    names = [line.strip() for line in lines]
    blank = [i + 1 for i, name in enumerate(names) if not name]
    if blank:
        raise error(f"{what} has blank line(s) {blank[:5]}; give one class name per line")
    return names
