"""Checks for values read from files someone else may have written: checkpoints, state files, pointers.

Anyone can hand a user a run directory, so a name or number read from one is untrusted input. This module is
the one home of the rules:

* a path read from such a file stays inside its root: not absolute, no ``..``, and no symlink (anywhere on
  the way) that leads out once resolved (:func:`confined_path`);
* a size or count is an ``int`` (not a ``bool``, not a float) within its range before anything uses it
  (:func:`checked_int`), and other scalars have the type their reader expects.

A failed check raises :class:`StateValueError` naming the key; whoever knows the file the value came from
(``Trainer.restore``, ``load_checkpoint``) names it too (:meth:`StateValueError.in_file`).
"""
from __future__ import annotations

import math
import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import numpy as np

from .errors import CheckpointError

# Every step, epoch, batch or byte count a real run reaches is far below this, and ints up to it stay exact as
# float64 (JSON readers in other languages, the metrics code).
MAX_COUNT = 2**53


class StateValueError(CheckpointError):
    """A value read from a checkpoint or state file is missing, of the wrong type or out of range.

    ``key`` is the dotted place of the value in the state (``progress.global_step``), ``problem`` what is wrong.
    """

    def __init__(self, key: str, problem: str) -> None:
        self.key, self.problem = key, problem
        super().__init__(f"{key} {problem}" if key else problem)

    def under(self, prefix: str) -> StateValueError:
        """The same error with ``prefix`` put in front of the key (a caller one level up knows more)."""
        return StateValueError(f"{prefix}.{self.key}" if self.key else prefix, self.problem)

    def in_file(self, path: str | os.PathLike) -> CheckpointError:
        """The one-line error a user sees: the file, the key and what is wrong with its value."""
        return CheckpointError(f"checkpoint file {path}: {self}")


def show(value: Any, limit: int = 60) -> str:
    """``repr(value)``, cut to ``limit`` characters: a crafted value must not flood the error line."""
    text = repr(value)
    return text if len(text) <= limit else text[: limit - 3] + "..."


def confined_path(root: str | os.PathLike, name: Any, key: str, *, plain_name: bool = False) -> Path:
    """``root / name``, refusing any ``name`` that could lead outside ``root``.

    ``name`` must be a non-empty relative path without ``..`` components or NUL bytes; with ``plain_name`` it
    must be one file or directory name that does not start with a dot (hidden entries are in-flight saves).
    Then both paths are resolved, following every symlink, and the result must still lie inside ``root``: a
    symlink inside ``root`` that points out is refused like ``../..``. ``root`` itself may be a symlink.

    Raises:
        StateValueError: naming ``key``, the value and why it is refused.
    """
    if not isinstance(name, str) or not name:
        raise StateValueError(key, f"is {show(name)}: expected a non-empty file name")
    if "\x00" in name:
        raise StateValueError(key, f"is {show(name)}: a name cannot hold a NUL byte")
    parts = name.replace("\\", "/").split("/")
    if plain_name and (len(parts) > 1 or name.startswith(".")):
        raise StateValueError(key, f"is {show(name)}: expected a plain name, without a path or a leading dot")
    if os.path.isabs(name) or name.startswith(("/", "\\")) or Path(name).drive:
        raise StateValueError(key, f"is the absolute path {show(name)}: only names inside {root} are allowed")
    if ".." in parts:
        raise StateValueError(key, f"is {show(name)}: '..' would lead outside {root}")
    root = Path(root)
    path = root / name
    real_root, real_path = os.path.realpath(root), os.path.realpath(path)
    if os.path.commonpath([real_root, real_path]) != real_root:
        raise StateValueError(key, f"is {show(name)}: {path} is a symlink (or lies below one) that leads "
                                   f"outside {root}, to {real_path}")
    return path


def check_inside(path: str | os.PathLike, root: str | os.PathLike, key: str) -> Path:
    """``path`` itself when it lies lexically inside ``root``, after :func:`confined_path` checks it there.

    A directory a run writes into (``<run_dir>/checkpoints``) must not be a symlink out of the run directory:
    pruning old checkpoints would delete files elsewhere. A ``path`` outside ``root`` was chosen by the user
    and is returned unchecked.
    """
    path, root = Path(path), Path(root)
    try:
        relative = os.path.relpath(os.path.abspath(path), os.path.abspath(root))
    except ValueError:  # another drive (Windows)
        return path
    if relative == "." or relative.split(os.sep)[0] == "..":
        return path
    confined_path(root, relative, key)
    return path


def is_plain_int(value: object) -> bool:
    """An ``int`` that is not a ``bool`` (JSON and pickles give both; a count or step must be the first)."""
    return isinstance(value, int) and not isinstance(value, bool)


def checked_int(value: Any, key: str, *, minimum: int = 0, maximum: int = MAX_COUNT) -> int:
    """``value`` when it is an int (not a bool) in ``[minimum, maximum]``, else :class:`StateValueError`."""
    if isinstance(value, bool) or not isinstance(value, int) or not minimum <= value <= maximum:
        raise StateValueError(key, f"is {show(value)}: expected an integer from {minimum} to {maximum}")
    return value


def checked_optional_int(value: Any, key: str, *, minimum: int = 0, maximum: int = MAX_COUNT) -> int | None:
    """Like :func:`checked_int`, but ``None`` is allowed (and returned)."""
    return None if value is None else checked_int(value, key, minimum=minimum, maximum=maximum)


def checked_bool(value: Any, key: str) -> bool:
    if not isinstance(value, bool):
        raise StateValueError(key, f"is {show(value)}: expected true or false")
    return value


def checked_number(value: Any, key: str, *, allow_none: bool = False, finite: bool = False) -> float | None:
    """``value`` as a float when it is an int or float (NaN/inf only unless ``finite``); ``None`` if allowed."""
    if value is None and allow_none:
        return None
    # numpy scalars (np.float32 in a metric) count as numbers; strings, lists and bools do not.
    if isinstance(value, bool) or not isinstance(value, (int, float)) and not _is_numpy_number(value):
        raise StateValueError(key, f"is {show(value)}: expected a number{' or null' if allow_none else ''}")
    number = float(value)
    if finite and not math.isfinite(number):
        raise StateValueError(key, f"is {show(value)}: expected a finite number")
    return number


def _is_numpy_number(value: Any) -> bool:
    return isinstance(value, (np.integer, np.floating))


def checked_str(value: Any, key: str, *, allow_none: bool = False) -> str | None:
    if value is None and allow_none:
        return None
    if not isinstance(value, str):
        raise StateValueError(key, f"is {show(value)}: expected a string{' or null' if allow_none else ''}")
    return value


def checked_str_list(value: Any, key: str, *, max_items: int = 100_000) -> list[str]:
    """A list (or tuple) of at most ``max_items`` strings."""
    if not isinstance(value, (list, tuple)) or len(value) > max_items:
        raise StateValueError(key, f"is {show(value)}: expected a list of at most {max_items} strings")
    for i, item in enumerate(value):
        checked_str(item, f"{key}[{i}]")
    return list(value)


def checked_mapping(value: Any, key: str) -> Mapping:
    if not isinstance(value, Mapping):
        raise StateValueError(key, f"is {show(value)}: expected a mapping (a JSON object)")
    return value


def required(state: Mapping, name: str, key: str) -> Any:
    """``state[name]``, or a :class:`StateValueError` saying that ``key`` is missing."""
    if name not in state:
        raise StateValueError(key, "is missing")
    return state[name]
