"""Turn what a user types after ``checkpoint=`` into one checkpoint directory.

Accepted forms (``evaluate``, ``export`` and ``predict`` share them)::

    outputs/run/2026-11-23_10-00-00/checkpoints/epoch0004-step0000200   one checkpoint, as before
    outputs/run/2026-11-23_10-00-00                                       a run directory (or its checkpoints/)
    outputs/run/2026-11-23_10-00-00:best                                  the best one by the monitored metric
    outputs/run/2026-11-23_10-00-00:last                                  the newest one (highest global step)

A directory without ``:best``/``:last`` is accepted when it holds one checkpoint, or when best and last are the
same; otherwise the error lists what is there and the exact words that choose. ``best`` is what the run's
``best.json`` names; ``last`` is the newest complete checkpoint by global step (as ``trainer.resume=auto``
ranks them). Names read from the run directory stay inside it (:func:`~.untrusted.confined_path`).
"""
from __future__ import annotations

import os
from pathlib import Path

from .discovery import CheckpointInfo, find_checkpoints
from .errors import CheckpointError
from .manifest import MANIFEST
from .retention import read_pointer
from .storage import STATE, TENSORS, is_complete
from .untrusted import StateValueError, confined_path

CHECKPOINTS_DIR = "checkpoints"
CHOICES = ("best", "last")
# A directory of runs is listed, not searched: a few names are enough to choose from.
MAX_LISTED = 6


class CheckpointNotFound(CheckpointError):
    """``checkpoint=`` names nothing usable, or a directory whose choice is ambiguous; the message says what is
    there."""


def split_choice(spec: str) -> tuple[str, str | None]:
    """``"dir:best"`` -> ``("dir", "best")``; a spec without a ``:best``/``:last`` suffix -> ``(spec, None)``."""
    base, sep, choice = str(spec).rpartition(":")
    if sep and choice in CHOICES and base:
        return base, choice
    return str(spec), None


def is_checkpoint_dir(path: Path) -> bool:
    """Whether ``path`` looks like one checkpoint (complete or not), rather than a directory holding some."""
    return path.is_dir() and any((path / name).exists() for name in (MANIFEST, STATE, TENSORS))


def locate_checkpoint(spec: str | os.PathLike, key: str = "checkpoint") -> Path:
    """The checkpoint directory ``spec`` names (see the module docstring for the forms).

    Raises:
        CheckpointNotFound: one line naming ``key``, the value, what the directory holds and how to choose.
    """
    text = os.fspath(spec)
    base, choice = split_choice(text)
    path = Path(base)
    if not path.exists():
        raise CheckpointNotFound(f"{key}={text}: {base} does not exist")
    if not path.is_dir():
        raise CheckpointNotFound(f"{key}={text}: {base} is a file; pass a checkpoint directory or a run directory")
    if is_checkpoint_dir(path):
        if choice is not None:
            raise CheckpointNotFound(f"{key}={text}: {base} is itself a checkpoint; drop ':{choice}'")
        return path
    root = _checkpoints_root(path, text, key)
    complete = [info for info in find_checkpoints(root) if is_complete(info.path)]
    if not complete:
        raise CheckpointNotFound(f"{key}={text}: {root} holds no complete checkpoint"
                                 f"{_listing(root)}")
    last = complete[-1].path
    best = read_pointer(root, "best")
    if best is not None and not is_complete(best):
        best = None
    if choice == "last":
        return last
    if choice == "best":
        if best is None:
            raise CheckpointNotFound(f"{key}={text}: {root} has no best checkpoint (no {root.name}/best.json: the "
                                     f"run monitored no metric, or that checkpoint is gone); choose "
                                     f"{key}={base}:last or one of: {_names(complete)}")
        return best
    if len(complete) == 1 or (best is not None and best.name == last.name):
        return last
    described = ", ".join(_describe(info, best, last) for info in complete[-MAX_LISTED:])
    options = [f"{key}={base}:last", *([f"{key}={base}:best"] if best is not None else []),
               f"{key}={root / complete[0].path.name}"]
    raise CheckpointNotFound(f"{key}={text}: {root} holds {len(complete)} checkpoints ({described}); "
                             f"choose one: {' or '.join(options)}")


def _checkpoints_root(path: Path, text: str, key: str) -> Path:
    """The directory whose entries are checkpoints: ``path`` itself, or its ``checkpoints/`` (a run directory)."""
    if (path / CHECKPOINTS_DIR).is_dir():
        try:
            # A run directory someone handed over must not send the search elsewhere through a symlink.
            return confined_path(path, CHECKPOINTS_DIR, "checkpoints directory")
        except StateValueError as error:
            raise CheckpointNotFound(f"{key}={text}: {error}") from error
    if any(is_checkpoint_dir(entry) for entry in _entries(path)):
        return path
    runs = sorted(entry.name for entry in _entries(path) if (entry / CHECKPOINTS_DIR).is_dir())
    if runs:
        older = len(runs) - MAX_LISTED
        shown = ", ".join(runs[-MAX_LISTED:]) + (f" (and {older} older)" if older > 0 else "")
        noun = "run directory" if len(runs) == 1 else "run directories"
        raise CheckpointNotFound(f"{key}={text}: {path} holds {len(runs)} {noun} ({shown}); name one, "
                                 f"e.g. {key}={path / runs[-1]}:best")
    raise CheckpointNotFound(f"{key}={text}: {path} is neither a checkpoint, a run directory (with "
                             f"{CHECKPOINTS_DIR}/) nor a directory of checkpoints{_listing(path)}")


def _entries(path: Path) -> list[Path]:
    try:
        return sorted(entry for entry in path.iterdir() if entry.is_dir() and not entry.name.startswith("."))
    except OSError:
        return []


def _listing(path: Path) -> str:
    names = sorted(entry.name for entry in path.iterdir())[:MAX_LISTED] if path.is_dir() else []
    return f"; it holds: {', '.join(names)}" if names else "; it is empty"


def _names(infos: list[CheckpointInfo]) -> str:
    return ", ".join(info.path.name for info in infos[-MAX_LISTED:])


def _describe(info: CheckpointInfo, best: Path | None, last: Path) -> str:
    tags = [tag for tag, path in (("best", best), ("last", last)) if path is not None and path.name == info.path.name]
    metric, monitor = info.metadata.get("metric"), info.metadata.get("monitor")
    if isinstance(metric, (int, float)) and not isinstance(metric, bool) and isinstance(monitor, str) \
            and len(monitor) <= 40:  # read from a file someone else may have written: keep the line short
        tags.append(f"{monitor}={metric:.4g}")
    return info.path.name + (f" [{', '.join(tags)}]" if tags else "")
