"""Durable file-system primitives: fsync files and directories, atomic small-file replace, probes."""
from __future__ import annotations

import contextlib
import errno
import json
import os
import secrets
import shutil
from pathlib import Path
from typing import Any

from .errors import CheckpointError


def fsync_file(path: Path) -> None:
    """Flush a file's data to disk (works for files written by other libraries, e.g. safetensors)."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def fsync_dir(path: Path) -> None:
    """Make renames and creations inside ``path`` durable. A no-op where directories cannot be opened."""
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:  # e.g. Windows: directory entries are durable once the rename returns
        return
    try:
        os.fsync(fd)
    except OSError:
        pass  # some file systems (network mounts) refuse fsync on directories
    finally:
        os.close(fd)


def write_bytes_durably(path: Path, data: bytes) -> None:
    with open(path, "wb") as handle:
        handle.write(data)
        handle.flush()
        os.fsync(handle.fileno())


def dump_json(data: Any) -> bytes:
    # allow_nan=False keeps the files strict JSON: non-finite floats must be tagged by the caller.
    return (json.dumps(data, indent=1, allow_nan=False, ensure_ascii=False) + "\n").encode("utf-8")


def replace_json_atomically(path: Path, data: Any) -> None:
    """Write ``path`` so readers see either the old or the new content, never a partial file."""
    tmp = path.with_name(f".tmp-{path.name}-{secrets.token_hex(4)}")
    try:
        write_bytes_durably(tmp, dump_json(data))
        os.replace(tmp, path)
    finally:
        tmp.unlink(missing_ok=True)
    fsync_dir(path.parent)


_DISK_FULL = (errno.ENOSPC, errno.EDQUOT, errno.EFBIG)


def _human(size: int) -> str:
    value = float(size)
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if value < 1024 or unit == "TiB":
            return f"{value:.0f} {unit}" if unit == "B" else f"{value:.1f} {unit}"
        value /= 1024
    raise AssertionError("unreachable")


def free_space(path: Path) -> str:
    """Free space on the file system holding ``path`` (or its nearest existing parent), for messages."""
    for candidate in (path, *path.parents):
        if candidate.exists():
            try:
                return f"{_human(shutil.disk_usage(candidate).free)} free on {candidate}"
            except OSError:
                break
    return "free space unknown"


def write_error(path: Path, error: BaseException, what: str = "checkpoint") -> CheckpointError:
    """The one line a failed write becomes: what, where, why and, when the disk is full, the space left."""
    code = getattr(error, "errno", None)
    reason = getattr(error, "strerror", None) or str(error)
    if code in _DISK_FULL or "No space left" in str(error):  # safetensors reports ENOSPC in its message only
        reason = f"no space left on the device ({free_space(path)})"
    return CheckpointError(f"cannot write {what} {path}: {reason}")


def check_writable(root: str | os.PathLike) -> Path:
    """Fail fast, before training starts, if checkpoints cannot be written under ``root``.

    Creates ``root`` if needed, then creates, fsyncs and removes a probe file. Returns ``root`` as a Path.
    """
    root = Path(root)
    probe = root / f".write-probe-{secrets.token_hex(4)}"
    try:
        root.mkdir(parents=True, exist_ok=True)
        write_bytes_durably(probe, b"paddletrain write probe\n")
        probe.unlink()
    except OSError as error:
        with contextlib.suppress(OSError):
            probe.unlink(missing_ok=True)  # a half-written probe must not take the little space there is
        if error.errno in _DISK_FULL:
            raise write_error(root, error, "checkpoints to") from error
        reason = error.strerror or str(error)
        raise CheckpointError(f"checkpoint directory {root} is not writable: {reason}") from error
    return root
