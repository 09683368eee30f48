"""Atomic save and verified load of one checkpoint directory.

Layout of ``<name>/``: ``tensors.safetensors`` (every tensor and array), ``state.json`` (the rest of the
state, with references to tensor keys) and ``manifest.json`` (written last; sizes + sha256 of the other
two). Everything is written into a hidden sibling ``.tmp-<name>-<random>``, fsynced, then renamed into
place, so a crash leaves either the previous checkpoint or the new complete one — never a directory that
looks complete but is not.
"""
from __future__ import annotations

import json
import logging
import os
import secrets
import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import safetensors
import safetensors.numpy

from ._fs import dump_json, fsync_dir, fsync_file, write_bytes_durably
from .errors import CheckpointError
from .manifest import MANIFEST, build_manifest, read_manifest, verify_files
from .tree import decode_state, encode_state

logger = logging.getLogger(__name__)

TENSORS = "tensors.safetensors"
STATE = "state.json"
TMP_PREFIX = ".tmp-"
OLD_PREFIX = ".old-"


@dataclass
class Checkpoint:
    """A loaded checkpoint: the state as saved, plus the manifest it was verified against."""

    path: Path
    state: Any
    manifest: dict[str, Any]

    @property
    def metadata(self) -> dict[str, Any]:
        return self.manifest.get("metadata", {})


def save_checkpoint(directory: str | os.PathLike, state: dict, metadata: dict | None = None) -> Path:
    """Atomically write ``state`` (and ``metadata``, stored in the manifest) to ``directory``.

    An existing ``directory`` is replaced only once the new checkpoint is complete. Leftovers of an
    interrupted save in the same parent (``.tmp-*``) are removed first. Returns the final path.
    Raises ``TypeError`` naming the key of a value that cannot be stored.
    """
    target = Path(directory).absolute()
    parent = target.parent
    parent.mkdir(parents=True, exist_ok=True)
    clean_interrupted_saves(parent)
    tree, arrays = encode_state(state)

    tmp = parent / f"{TMP_PREFIX}{target.name}-{secrets.token_hex(4)}"
    tmp.mkdir()
    try:
        safetensors.numpy.save_file(arrays, str(tmp / TENSORS))
        fsync_file(tmp / TENSORS)
        write_bytes_durably(tmp / STATE, dump_json(tree))
        # The manifest is the commit record: written only once the other files are durable.
        write_bytes_durably(tmp / MANIFEST, dump_json(build_manifest(tmp, [TENSORS, STATE], metadata)))
        fsync_dir(tmp)
        _move_into_place(tmp, target)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return target


def _move_into_place(tmp: Path, target: Path) -> None:
    old = None
    if target.exists():
        # Directories cannot be replaced in one rename; park the old one until the new one is in place.
        old = target.with_name(f"{OLD_PREFIX}{target.name}-{secrets.token_hex(4)}")
        os.replace(target, old)
    os.replace(tmp, target)
    fsync_dir(target.parent)
    if old is not None:
        shutil.rmtree(old, ignore_errors=True)


def clean_interrupted_saves(parent: Path) -> None:
    """Remove ``.tmp-*`` leftovers; put back a ``.old-<name>-*`` whose replacement never arrived.

    Assumes one writer per directory (the main process), as the trainer guarantees.
    """
    for entry in sorted(parent.iterdir()) if parent.is_dir() else []:
        if entry.name.startswith(TMP_PREFIX) and entry.is_dir():
            logger.info("removing %s left by an interrupted checkpoint save", entry)
            shutil.rmtree(entry, ignore_errors=True)
        elif entry.name.startswith(OLD_PREFIX) and entry.is_dir():
            original = parent / entry.name[len(OLD_PREFIX):].rsplit("-", 1)[0]
            if original.exists():
                shutil.rmtree(entry, ignore_errors=True)
            else:
                logger.warning("restoring %s: it was set aside by a save that did not finish", original)
                os.replace(entry, original)


def load_checkpoint(directory: str | os.PathLike, verify: bool = True, map_numpy: bool = False) -> Checkpoint:
    """Load a checkpoint written by :func:`save_checkpoint`.

    ``verify=True`` checks every file's size and sha256 against the manifest first (sizes are always
    checked). ``map_numpy=True`` returns tensors as numpy arrays instead of CPU ``paddle.Tensor``.
    Every problem is raised as :class:`CheckpointError` naming the directory and what is wrong.
    """
    path = Path(directory)
    manifest = read_manifest(path)
    verify_files(path, manifest, hash_files=verify)
    for required in (STATE, TENSORS):
        if required not in manifest["files"]:
            raise CheckpointError(f"checkpoint {path}: {MANIFEST} does not list {required}")
    try:
        tree = json.loads((path / STATE).read_bytes().decode("utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError) as error:
        raise CheckpointError(f"checkpoint {path}: {STATE} is corrupt ({error})") from error
    arrays = _read_tensors(path / TENSORS)
    try:
        state = decode_state(tree, arrays, map_numpy=map_numpy)
    except CheckpointError as error:
        raise CheckpointError(f"checkpoint {path}: {error}") from error
    return Checkpoint(path=path, state=state, manifest=manifest)


def _read_tensors(path: Path) -> dict[str, np.ndarray]:
    try:
        return safetensors.numpy.load_file(str(path))
    except (safetensors.SafetensorError, OSError, ValueError) as error:
        raise CheckpointError(f"checkpoint {path.parent}: {path.name} is corrupt or unreadable ({error})") from error


def is_complete(directory: str | os.PathLike, verify: bool = False) -> bool:
    """True if ``directory`` holds a checkpoint whose manifest and file sizes check out.

    ``verify=True`` also compares sha256 digests (reads every byte).
    """
    try:
        path = Path(directory)
        verify_files(path, read_manifest(path), hash_files=verify)
    except CheckpointError:
        return False
    return True
