"""A cache of image-folder scans, so that a second start on an unchanged folder skips the walk.

Scanning ImageNet's 1.28 M files costs a ``scandir`` of each of its 1000 class directories and seconds of
Python; the result (a :class:`~paddletrain.data.formats.sample_index.SampleIndex` plus what the scan report and the
class list
need) is kept as one ``.npz`` per resolved root and split in :func:`scan_cache_dir`.

A cached scan is used only while every directory the scan listed still has the same
``(st_dev, st_ino, st_mtime_ns, st_ctime_ns)``: adding, removing or renaming an entry changes its directory's
mtime, and a ``chmod`` (which can make a directory unreadable) its ctime. Each stamp is taken before its
directory is listed, so a change made during the scan also misses. What the stamps cannot see, the cache does not
hold:

- A scan that met a symlink anywhere (a class directory, an entry, the split directory) is not cached: where a
  link leads depends on directories the scan did not list.
- A scan is not cached while a directory it listed was modified in the last ``RACY_SECONDS``: file-system
  timestamps are coarse (a few ms on Linux, 2 s on FAT), so a second change within the same tick would leave the
  mtime as it was (git's "racy clean" problem).

The file may have been damaged or edited by someone else, so it is read as plain arrays (``allow_pickle=False``)
from a file this user owns and nobody else may write, its size is bounded, and every array's dtype, shape and
range is checked: each sample must sit directly in one of the recorded directories, each recorded directory must
be a real directory (not a link) whose parent is recorded too. Anything odd is logged and the folder is scanned
again; the cache never makes a start fail.
"""
from __future__ import annotations

import hashlib
import json
import logging
import os
import stat
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from paddletrain.data.formats.sample_index import SampleIndex

__all__ = ["CACHE_DIR_ENV", "cache_root", "load_scan", "save_scan", "scan_cache_dir"]

log = logging.getLogger("paddletrain")

CACHE_DIR_ENV = "PADDLETRAIN_CACHE_DIR"
FORMAT_VERSION = 1
# ImageNet-21k's 14 M paths take about 1 GB here; a file larger than this is not a scan we wrote.
MAX_CACHE_BYTES = 2**32
MAX_META_BYTES = 2**24
RACY_SECONDS = 2.0
_STAMP_FIELDS = 4  # st_dev, st_ino, st_mtime_ns, st_ctime_ns
_SLASH, _DOT = ord("/"), ord(".")


class _Unusable(ValueError):
    """Why a cache file cannot be used (logged, then the folder is scanned)."""


def cache_root() -> Path:
    """paddletrain's cache folder: ``$PADDLETRAIN_CACHE_DIR``, else ``$XDG_CACHE_HOME/paddletrain``, else
    ``~/.cache/paddletrain`` (scans here, shards in :mod:`paddletrain.data.shards.cache`)."""
    base = os.environ.get(CACHE_DIR_ENV)
    if base:
        return Path(base).expanduser()
    xdg = os.environ.get("XDG_CACHE_HOME")
    return (Path(xdg) if xdg else Path.home() / ".cache") / "paddletrain"


def scan_cache_dir() -> Path:
    """``scans`` in :func:`cache_root`."""
    return cache_root() / "scans"


def stamp(st: os.stat_result) -> tuple[int, int, int, int]:
    """What must not change for a directory's listing to be the one the scan saw."""
    return st.st_dev, st.st_ino, st.st_mtime_ns, st.st_ctime_ns


def _cache_file(real_root: str, split: str) -> Path:
    digest = hashlib.sha256(f"{real_root}\0{split}".encode("utf-8", "surrogateescape")).hexdigest()[:32]
    return scan_cache_dir() / f"{digest}.npz"


def save_scan(root: str | Path, split: str, index: SampleIndex, relpaths: Sequence[str], meta: dict[str, Any],
              dirs: Sequence[tuple[str, os.stat_result]], *, now_ns: int | None = None) -> Path | None:
    """Store a scan of ``root``'s ``split``: its ``index`` (whose paths are ``relpaths``), ``meta`` (plain JSON
    data) and the stamp of every directory it listed (``dirs``: paths relative to ``root``, each stat taken before
    the directory was listed).

    Returns the file written, or None when the scan may not be cached (see the module docstring) or writing failed
    (logged; a cache is never worth failing a start for).
    """
    real_root = os.path.realpath(root)
    now_ns = time.time_ns() if now_ns is None else now_ns
    racy = [rel for rel, st in dirs if st.st_mtime_ns > now_ns - RACY_SECONDS * 1e9]
    if racy:
        log.debug("scan of %s/%s not cached: %r was modified in the last %g s", real_root, split, racy[0],
                  RACY_SECONDS)
        return None
    dir_ids = {rel: i for i, (rel, _) in enumerate(dirs)}
    try:
        dir_of = np.fromiter((dir_ids[p.rpartition("/")[0]] for p in relpaths), np.int32, len(relpaths))
    except KeyError as exc:  # a sample outside the listed directories: the caller's mistake, not worth a crash
        log.debug("scan of %s/%s not cached: no stamp for directory %s", real_root, split, exc)
        return None
    listed = SampleIndex.build(real_root, [rel for rel, _ in dirs], np.zeros(len(dirs), np.int64))
    meta_bytes = json.dumps({**meta, "root": real_root, "split": split}).encode()
    arrays = dict(version=np.array([FORMAT_VERSION], np.int64), meta=np.frombuffer(meta_bytes, np.uint8),
                  path_bytes=index.path_bytes, offsets=index.offsets, labels=index.labels, dir_of=dir_of,
                  dir_bytes=listed.path_bytes, dir_offsets=listed.offsets,
                  dir_stamps=np.array([stamp(st) for _, st in dirs], np.int64).reshape(-1, _STAMP_FIELDS))
    target = _cache_file(real_root, split)
    try:
        target.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
        fd, tmp = tempfile.mkstemp(prefix=".scan-", suffix=".tmp", dir=target.parent)  # mode 0600
        try:
            with os.fdopen(fd, "wb") as f:
                np.savez(f, **arrays)
            os.replace(tmp, target)  # readers see the old file or the new one, never half of one
        except BaseException:
            os.unlink(tmp)
            raise
    except OSError as exc:
        log.info("scan of %s/%s not cached: cannot write %s (%s)", real_root, split, target, exc)
        return None
    log.debug("scan of %s/%s cached in %s", real_root, split, target)
    return target


def load_scan(root: str | Path, split: str) -> tuple[SampleIndex, dict[str, Any]] | None:
    """The cached scan of ``root``'s ``split`` as ``(index, meta)`` (the index's root is ``root`` as given), or
    None when there is none or it cannot be trusted to be the folder as it is now (the reason is logged)."""
    real_root = os.path.realpath(root)
    path = _cache_file(real_root, split)
    try:
        with open(path, "rb") as f:
            arrays = _read_arrays(f)
        meta = _check_meta(arrays, real_root, split)
        _check_samples(arrays, len(meta["class_dirs"]))
        changed = _changed_directory(arrays, real_root)
    except FileNotFoundError:
        log.debug("no cached scan of %s/%s in %s", real_root, split, path)
        return None
    except Exception as exc:  # noqa: BLE001 - a damaged file fails in zipfile, zlib, numpy or json; any of them
        # means the same thing (scan again), and a cache must never stop a start
        log.info("ignoring the cached scan %s of %s/%s: %s: %s", path, real_root, split, type(exc).__name__, exc)
        return None
    if changed is not None:
        log.debug("cached scan of %s/%s is stale: %s", real_root, split, changed)
        return None
    return SampleIndex(str(root), arrays["path_bytes"], arrays["offsets"], arrays["labels"]), meta


_EXPECTED = {"version": (np.int64, 1), "meta": (np.uint8, 1), "path_bytes": (np.uint8, 1), "offsets": (np.int64, 1),
             "labels": (np.int64, 1), "dir_of": (np.int32, 1), "dir_bytes": (np.uint8, 1),
             "dir_offsets": (np.int64, 1), "dir_stamps": (np.int64, 2)}


def _read_arrays(f: Any) -> dict[str, np.ndarray]:
    """The arrays of an open cache file that this user owns and only they can write, checked for size and type."""
    st = os.fstat(f.fileno())
    if st.st_uid != os.getuid() or st.st_mode & 0o022:
        raise _Unusable(f"owned by uid {st.st_uid} with mode {stat.filemode(st.st_mode)}; only a file of this "
                        "user that nobody else may write is read")
    if st.st_size > MAX_CACHE_BYTES:
        raise _Unusable(f"{st.st_size} bytes, more than {MAX_CACHE_BYTES}")
    with np.load(f, allow_pickle=False) as npz:
        members = npz.zip.infolist()
        if sum(m.file_size for m in members) > MAX_CACHE_BYTES or sorted(npz.files) != sorted(_EXPECTED):
            raise _Unusable(f"unexpected contents {sorted(npz.files)[:12]}")
        arrays = {name: npz[name] for name in _EXPECTED}
    for name, (dtype, ndim) in _EXPECTED.items():
        if arrays[name].dtype != dtype or arrays[name].ndim != ndim:
            raise _Unusable(f"{name} is {arrays[name].dtype} [{arrays[name].ndim} dims], not {np.dtype(dtype)}")
    if arrays["version"].tolist() != [FORMAT_VERSION]:
        raise _Unusable(f"format {arrays['version'].tolist()}, not [{FORMAT_VERSION}]")
    return arrays


def _check_meta(arrays: dict[str, np.ndarray], real_root: str, split: str) -> dict[str, Any]:
    if arrays["meta"].size > MAX_META_BYTES:
        raise _Unusable(f"its metadata is {arrays['meta'].size} bytes")
    meta = json.loads(arrays["meta"].tobytes().decode())
    if not isinstance(meta, dict) or meta.get("root") != real_root or meta.get("split") != split:
        raise _Unusable("it is the scan of another folder")
    names = meta.get("class_dirs")
    if not isinstance(names, list) or not names or not all(isinstance(n, str) for n in names):
        raise _Unusable("its class list is not a list of names")
    return meta


def _check_offsets(offsets: np.ndarray, size: int, what: str, min_length: int) -> None:
    if len(offsets) < 1 or offsets[0] != 0 or offsets[-1] != size or np.any(np.diff(offsets) < min_length):
        raise _Unusable(f"its {what} offsets do not describe its {what} buffer")


def _check_samples(arrays: dict[str, np.ndarray], num_classes: int) -> None:
    """Each sample: a label below ``num_classes``, and a path that is a recorded directory + '/' + one name."""
    path_bytes, offsets, labels, dir_of = (arrays[k] for k in ("path_bytes", "offsets", "labels", "dir_of"))
    count = len(offsets) - 1
    _check_offsets(offsets, path_bytes.size, "path", 1)
    _check_offsets(arrays["dir_offsets"], arrays["dir_bytes"].size, "directory", 0)
    dirs = len(arrays["dir_offsets"]) - 1
    if labels.shape != (count,) or dir_of.shape != (count,) or arrays["dir_stamps"].shape != (dirs, _STAMP_FIELDS):
        raise _Unusable("its arrays disagree on the number of samples or directories")
    if count and (labels.min() < 0 or labels.max() >= num_classes or dir_of.min() < 0 or dir_of.max() >= dirs):
        raise _Unusable("a label or directory number is out of range")
    if np.any(path_bytes == 0) or np.any(arrays["dir_bytes"] == 0):
        raise _Unusable("a path holds a NUL byte")
    if not count:
        return
    starts, ends = offsets[:-1], offsets[1:]
    slashes = np.flatnonzero(path_bytes == _SLASH)
    position = np.searchsorted(slashes, ends) - 1
    last_slash = np.where(position >= 0, slashes[np.maximum(position, 0)], -1)
    dir_lengths = np.diff(arrays["dir_offsets"])
    # The name after the last '/': not empty, '.' or '..'; the part before it: exactly the sample's directory.
    name_length = ends - last_slash - 1
    dots = (name_length <= 2) & (path_bytes[np.minimum(last_slash + 1, path_bytes.size - 1)] == _DOT) & (
        (name_length == 1) | (path_bytes[np.minimum(last_slash + 2, path_bytes.size - 1)] == _DOT))
    if np.any(last_slash - starts != dir_lengths[dir_of]) or np.any(name_length < 1) or np.any(dots):
        raise _Unusable("a sample's path is not a recorded directory and a file name")
    order = np.argsort(dir_of, kind="stable")
    bounds = np.searchsorted(dir_of[order], np.arange(dirs + 1))
    dir_bytes, dir_offsets = arrays["dir_bytes"], arrays["dir_offsets"]
    for d in np.flatnonzero(np.diff(bounds)).tolist():
        members = order[bounds[d]:bounds[d + 1]]
        prefix = dir_bytes[dir_offsets[d]:dir_offsets[d + 1]]
        if not np.array_equal(path_bytes[starts[members][:, None] + np.arange(prefix.size)],
                              np.broadcast_to(prefix, (members.size, prefix.size))):
            raise _Unusable("a sample's path is not in its recorded directory")


def _changed_directory(arrays: dict[str, np.ndarray], real_root: str) -> str | None:
    """The first recorded directory that is not as the scan saw it (what changed), or None."""
    listed = SampleIndex(real_root, arrays["dir_bytes"], arrays["dir_offsets"], np.zeros(0, np.int64))
    names = listed.relpaths()
    known = set(names)
    for rel, recorded in zip(names, arrays["dir_stamps"].tolist(), strict=True):
        if rel and (os.path.normpath(rel) != rel or rel.startswith(("/", "..")) or os.path.dirname(rel) not in known):
            raise _Unusable(f"recorded directory {rel!r} is not a path below the root")
        try:
            st = os.lstat(os.path.join(real_root, rel))
        except OSError as exc:
            return f"{rel or '.'!r}: {exc.strerror}"
        if not stat.S_ISDIR(st.st_mode):
            return f"{rel or '.'!r} is no longer a directory"
        if list(stamp(st)) != recorded:
            return f"{rel or '.'!r} changed (an entry added, removed or renamed, or its permissions)"
    return None
