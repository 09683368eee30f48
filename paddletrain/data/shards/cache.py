"""A bounded local cache of remote shards: whole files, verified, evicted least recently used first.

A shard read over HTTP is copied whole into ``data.cache_dir`` before any sample of it is read, so that an epoch
reads each remote shard once and the next epoch reads it from disk. The cache is shared by every rank and loader
worker of a machine:

- one process fetches a shard while the others wait for it (an ``fcntl`` lock, one of ``LOCK_STRIPES``);
- a copy becomes visible only once complete and checked (size and, where the index has it, sha256): it is written
  to a temporary name and renamed into place, so a killed fetch leaves no half shard behind, only a temporary file
  that the next eviction removes;
- a copy that does not match the index is deleted and the shard refused (:class:`ShardChecksumError`), naming
  the URL and both checksums;
- the cache holds at most ``max_bytes``: before a shard is added, the least recently opened entries go until it
  fits beside the copies and the fetches under way (counted at their full size). A reader that still has an
  evicted file open keeps reading it (POSIX unlink), so eviction never breaks a read in progress; a shard larger
  than the whole cache is refused, naming ``data.cache_max_gb``.

Entries are named by the SHA-256 of their URL, never by anything in the shard, so nothing a shard says can place
a file outside the cache.
"""
from __future__ import annotations

import contextlib
import fcntl
import hashlib
import logging
import os
import time
from collections.abc import Iterator
from pathlib import Path

from paddletrain.data.errors import DatasetError
from paddletrain.data.shards.source import FetchPolicy, ShardFetchError, TooLargeError, fetch

log = logging.getLogger("paddletrain")

_SUFFIX = ".tar"
_PART = ".part"
# Beside an entry whose fetch retried all it may in this run: the error, so no other process asks again.
_GAVE_UP = ".gave-up"
# Fetches take one of this many lock files, by their entry's name: the cache never holds more lock files than
# that, and two shards rarely wait for each other (four copied at once share one with a chance of 2%).
LOCK_STRIPES = 256


class ShardChecksumError(DatasetError):
    """A shard's bytes do not match its index (size or sha256)."""


def file_sha256(path: Path) -> str:
    """The SHA-256 of a file, read in 1 MiB pieces."""
    digest = hashlib.sha256()
    with open(path, "rb") as file:
        for block in iter(lambda: file.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


class ShardCache:
    """Whole-shard copies of remote URLs in ``directory``, at most ``max_bytes`` of them."""

    def __init__(self, directory: str | Path, max_bytes: int, policy: FetchPolicy | None = None) -> None:
        if max_bytes <= 0:
            raise DatasetError(f"data.cache_max_gb must be positive (the cache's size cap), got {max_bytes} bytes")
        self.directory = Path(directory).expanduser()
        self.max_bytes = int(max_bytes)
        self.policy = policy or FetchPolicy()
        # Failures recorded before this run started (a server since mended) are not this run's to repeat.
        self.created = time.time()
        try:
            self.directory.mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            raise DatasetError(f"cannot make the shard cache data.cache_dir={str(self.directory)!r}: {exc}") from None

    def entry(self, url: str) -> Path:
        """Where the copy of ``url`` lives (whether or not it is there yet)."""
        return self.directory / (hashlib.sha256(url.encode("utf-8")).hexdigest()[:40] + _SUFFIX)

    def path(self, url: str, sha256: str | None = None, size: int | None = None, *, wait: bool = True
             ) -> Path | None:
        """The local copy of ``url``, fetched (and checked) first if it is not in the cache.

        With ``wait=False``, None at once when another thread or process holds the entry's lock (it is copying the
        shard, or one that shares its lock): fetch-ahead never queues behind a reader.

        Raises:
            ShardFetchError: the server could not be read (see :func:`~paddletrain.data.shards.source.fetch`).
            ShardChecksumError: the copy does not have ``size`` bytes or the SHA-256 ``sha256``.
            DatasetError: the shard is larger than the whole cache.
        """
        target = self.entry(url)
        if target.exists():
            _touch(target)
            return target
        with self._locked(target, wait) as held:
            if not held:
                return None
            if target.exists():  # another process fetched it while this one waited
                _touch(target)
                return target
            gave_up = target.with_name(target.name + _GAVE_UP)
            if gave_up.exists() and gave_up.stat().st_mtime >= self.created:
                # A process of this run (a reader, the fetch-ahead, a rank) retried all it may: not again.
                raise ShardFetchError(gave_up.read_text(errors="replace"))
            try:
                copied = self._fetch_into(target, url, sha256, size)
            except ShardFetchError as exc:
                gave_up.write_text(str(exc))
                raise
            gave_up.unlink(missing_ok=True)  # an earlier run's failure, mended since
            return copied

    def _fetch_into(self, target: Path, url: str, sha256: str | None, size: int | None) -> Path:
        """Copy ``url`` into the cache at ``target`` (under its lock), checked against ``sha256`` and ``size``."""
        limit = self.max_bytes
        if size is not None and size > limit:
            raise DatasetError(f"shard {url} is {size} bytes, more than the whole cache "
                               f"(data.cache_max_gb={self.max_bytes / 1024**3:g}); raise it")
        self._make_room(size or 0)
        # Named with the size it will reach (0: unknown) and its process: other fetches count it against the bound
        # while it grows, and remove it once its process is gone.
        part = target.with_name(f"{target.name}{_PART}.{size or 0}.{os.getpid()}")
        try:
            started = time.monotonic()
            try:
                with open(part, "wb") as out:
                    got = fetch(url, out, max_bytes=min(limit, size) if size is not None else limit,
                                policy=self.policy)
            except TooLargeError:
                if size is None:
                    raise DatasetError(f"shard {url} is larger than the whole cache (data.cache_max_gb="
                                       f"{self.max_bytes / 1024**3:g}); raise it") from None
                raise ShardChecksumError(f"shard {url} has more than the {size} bytes its index says: refused "
                                         "(was it rewritten after the index?)") from None
            self._check(url, part, got, sha256, size)
            os.replace(part, target)
            log.debug("cached %s (%d bytes, %.2f s)", url, got, time.monotonic() - started)
        finally:
            with contextlib.suppress(FileNotFoundError):
                part.unlink()
        self._make_room(0)
        return target

    @staticmethod
    def _check(url: str, part: Path, got: int, sha256: str | None, size: int | None) -> None:
        if size is not None and got != size:
            raise ShardChecksumError(f"shard {url} has {got} bytes, its index says {size}: refused (was it "
                                     "rewritten after the index?)")
        if sha256 is not None:
            actual = file_sha256(part)
            if actual != sha256:
                raise ShardChecksumError(f"shard {url} has sha256 {actual}, its index says {sha256}: refused")

    @contextlib.contextmanager
    def _locked(self, target: Path, wait: bool = True) -> Iterator[bool]:
        """Holds ``target``'s lock (an ``flock``: it excludes other threads of this process too); yields False
        without waiting when ``wait`` is False and someone else holds it."""
        stripe = int(target.name[:8], 16) % LOCK_STRIPES
        lock = self.directory / f".lock-{stripe:03d}"
        with open(lock, "a+b") as handle:
            try:
                fcntl.flock(handle, fcntl.LOCK_EX if wait else fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                yield False
                return
            try:
                yield True
            finally:
                fcntl.flock(handle, fcntl.LOCK_UN)

    def entries(self) -> list[tuple[float, int, Path]]:
        """``(last use, bytes, path)`` of every complete copy, least recently used first."""
        found = []
        for path in self.directory.glob(f"*{_SUFFIX}"):
            try:
                st = path.stat()
            except FileNotFoundError:
                continue
            found.append((st.st_mtime, st.st_size, path))
        return sorted(found)

    def _make_room(self, incoming: int) -> None:
        """Evict the least recently used copies until ``incoming`` more bytes fit beside the copies and the fetches
        under way (each counted at the size it will reach, where known); remove the temporary files of fetches
        whose process is gone. Fetches under way are never evicted: when they alone pass the bound, it is passed
        until they end."""
        in_flight = 0
        for part in self.directory.glob(f"*{_SUFFIX}{_PART}.*"):
            pid = part.name.rsplit(".", 1)[-1]
            if pid.isdigit() and not _alive(int(pid)):
                with contextlib.suppress(FileNotFoundError):
                    part.unlink()
                continue
            reserved = part.name.rsplit(".", 2)[-2]
            with contextlib.suppress(FileNotFoundError):
                in_flight += max(int(reserved) if reserved.isdigit() else 0, part.stat().st_size)
        held = self.entries()
        total = sum(size for _, size, _ in held) + in_flight
        for _, size, path in held:
            if total + incoming <= self.max_bytes:
                break
            with contextlib.suppress(FileNotFoundError):
                path.unlink()
                log.debug("evicted %s from the shard cache (%d bytes)", path.name, size)
            total -= size


def _touch(path: Path) -> None:
    """Mark a copy as just used (its mtime orders eviction); a copy evicted meanwhile is fetched again later."""
    with contextlib.suppress(FileNotFoundError):
        os.utime(path)


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True
