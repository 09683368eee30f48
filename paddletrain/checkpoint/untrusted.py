"""Checks for values read from files someone else may have written: checkpoints, state files, pointers.

Anyone can hand a user a run directory, so a name or number read from one is untrusted input. This module is
the one home of the rules:

* a path read from such a file stays inside its root: not absolute, no ``..``, and no symlink (anywhere on
  the way) that leads out once resolved (:func:`confined_path`);
* a size or count is an ``int`` (not a ``bool``, not a float) within its range before anything uses it
  (:func:`checked_int`), and other scalars have the type their reader expects;
* a saved structure is checked whole, in one pass, before any of it is used: its layout is written as data, from
  the checks of its parts (:func:`record`, :func:`mapping_of`, :func:`list_of`, :func:`like`, :func:`tensor`),
  beside the code that saves it (``engine.state_checks`` for a training state).

A failed check raises :class:`StateValueError` naming the key; whoever knows the file the value came from
(``Trainer.restore``, ``load_checkpoint``) names it too (:meth:`StateValueError.in_file`).
"""
from __future__ import annotations

import math
import os
from collections.abc import Callable, Mapping
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
        super().__init__(f"{key or '(the whole state)'} {problem}")

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


# A check of one untrusted value: ``check(value, key)`` returns the value as its reader may use it, or raises
# StateValueError naming ``key``. checked_int, checked_bool and checked_number are checks; the functions below
# build the check of a structure from the checks of its parts.
Check = Callable[[Any, str], Any]


def _at(key: str, name: Any) -> str:
    return f"{key}.{name}" if key else str(name)


def anything(value: Any, key: str) -> Any:
    """Any value: for a part whose own reader checks it (a callback's ``load_state_dict``)."""
    return value


def tensor(value: Any, key: str) -> Any:
    """A tensor or an array: anything with a ``shape`` and a ``dtype``."""
    if not hasattr(value, "shape") or not hasattr(value, "dtype"):
        raise StateValueError(key, f"is {show(value)}: expected a tensor")
    return value


def mapping_of(check: Check, *, what: str = "names") -> Check:
    """The check of a mapping from strings (``what`` they are, for the error) to values that each pass ``check``."""
    def check_mapping(value: Any, key: str) -> dict[str, Any]:
        checked = {}
        for name, item in checked_mapping(value, key).items():
            if not isinstance(name, str):
                raise StateValueError(key, f"has the key {show(name)}: expected {what}")
            checked[name] = check(item, _at(key, name))
        return checked
    return check_mapping


def list_of(check: Check, *, what: str = "values", min_items: int = 0, max_items: int = 100_000) -> Check:
    """The check of a list (or tuple) of ``min_items`` to ``max_items`` values that each pass ``check``."""
    def check_list(value: Any, key: str) -> list[Any]:
        if not isinstance(value, (list, tuple)) or not min_items <= len(value) <= max_items:
            raise StateValueError(key, f"is not a list of {what} ({min_items} to {max_items}): {show(value)}")
        return [check(item, f"{key}[{i}]") for i, item in enumerate(value)]
    return check_list


def record(fields: Mapping[str, Check] | None = None, *, optional: Mapping[str, Check] | None = None,
           defaults: Mapping[str, Any] | None = None, others: Check | None = None) -> Check:
    """The check of a mapping with named fields: each of ``fields`` present and passing its check, each
    ``optional`` one checked where present and otherwise its value in ``defaults`` (left out without one). Any
    other key passes ``others``, or is left out of the checked result when ``others`` is None."""
    fields, optional, defaults = fields or {}, optional or {}, defaults or {}

    def check_record(value: Any, key: str) -> dict[str, Any]:
        value = checked_mapping(value, key)
        checked = {}
        for name, check in fields.items():
            checked[name] = check(required(value, name, _at(key, name)), _at(key, name))
        for name, check in optional.items():
            if name in value:
                checked[name] = check(value[name], _at(key, name))
            elif name in defaults:
                checked[name] = defaults[name]
        if others is not None:
            for name, item in value.items():
                if name not in checked:
                    checked[name] = others(item, _at(key, name))
        return checked
    return check_record


def like(example: Any) -> Check:
    """The check of a value of the kind ``example`` has (a scheduler's saved state against its state now): a
    mapping's keys that ``example`` has each like theirs, a bool a bool, a counter an int >= -1 (``last_epoch``
    starts at -1), a rate a finite number (an int base rate becomes a float after a step), a list as long, item
    by item. Anything else is taken as it is."""
    def check_like(value: Any, key: str) -> Any:
        return _like(value, example, key)
    return check_like


def _like(value: Any, example: Any, key: str) -> Any:
    if isinstance(example, Mapping):
        value = checked_mapping(value, key)
        return {**value, **{name: _like(value[name], item, _at(key, name)) for name, item in example.items()
                            if name in value}}
    if isinstance(example, bool):
        return checked_bool(value, key)
    if isinstance(example, int) and (isinstance(value, int) or key.endswith("last_epoch")):
        return checked_int(value, key, minimum=-1)
    if isinstance(example, (int, float)):
        checked_number(value, key, finite=True)
        return value
    if isinstance(example, (list, tuple)):
        if not isinstance(value, (list, tuple)) or len(value) != len(example):
            raise StateValueError(key, f"is {show(value)}: expected a list of {len(example)} values")
        return type(value)(_like(v, e, f"{key}[{i}]") for i, (v, e) in enumerate(zip(value, example, strict=True)))
    return value
