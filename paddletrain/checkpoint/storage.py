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

from safetensors import SafetensorError

from ._fs import dump_json, fsync_dir, write_bytes_durably, write_error
from .errors import CheckpointError
from .manifest import MANIFEST, MAX_STATE_BYTES, build_manifest, read_manifest, read_small_file, verify_files
from .tensors import read_tensors, write_tensors
from .tree import decode_state, encode_state
from .untrusted import StateValueError, confined_path

log = logging.getLogger(__name__)

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

    @property
    def written_by(self) -> str | None:
        """The paddletrain version that wrote it (None in a manifest that does not say)."""
        version = self.manifest.get("paddletrain_version")
        return version if isinstance(version, str) else None


def save_checkpoint(directory: str | os.PathLike, state: dict, metadata: dict | None = None) -> Path:
    """Atomically write ``state`` (and ``metadata``, stored in the manifest) to ``directory``.

    An existing ``directory`` is replaced only once the new checkpoint is complete. What an interrupted save
    left in the same parent is put right first (:func:`recover_interrupted_saves`). Returns the final path.

    Raises:
        TypeError: naming the key of a value that cannot be stored (before anything is written).
        CheckpointError: the files cannot be written (e.g. the disk is full: the message names the path and
            the free space). Nothing of the new checkpoint is left behind and every earlier one is intact.
    """
    target = Path(directory).absolute()
    parent = target.parent
    try:
        parent.mkdir(parents=True, exist_ok=True)
    except OSError as error:
        raise write_error(target, error) from error
    recover_interrupted_saves(parent)
    tree, arrays = encode_state(state)

    tmp = parent / f"{TMP_PREFIX}{target.name}-{secrets.token_hex(4)}"
    try:
        tmp.mkdir()
        write_tensors(arrays, tmp / TENSORS)
        write_bytes_durably(tmp / STATE, dump_json(tree))
        # The manifest is the commit record: written only once the other files are durable.
        write_bytes_durably(tmp / MANIFEST, dump_json(build_manifest(tmp, [TENSORS, STATE], metadata)))
        fsync_dir(tmp)
        _move_into_place(tmp, target)
    except BaseException as error:
        shutil.rmtree(tmp, ignore_errors=True)
        if isinstance(error, (OSError, SafetensorError)):
            raise write_error(target, error) from error
        raise
    return target


def _move_into_place(tmp: Path, target: Path) -> None:
    old = None
    if target.exists():
        # Directories cannot be replaced in one rename; park the old one until the new one is in place.
        old = target.with_name(f"{OLD_PREFIX}{target.name}-{secrets.token_hex(4)}")
        os.replace(target, old)
    try:
        os.replace(tmp, target)
    except BaseException:
        if old is not None:
            os.replace(old, target)  # an error (not a crash) between the renames: put the previous one back
        raise
    fsync_dir(target.parent)
    if old is not None:
        shutil.rmtree(old, ignore_errors=True)


def interrupted_save_name(entry: Path) -> str | None:
    """The checkpoint name a hidden ``.tmp-<name>-<hex>`` / ``.old-<name>-<hex>`` directory stands for.

    ``None`` for any other entry, or when the name it would give is not a plain name.
    """
    for prefix in (TMP_PREFIX, OLD_PREFIX):
        if entry.name.startswith(prefix):
            name, sep, _ = entry.name[len(prefix):].rpartition("-")
            try:
                return confined_path(entry.parent, name, "interrupted save", plain_name=True).name if sep else None
            except CheckpointError:
                return None
    return None


def _version_key(path: Path) -> tuple[int, float] | None:
    """``(global_step, created)`` of a checkpoint that fully verifies, else None."""
    try:
        manifest = read_manifest(path)
        verify_files(path, manifest)
    except CheckpointError:
        return None
    step = (manifest.get("metadata") or {}).get("global_step")
    return (step if isinstance(step, int) and not isinstance(step, bool) else -1, manifest["created"])


def recover_interrupted_saves(parent: Path) -> None:
    """Put right what an interrupted save left in ``parent``: each name ends up holding its newest complete
    version, and no hidden leftovers remain.

    A save writes ``.tmp-<name>-*``, parks an existing ``<name>`` as ``.old-<name>-*``, renames the first to
    ``<name>`` and deletes the second; a crash can stop it after any step. For each name, the newest version
    that fully verifies (by global step, then creation time) among ``<name>``, its ``.tmp-*`` and its
    ``.old-*`` becomes ``<name>``; incomplete in-flight saves and superseded versions are deleted.
    Assumes one writer per directory (the main process), as the trainer guarantees.
    """
    versions: dict[str, list[Path]] = {}
    for entry in sorted(parent.iterdir()) if parent.is_dir() else []:
        name = interrupted_save_name(entry)
        if name is not None and entry.is_dir() and not entry.is_symlink():
            versions.setdefault(name, []).append(entry)
    for name, hidden in versions.items():
        visible = parent / name
        ranked = [(key, path) for path in hidden + ([visible] if visible.is_dir() else [])
                  if (key := _version_key(path)) is not None]
        newest = max(ranked, key=lambda item: item[0])[1] if ranked else None
        if newest is not None and newest != visible:
            log.warning("restoring checkpoint %s from %s, left by a save that did not finish", visible, newest.name)
            if visible.exists():
                parked = parent / f"{OLD_PREFIX}{name}-{secrets.token_hex(4)}"
                os.replace(visible, parked)
                hidden.append(parked)
            os.replace(newest, visible)
        for path in hidden:
            if path != newest:
                log.info("removing %s left by an interrupted checkpoint save", path)
                shutil.rmtree(path, ignore_errors=True)
    if versions:
        fsync_dir(parent)


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
        tree = json.loads(read_small_file(path, STATE, MAX_STATE_BYTES).decode("utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError) as error:
        raise CheckpointError(f"checkpoint {path}: {STATE} is corrupt ({error})") from error
    except RecursionError as error:  # the JSON parser's own depth limit
        raise CheckpointError(f"checkpoint {path}: {STATE} nests too deeply to be a training state") from error
    arrays = read_tensors(path / TENSORS)
    try:
        state = decode_state(tree, arrays, map_numpy=map_numpy)
    except StateValueError as error:
        raise error.in_file(path / STATE) from error
    except CheckpointError as error:
        raise CheckpointError(f"checkpoint {path}: {error}") from error
    return Checkpoint(path=path, state=state, manifest=manifest)


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
