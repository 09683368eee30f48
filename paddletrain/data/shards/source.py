"""Where shards come from: brace-expanded URL lists, and reading a local file or an HTTP(S) URL within bounds.

``data.urls='/data/train-{000000..000127}.tar'`` (WebDataset's notation) expands to 128 names, the numbers padded
to the width written; ``{a,b}`` lists alternatives; several patterns may be given as a list. A name is a local
path (or ``file://``) or an ``http://``/``https://`` URL; any other scheme is refused.

HTTP is read with the standard library (:mod:`urllib.request`), one shard at a time, into a file:

- every connection and read has a timeout (``timeout``), and the whole fetch a deadline (``deadline``);
- a connection that drops mid-shard is retried with exponential backoff, continuing from the byte reached with a
  ``Range`` request (from the start when the server ignores ranges);
- a client error (404, 403) is not retried; a server error (5xx) is;
- a shard larger than ``max_bytes`` is refused as soon as its size (or the bytes received) says so.

A server that stays away ends with one :class:`ShardFetchError` naming the URL, the byte offset reached, the
attempts and the last error.
"""
from __future__ import annotations

import http.client
import io
import logging
import re
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import BinaryIO

from paddletrain.data.errors import DatasetError, SourceUnavailableError

log = logging.getLogger("paddletrain")

# A pattern expanding to more names than this is a mistake, not a data set.
MAX_URLS = 1_000_000
_BRACE = re.compile(r"\{([^{}]*)\}")
_RANGE = re.compile(r"^(-?\d+)\.\.(-?\d+)$")


class ShardFetchError(SourceUnavailableError):
    """A shard (or index) could not be read; the message names the URL and how far the read got."""


class TooLargeError(ShardFetchError):
    """The resource has more bytes than the read allows."""


def expand_braces(pattern: str) -> list[str]:
    """All names of a WebDataset brace pattern, in order (``{000..002}`` -> ``000 001 002``; ``{a,b}``).

    Raises:
        DatasetError: an empty or reversed range, or more than :data:`MAX_URLS` names.
    """
    match = _BRACE.search(pattern)
    if match is None:
        return [pattern]
    body = match.group(1)
    numbers = _RANGE.match(body)
    if numbers:
        first, last = numbers.groups()
        lo, hi = int(first), int(last)
        if hi < lo:
            raise DatasetError(f"the range {{{body}}} in {pattern!r} counts down; write {{{last}..{first}}}")
        if hi - lo + 1 > MAX_URLS:
            raise DatasetError(f"{pattern!r} expands to {hi - lo + 1} names, more than {MAX_URLS}")
        width = len(first) if first.lstrip("-").startswith("0") and len(first) > 1 else 0
        choices = [str(n).zfill(width) for n in range(lo, hi + 1)]
    else:
        choices = body.split(",")
    head, tail = pattern[:match.start()], pattern[match.end():]
    names: list[str] = []
    for choice in choices:
        names += expand_braces(head + choice + tail)
        if len(names) > MAX_URLS:
            raise DatasetError(f"{pattern!r} expands to more than {MAX_URLS} names")
    return names


def expand_urls(spec: str | Iterable[str], key: str) -> list[str]:
    """The shard names of a ``data.urls``-like value: a pattern, or a list of them, each brace-expanded.

    Raises:
        DatasetError: nothing given, an unknown URL scheme, or a name listed twice (it would be read twice an
            epoch).
    """
    patterns = [spec] if isinstance(spec, str) else list(spec) if isinstance(spec, Iterable) else None
    if patterns is None or not all(isinstance(p, str) for p in patterns):
        raise DatasetError(f"{key}={spec!r} must be a path or URL pattern, or a list of them")
    urls = [url for pattern in patterns for url in expand_braces(str(pattern).strip())]
    if not urls or not all(urls):
        raise DatasetError(f"{key} names no shard; e.g. \"{key}='/data/train-{{000000..000009}}.tar'\"")
    for url in urls:
        scheme = urllib.parse.urlsplit(url).scheme
        if scheme not in ("", "file", "http", "https") and not re.match(r"^[A-Za-z]:[\\/]", url):
            raise DatasetError(f"{key}: {url!r} has the scheme {scheme!r}; shards are read from local paths, "
                               "file:// or http(s)://")
    seen: set[str] = set()
    for url in urls:
        if url in seen:
            raise DatasetError(f"{key} names {url!r} twice: each shard is read once an epoch")
        seen.add(url)
    return urls


def is_remote(url: str) -> bool:
    """Whether ``url`` is read over HTTP(S) (and so through the cache)."""
    return urllib.parse.urlsplit(url).scheme in ("http", "https")


def local_path(url: str) -> Path:
    """The file a local name (a path or ``file://`` URL) stands for."""
    if url.startswith("file://"):
        return Path(urllib.request.url2pathname(urllib.parse.urlsplit(url).path))
    return Path(url).expanduser()


def base_name(url: str) -> str:
    """The file name at the end of a path or URL (its query left out): how an index names the shard."""
    path = urllib.parse.urlsplit(url).path if is_remote(url) or url.startswith("file://") else url
    return path.rstrip("/").rsplit("/", 1)[-1]


def sibling(url: str, name: str) -> str:
    """``name`` in the folder of ``url`` (the index beside the shards)."""
    if is_remote(url):
        return urllib.parse.urljoin(url, name)
    return str(local_path(url).parent / name)


@dataclass(frozen=True)
class FetchPolicy:
    """How long and how often an HTTP read is tried (``data.timeout``, ``data.retries``, ``data.deadline``)."""

    timeout: float = 15.0
    retries: int = 5
    deadline: float = 120.0
    backoff: float = 0.5
    backoff_max: float = 30.0


class _ClientError(Exception):
    """An HTTP status that retrying cannot change (404, 403, ...)."""


class _TooLarge(_ClientError):
    """More bytes than allowed: retrying cannot change that either."""


def fetch(url: str, out: BinaryIO, *, max_bytes: int, policy: FetchPolicy = FetchPolicy()) -> int:
    """Copy the HTTP(S) resource ``url`` into ``out`` (a file opened for writing, at position 0); return its size.

    Raises:
        ShardFetchError: a client error, more than ``max_bytes``, or no complete copy after ``policy.retries``
            retries or ``policy.deadline`` seconds; the message names the URL and the byte offset reached.
    """
    started = time.monotonic()
    progress = _Progress()
    attempt = 0
    last = ""
    while True:
        try:
            _fetch_once(url, out, progress, max_bytes, policy.timeout)
            return progress.got
        except _TooLarge as exc:
            raise TooLargeError(f"cannot read {url}: {exc}") from None
        except _ClientError as exc:
            raise ShardFetchError(f"cannot read {url}: {exc}") from None
        except (OSError, http.client.HTTPException) as exc:  # dropped, refused, timed out (an OSError), 5xx
            last = ("the connection closed before the end" if isinstance(exc, http.client.IncompleteRead)
                    else f"{type(exc).__name__}: {exc}")
            progress.got = out.tell()
        got, total = progress.got, progress.total
        attempt += 1
        elapsed = time.monotonic() - started
        pause = min(policy.backoff * 2 ** (attempt - 1), policy.backoff_max)
        of = f" of {total}" if total is not None else ""
        if attempt > policy.retries or elapsed + pause > policy.deadline:
            raise ShardFetchError(f"cannot read {url}: stopped at byte {got}{of} after {attempt} attempts in "
                                  f"{elapsed:.1f} s ({last}); check that the server is up, or raise data.retries / "
                                  "data.deadline") from None
        _say(url, f"shard server: reading {url} failed at byte {got}{of} ({last}); attempt {attempt + 1} of "
                  f"{policy.retries + 1} in {pause:.1f} s")
        time.sleep(pause)


@dataclass
class _Progress:
    """Bytes received so far, and the resource's size once a response has said it."""

    got: int = 0
    total: int | None = None
    first: int = 0  # the byte the current attempt started at


# A read still going after this many seconds logs its progress; at most one line per URL in SAY_EVERY seconds.
SLOW_READ_SECONDS = 10.0
SAY_EVERY = 5.0
_said: dict[str, float] = {}


def _say(url: str, line: str) -> None:
    """Log ``line`` about ``url`` unless a line about it was logged less than :data:`SAY_EVERY` seconds ago."""
    now = time.monotonic()
    if now - _said.get(url, -SAY_EVERY) >= SAY_EVERY:
        _said[url] = now
        log.warning("%s", line)


def _fetch_once(url: str, out: BinaryIO, progress: _Progress, max_bytes: int, timeout: float) -> None:
    got, total = progress.got, progress.total
    progress.first = got
    headers = {"Range": f"bytes={got}-"} if got else {}
    request = urllib.request.Request(url, headers=headers)
    try:
        response = urllib.request.urlopen(request, timeout=timeout)  # noqa: S310 (the scheme was checked)
    except urllib.error.HTTPError as exc:
        if exc.code == 416 and total is not None and got == total:
            return  # asked for the bytes after the last one: the copy is complete
        if 400 <= exc.code < 500 and exc.code not in (408, 429):
            raise _ClientError(f"HTTP {exc.code} {exc.reason}") from None
        raise OSError(f"HTTP {exc.code} {exc.reason}") from None
    with response:
        if got and response.status != 206:  # the server ignored the range: start again
            out.seek(0)
            out.truncate()
            got = progress.first = 0
        length = response.headers.get("Content-Length")
        if length is not None and length.isdigit():
            size = got + int(length)
            if size > max_bytes:
                raise _TooLarge(f"{size} bytes, more than the bound of {max_bytes}")
            progress.total = total = size
        started = time.monotonic()
        while True:
            chunk = response.read1(1 << 20)  # what has arrived: a read that times out keeps the bytes before it
            if not chunk:
                break
            out.write(chunk)
            got += len(chunk)
            progress.got = got
            seconds = time.monotonic() - started
            if seconds > SLOW_READ_SECONDS:  # a slow server: its progress is seen, not waited on in silence
                of = f" of {total}" if total is not None else ""
                rate = (got - progress.first) / 1024 / seconds
                _say(url, f"shard server: reading {url} slowly, byte {got}{of} ({rate:.0f} KiB/s)")
            if got > max_bytes:
                raise _TooLarge(f"more than the bound of {max_bytes} bytes")
    if total is not None and got < total:
        raise http.client.IncompleteRead(b"", total - got)


def read_bytes(url: str, *, max_bytes: int, policy: FetchPolicy = FetchPolicy()) -> bytes:
    """The whole of a small resource (an index): a local file or an HTTP(S) URL, within ``max_bytes``."""
    if not is_remote(url):
        path = local_path(url)
        try:
            size = path.stat().st_size
            if size > max_bytes:
                raise ShardFetchError(f"{url} is {size} bytes, more than the {max_bytes} allowed")
            return path.read_bytes()
        except OSError as exc:
            raise ShardFetchError(f"cannot read {url}: {exc}") from None
    buffer = io.BytesIO()
    fetch(url, buffer, max_bytes=max_bytes, policy=policy)
    return buffer.getvalue()


def exists(url: str, policy: FetchPolicy = FetchPolicy()) -> bool:
    """Whether ``url`` can be read: a regular file, or an HTTP resource that answers a HEAD with 2xx."""
    if not is_remote(url):
        return local_path(url).is_file()
    request = urllib.request.Request(url, method="HEAD")
    try:
        with urllib.request.urlopen(request, timeout=policy.timeout):  # noqa: S310
            return True
    except urllib.error.HTTPError as exc:
        if 400 <= exc.code < 500:
            return False
        raise ShardFetchError(f"cannot reach {url}: HTTP {exc.code} {exc.reason}") from None
    except (OSError, http.client.HTTPException) as exc:
        raise ShardFetchError(f"cannot reach {url}: {type(exc).__name__}: {exc}") from None
