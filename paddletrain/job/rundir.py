"""One run directory, one writer: an exclusive lock that `python -m paddletrain.fit` holds for the whole run.

The lock is ``fcntl.flock`` on ``<run dir>/.paddletrain.lock``. The kernel releases it when the holding
process ends, however it ends (``kill -9`` included), so a lock file left behind never blocks the next run:
only a live holder does. The file records the holder's pid and host so a refused run can say who holds it.
With ``trainer.devices=N`` the launcher holds the lock and the ranks it starts do not take it.

It is taken first by :class:`paddletrain.validation.RunDirGuard`, a Hydra callback that runs before Hydra writes
``.hydra/`` into the run directory (so a refused run cannot overwrite the running one's saved config), then again (a
no-op in the same process) by ``fit``'s launcher and by ``build.train``, which holds it for its own duration when
called without the callback: sweeps, downstream Hydra apps, Python code.
"""
from __future__ import annotations

import errno
import json
import logging
import os
import shutil
import socket
import stat
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

from paddletrain.errors import UserError

try:
    import fcntl
except ImportError:  # pragma: no cover - not POSIX: runs are not locked
    fcntl = None  # type: ignore[assignment]

LOCK_FILE = ".paddletrain.lock"
# What every start writes into a run directory before any work: Hydra's record of the config, and the lock.
# With the run's log file(s) and a launcher's rank logs, a directory holding nothing else records only a failed
# start (see discard_failed_start).
STARTUP_ENTRIES = (".hydra", LOCK_FILE, "launch")
HYDRA_FILES = ("config.yaml", "hydra.yaml", "overrides.yaml")
# The holder record is a few dozen bytes; never read more than this from a file someone else may have made.
MAX_RECORD_BYTES = 4096


class RunDirBusy(UserError):
    """Another live process holds the run directory's lock."""


@dataclass
class RunDirLock:
    """A held lock: the run directory, the lock file and its open descriptor (closing it releases the lock)."""

    run_dir: Path
    path: Path
    fd: int


# The one run directory this process writes (a process runs one training at a time).
_held: RunDirLock | None = None
# The run directory this process's RunDirGuard found missing and so created, with the top-most of its parents
# that was missing too (``outputs/`` on a first run); None: it existed, or no guard ran.
_created: tuple[Path, Path] | None = None


def hold_run_dir(run_dir: str | Path) -> RunDirLock | None:
    """Take the exclusive lock on ``run_dir`` (created if needed) for the rest of this process's life.

    Holding a new directory releases the one held before; returns None (unlocked, with a warning) where the
    platform has no ``flock``. Raises :class:`RunDirBusy` naming the directory and the holder's pid and host
    when another live process holds it, and :class:`UserError` when the lock file is not a regular file (a
    symlink or FIFO planted in a run directory someone handed over) or the directory cannot be locked.
    """
    global _held
    run_dir = Path(run_dir).resolve()
    if _held is not None and _held.run_dir == run_dir:
        return _held
    if fcntl is None:  # pragma: no cover
        logging.getLogger("paddletrain").warning("run directory %s is not locked: this platform has no flock",
                                                 run_dir)
        return None
    path = run_dir / LOCK_FILE
    try:
        run_dir.mkdir(parents=True, exist_ok=True)
        # O_NOFOLLOW: a symlink planted as the lock file must not make us truncate what it points to.
        fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC, 0o644)
    except OSError as exc:
        reason = "it is a symlink" if exc.errno == errno.ELOOP else exc.strerror
        raise UserError(f"cannot open the run directory lock {path}: {reason}") from None
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            raise UserError(f"the run directory lock {path} is not a regular file; remove it")
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            raise RunDirBusy(f"run directory {run_dir} is in use by another paddletrain run "
                             f"({describe_holder(fd)}); wait for it to end or pick another hydra.run.dir") from None
        except OSError as exc:  # e.g. ENOLCK: a file system without locks
            raise UserError(f"cannot lock the run directory {run_dir} ({path}: {exc.strerror}); use a run "
                            "directory on a file system with locks") from None
        record = json.dumps({"pid": os.getpid(), "host": socket.gethostname(), "since": time.time()})
        try:
            os.ftruncate(fd, 0)
            os.pwrite(fd, record.encode() + b"\n", 0)
        except OSError as exc:  # e.g. a full disk: the run could not write its checkpoints either
            raise UserError(f"cannot write the run directory lock {path}: {exc.strerror}") from None
    except BaseException:
        os.close(fd)
        raise
    release_run_dir()
    _held = RunDirLock(run_dir, path, fd)
    return _held


@contextmanager
def holding_run_dir(run_dir: str | Path) -> Iterator[RunDirLock | None]:
    """:func:`hold_run_dir` for the ``with`` block; releases on exit only a lock it took itself."""
    already = held_run_dir() == Path(run_dir).resolve()
    lock = hold_run_dir(run_dir)
    try:
        yield lock
    finally:
        if not already:
            release_run_dir()


def release_run_dir() -> None:
    """Release the lock this process holds, if any (the process's end releases it too)."""
    global _held
    if _held is not None:
        os.close(_held.fd)
        _held = None


def held_run_dir() -> Path | None:
    """The run directory this process holds, or None."""
    return _held.run_dir if _held is not None else None


def wait_until_free(run_dir: str | Path, timeout: float, poll: float = 0.5) -> bool:
    """Wait until no process holds ``run_dir``'s lock (e.g. a stopped run still saving its checkpoint), at most
    ``timeout`` seconds; returns whether it is free (a directory without a lock file is)."""
    path = Path(run_dir) / LOCK_FILE
    deadline = time.monotonic() + timeout
    while True:
        try:
            fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
        except OSError:
            return True  # no lock file (or none we could take): nobody holds it
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            return True  # closing the descriptor releases it at once
        except OSError:
            if time.monotonic() >= deadline:
                return False
        finally:
            os.close(fd)
        time.sleep(poll)


def describe_holder(fd: int) -> str:
    """``pid 123 on host`` from the lock file's record, or why it cannot be told."""
    try:
        raw = os.pread(fd, MAX_RECORD_BYTES, 0)
        record = json.loads(raw.decode("utf-8"))
        pid, host = int(record["pid"]), str(record["host"])[:255]
    except (OSError, ValueError, KeyError, TypeError):
        return "pid unknown: it is starting, or the lock file was not written by paddletrain"
    return f"pid {pid} on {host}"


def discard_failed_start(run_dir: str | Path) -> bool:
    """Remove ``run_dir`` after a failed start (bad input, or stopped during start-up) when this run created it
    and it holds nothing but what every start writes: ``.hydra/``, the lock, the run's log file and a
    launcher's ``launch/`` logs. Returns whether it was removed; anything else in it keeps it.

    The caller has already said why the run failed on the console; the log file is closed first.
    """
    run_dir = Path(run_dir).resolve()
    if _created is None or _created[0] != run_dir or not run_dir.is_dir():
        return False
    root = logging.getLogger()
    logs = {h: Path(h.baseFilename) for h in root.handlers if isinstance(h, logging.FileHandler)}
    own_logs = {path.name for path in logs.values() if path.parent == run_dir}
    try:
        entries = list(run_dir.iterdir())
        hydra = run_dir / ".hydra"
        if any(e.name not in STARTUP_ENTRIES and e.name not in own_logs for e in entries) or (
                hydra.is_dir() and any(f.name not in HYDRA_FILES for f in hydra.iterdir())):
            return False
    except OSError:
        return False
    for handler, path in logs.items():
        if path.parent == run_dir:
            root.removeHandler(handler)
            handler.close()
    if held_run_dir() == run_dir:
        release_run_dir()
    shutil.rmtree(run_dir, ignore_errors=True)
    if run_dir.exists():
        return False
    # The parents this run created (outputs/<name>/ of outputs/<name>/<time>), as long as they are empty.
    parent, top = run_dir.parent, _created[1]
    while parent == top or top in parent.parents:
        try:
            parent.rmdir()
        except OSError:  # not empty (another run's), or gone
            break
        parent = parent.parent
    return True


def hold_new_run_dir(run_dir: Path) -> None:
    """Hold ``run_dir`` for this job (:func:`hold_run_dir`), noting whether this start creates it: only then may
    :func:`discard_failed_start` remove it after a failed start."""
    global _created
    _created = None if run_dir.exists() else (run_dir.resolve(), _top_missing(run_dir.resolve()))
    hold_run_dir(run_dir)


def _top_missing(path: Path) -> Path:
    """The top-most of ``path`` and its parents that does not exist yet (``path`` itself does not)."""
    top = path
    while not top.parent.exists() and top.parent != top:
        top = top.parent
    return top
