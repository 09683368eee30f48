"""Find checkpoints in a directory and pick the newest one that verifies (for ``resume=auto``)."""
from __future__ import annotations

import logging
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from .errors import CheckpointError
from .manifest import read_manifest, verify_files
from .storage import STATE, TENSORS, interrupted_save_name
from .untrusted import confined_path, is_plain_int

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class CheckpointInfo:
    """What the manifest says about one checkpoint directory (read without hashing any file)."""

    path: Path
    global_step: int
    epoch: int | None
    created: float
    metadata: dict[str, Any] = field(default_factory=dict, compare=False)


def _looks_like_checkpoint(path: Path) -> bool:
    return any((path / name).exists() for name in ("manifest.json", STATE, TENSORS))


def _scan(run_dir: Path, interrupted: bool = False) -> tuple[list[CheckpointInfo], list[tuple[Path, str]]]:
    found, rejected = [], []
    if not run_dir.is_dir():
        return found, rejected
    for entry in run_dir.iterdir():
        # Hidden entries are saves a crash interrupted: in flight (.tmp-*) or parked (.old-*). Only a search
        # for the newest complete checkpoint looks at them; listings show finished checkpoints only.
        if entry.name.startswith(".") and not (interrupted and interrupted_save_name(entry)):
            continue
        if not entry.is_dir() or not _looks_like_checkpoint(entry):
            continue
        try:
            # A directory that is a symlink out of run_dir is not part of this run (and would be pruned).
            confined_path(run_dir, entry.name, "checkpoint directory")
            manifest = read_manifest(entry)
        except CheckpointError as error:
            rejected.append((entry, str(error)))
            continue
        meta = manifest.get("metadata") or {}
        step, epoch = meta.get("global_step"), meta.get("epoch")
        found.append(CheckpointInfo(
            path=entry,
            global_step=step if is_plain_int(step) else -1,
            epoch=epoch if is_plain_int(epoch) else None,
            created=manifest["created"],
            metadata=meta,
        ))
    found.sort(key=lambda info: (info.global_step, info.created, info.path.name))
    return found, rejected



def find_checkpoints(run_dir: str | os.PathLike) -> list[CheckpointInfo]:
    """Checkpoints directly inside ``run_dir`` with a readable manifest, oldest first.

    Sorted by ``(global_step, created)`` from the manifest metadata; a missing ``global_step`` sorts first.
    Files are not hashed here: use :func:`find_latest` or ``load_checkpoint`` for a verified one. Saves a crash
    interrupted (hidden ``.tmp-*``/``.old-*`` directories) are not listed.
    """
    return _scan(Path(run_dir))[0]


def find_latest(run_dir: str | os.PathLike, log: logging.Logger = log) -> Path | None:
    """The newest checkpoint in ``run_dir`` that fully verifies (sizes and sha256), or None.

    Whatever state a crash left is searched: besides the finished checkpoints, a complete save that was not
    yet renamed into place (``.tmp-<name>-*``) and a parked previous version (``.old-<name>-*``) count, so
    the result may be such a hidden directory (the next save renames it back, see
    :func:`~paddletrain.checkpoint.storage.recover_interrupted_saves`). Newest means the highest global step,
    then the latest creation time. Every checkpoint passed over is reported on ``log`` with the reason.
    """
    found, rejected = _scan(Path(run_dir), interrupted=True)
    for path, reason in rejected:
        if interrupted_save_name(path) is None:  # an unfinished in-flight save is expected after a crash
            log.warning("skipping checkpoint %s: %s", path, reason)
    for info in reversed(found):
        try:
            verify_files(info.path, read_manifest(info.path))
        except CheckpointError as error:
            if interrupted_save_name(info.path) is None:
                log.warning("skipping checkpoint %s: %s", info.path, error)
            continue
        if info.path.name.startswith("."):
            log.warning("the newest complete checkpoint is %s, left by a save that a crash interrupted", info.path)
        return info.path
    return None
