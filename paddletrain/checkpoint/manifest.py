"""The manifest: written last, it is what makes a checkpoint directory complete and verifiable.

``manifest.json`` lists the size and sha256 of every other file, the format version, the library
versions and user metadata (epoch, global_step, monitored metric, config hash, ...).
"""
from __future__ import annotations

import hashlib
import json
import math
import re
import time
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import paddle

import paddletrain

from .errors import CheckpointError
from .untrusted import StateValueError, checked_int, checked_number, confined_path, show

MANIFEST = "manifest.json"
FORMAT = "paddletrain-checkpoint"
FORMAT_VERSION = 1
_CHUNK = 1 << 20
# Bounds on what is read into memory before it is verified: a manifest holds a few lines of metadata; a
# state.json the config, counters and callback states (tensors live in tensors.safetensors).
MAX_MANIFEST_BYTES = 16 << 20
MAX_STATE_BYTES = 256 << 20
_SHA256 = re.compile(r"[0-9a-f]{64}")


def sha256_of(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        while chunk := handle.read(_CHUNK):
            digest.update(chunk)
    return digest.hexdigest()


def plain_metadata(metadata: dict[str, Any] | None) -> dict[str, Any]:
    """Metadata as JSON-safe data: numpy/paddle scalars become python numbers, NaN/inf become strings."""

    def plain(value: Any) -> Any:
        if hasattr(value, "item") and getattr(value, "size", 1) == 1:  # numpy scalar or 1-element tensor
            value = value.item()
        if isinstance(value, float) and not math.isfinite(value):
            return str(value)  # "nan", "inf", "-inf": readable, and float() parses them back
        if isinstance(value, dict):
            return {str(k): plain(v) for k, v in value.items()}
        if isinstance(value, (list, tuple)):
            return [plain(v) for v in value]
        if value is None or isinstance(value, (bool, int, float, str)):
            return value
        raise TypeError(f"checkpoint metadata value {value!r} ({type(value).__qualname__}) is not JSON-serialisable")

    return plain(dict(metadata or {}))


def build_manifest(directory: Path, files: list[str], metadata: dict[str, Any] | None) -> dict[str, Any]:
    now = time.time()
    return {
        "format": FORMAT,
        "format_version": FORMAT_VERSION,
        "paddletrain_version": paddletrain.__version__,
        "paddle_version": paddle.__version__,
        "created": now,
        "created_iso": datetime.fromtimestamp(now, timezone.utc).isoformat(timespec="seconds"),
        "files": {name: {"size": (directory / name).stat().st_size, "sha256": sha256_of(directory / name)}
                  for name in files},
        "metadata": plain_metadata(metadata),
    }


def read_small_file(directory: Path, name: str, limit: int) -> bytes:
    """The bytes of ``directory/name``: a file of that directory (no symlink out) of at most ``limit`` bytes."""
    try:
        path = confined_path(directory, name, name, plain_name=True)
    except StateValueError as error:
        raise error.in_file(directory) from error
    size = path.stat().st_size
    if size > limit:
        raise CheckpointError(f"checkpoint {directory}: {name} has {size} bytes, more than the {limit} a "
                              f"paddletrain checkpoint writes; refusing to read it")
    return path.read_bytes()


def read_manifest(directory: Path) -> dict[str, Any]:
    """Parse and sanity-check ``manifest.json`` (no hashing). Raises CheckpointError naming the problem."""
    path = directory / MANIFEST
    if not directory.is_dir():
        raise CheckpointError(f"checkpoint {directory} does not exist or is not a directory")
    if not path.is_file():
        if (directory / "state.json").exists() or (directory / "tensors.safetensors").exists():
            raise CheckpointError(f"checkpoint {directory}: missing {MANIFEST} — the save did not complete")
        raise CheckpointError(f"{directory} is not a paddletrain checkpoint: it has no {MANIFEST}")
    try:
        manifest = json.loads(read_small_file(directory, MANIFEST, MAX_MANIFEST_BYTES).decode("utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError, RecursionError) as error:
        raise CheckpointError(f"checkpoint {directory}: {MANIFEST} is corrupt ({error})") from error
    if not isinstance(manifest, dict) or manifest.get("format") != FORMAT:
        raise CheckpointError(f"{directory} is not a paddletrain checkpoint: {MANIFEST} has no format {FORMAT!r}")
    version = manifest.get("format_version")
    if not isinstance(version, int) or version > FORMAT_VERSION or version < 1:
        raise CheckpointError(
            f"checkpoint {directory} has format version {version!r}; this paddletrain "
            f"({paddletrain.__version__}) reads versions 1..{FORMAT_VERSION} — upgrade paddletrain to load it"
        )
    files = manifest.get("files")
    if not isinstance(files, dict) or not all(isinstance(entry, dict) for entry in files.values()):
        raise CheckpointError(f"checkpoint {directory}: {MANIFEST} has a malformed 'files' table")
    try:
        for name, entry in files.items():
            # A listed name is read and hashed: it must be a file of this directory, not a path or a way out.
            confined_path(directory, name, f"files.{name}", plain_name=True)
            checked_int(entry.get("size"), f"files.{name}.size")
            if not isinstance(entry.get("sha256"), str) or not _SHA256.fullmatch(entry["sha256"]):
                raise StateValueError(f"files.{name}.sha256", f"is {show(entry.get('sha256'))}: expected 64 hex digits")
        manifest["created"] = checked_number(manifest.get("created", 0.0), "created", finite=True)
        if not isinstance(manifest.get("metadata", {}), dict):
            raise StateValueError("metadata", f"is {show(manifest.get('metadata'))}: expected a JSON object")
    except StateValueError as error:
        raise error.in_file(path) from error
    return manifest


def verify_files(directory: Path, manifest: dict[str, Any], hash_files: bool = True) -> None:
    """Check that every file the manifest lists is present with its recorded size (and sha256)."""
    for name, entry in manifest["files"].items():
        path = directory / name
        if not path.is_file():
            raise CheckpointError(f"checkpoint {directory}: {name} is missing")
        size, expected = path.stat().st_size, entry["size"]
        if size < expected:
            raise CheckpointError(f"checkpoint {directory}: {name} is truncated: {size} of {expected} bytes")
        if size != expected:
            raise CheckpointError(f"checkpoint {directory}: {name} has {size} bytes, the manifest says {expected}")
        if hash_files and sha256_of(path) != entry["sha256"]:
            raise CheckpointError(
                f"checkpoint {directory}: sha256 mismatch for {name} — the file was modified or corrupted after saving"
            )
