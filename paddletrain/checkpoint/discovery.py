"""Find checkpoints in a directory and pick the newest one that verifies (for ``resume=auto``)."""
from __future__ import annotations

import logging
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from .errors import CheckpointError
from .manifest import read_manifest, verify_files
from .storage import STATE, TENSORS

logger = logging.getLogger(__name__)


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


def _scan(run_dir: Path) -> tuple[list[CheckpointInfo], list[tuple[Path, str]]]:
    found, rejected = [], []
    if not run_dir.is_dir():
        return found, rejected
    for entry in run_dir.iterdir():
        # Hidden entries are in-flight (.tmp-*) or parked (.old-*) saves, never finished checkpoints.
        if entry.name.startswith(".") or not entry.is_dir() or not _looks_like_checkpoint(entry):
            continue
        try:
            manifest = read_manifest(entry)
        except CheckpointError as error:
            rejected.append((entry, str(error)))
            continue
        meta = manifest.get("metadata") or {}
        step, epoch = meta.get("global_step"), meta.get("epoch")
        found.append(CheckpointInfo(
            path=entry,
            global_step=step if isinstance(step, int) else -1,
            epoch=epoch if isinstance(epoch, int) else None,
            created=float(manifest.get("created", 0.0)),
            metadata=meta,
        ))
    found.sort(key=lambda info: (info.global_step, info.created, info.path.name))
    return found, rejected


def find_checkpoints(run_dir: str | os.PathLike) -> list[CheckpointInfo]:
    """Checkpoints directly inside ``run_dir`` with a readable manifest, oldest first.

    Sorted by ``(global_step, created)`` from the manifest metadata; a missing ``global_step`` sorts first.
    Files are not hashed here: use :func:`find_latest` or ``load_checkpoint`` for a verified one.
    """
    return _scan(Path(run_dir))[0]


def find_latest(run_dir: str | os.PathLike, log: logging.Logger = logger) -> Path | None:
    """The newest checkpoint in ``run_dir`` that fully verifies (sizes and sha256), or None.

    Every checkpoint passed over is reported on ``log`` with its directory and the reason.
    """
    found, rejected = _scan(Path(run_dir))
    for path, reason in rejected:
        log.warning("skipping checkpoint %s: %s", path, reason)
    for info in reversed(found):
        try:
            verify_files(info.path, read_manifest(info.path))
        except CheckpointError as error:
            log.warning("skipping checkpoint %s: %s", info.path, error)
            continue
        return info.path
    return None
