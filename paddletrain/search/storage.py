"""Where a study lives: an embedded journal file in the sweep directory by default, a real database across machines.

- ``None`` (default): Optuna's journal file ``<sweep dir>/study.journal``: nothing to start, and several processes
  on one machine may write it at once (file locks), which SQLite's single writer does not take well.
- ``sqlite:///path.db``: one machine, one writer at a time.
- ``postgresql://user@host/db`` (or ``mysql://``): several ``fit -m`` commands on several machines join one study.
  Optuna creates its tables on first use, and two processes that start at the same moment on an empty database
  can both try (PostgreSQL refuses the second ``CREATE TABLE`` with a unique violation in ``pg_type``):
  :func:`open_storage` retries with a short, jittered back-off until the tables exist.

Sweeps that share a study take turns to count its trials and ask for the next (:func:`claiming`): a PostgreSQL
advisory lock across machines, a file lock beside a journal or SQLite file on one. Without the turns, two sweeps
whose trials end at the same moment both see one trial left and both start one.

In a database, the sweep running a trial records its heartbeat, so a trial whose sweep died (a kill, a lost node)
is found stale by the next sweep to look and handed on to a new trial that continues it from its newest checkpoint
(:func:`paddletrain.search.sweeper.requeue_abandoned`) rather than counted as running forever.
"""
from __future__ import annotations

import contextlib
import fcntl
import inspect
import logging
import random
import time
import warnings
import zlib
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from paddletrain.errors import ConfigError

log = logging.getLogger("paddletrain")

JOURNAL_FILE = "study.journal"
# Table creation collisions: how often and how long to retry.
CREATE_ATTEMPTS = 8
CREATE_BACKOFF_SECONDS = 0.5


@dataclass(frozen=True)
class Heartbeat:
    """How often the sweep running a trial records that it is alive (``interval``), and after how long without a
    heartbeat (``grace``) another sweep takes the trial for abandoned; seconds, in a database storage only."""

    interval: int = 30
    grace: int = 120


def storage_url(storage: str | None, sweep_dir: Path) -> str:
    """The storage a sweep uses, as a string that every trial process can open again."""
    if storage:
        return str(storage)
    return f"journal:{Path(sweep_dir).resolve() / JOURNAL_FILE}"


def open_storage(url: str, heartbeat: Heartbeat | None = None) -> Any:
    """An Optuna storage for ``url`` (see the module docstring for the forms); a database one with ``heartbeat``
    (and :func:`retry_callback` for its abandoned trials) when given."""
    import optuna

    if url.startswith("journal:"):
        path = Path(url[len("journal:"):])
        path.parent.mkdir(parents=True, exist_ok=True)
        journal = getattr(optuna.storages, "journal", None)
        backend_cls = getattr(journal, "JournalFileBackend", None)
        if backend_cls is None:  # Optuna < 4 named it JournalFileStorage
            backend_cls = optuna.storages.JournalFileStorage
        return optuna.storages.JournalStorage(backend_cls(str(path)))
    if "://" not in url:
        raise ConfigError(f"hydra.sweeper.storage={url!r} is neither a database URL (sqlite:///..., "
                          "postgresql://...) nor null (a journal file in the sweep directory)")
    return _rdb_storage(url, heartbeat)


# How often one trial is handed on to a new one (after a kill, a lost machine) before it counts as failed.
MAX_CONTINUATIONS = 3


def retry_callback() -> Any:
    """Optuna's callback that queues an abandoned trial again, with its parameters, user attributes (the run
    directory) and the values it reported (for the pruner), at most :data:`MAX_CONTINUATIONS` times."""
    import optuna

    retry = getattr(optuna.storages, "RetryHeartbeatStaleTrialCallback", None) or \
        optuna.storages.RetryFailedTrialCallback  # Optuna < 4.9
    with warnings.catch_warnings():  # "experimental" since Optuna 2.8, and the API the hand-on needs
        warnings.simplefilter("ignore", optuna.exceptions.ExperimentalWarning)
        return retry(max_retry=MAX_CONTINUATIONS, inherit_intermediate_values=True)


def _rdb_storage(url: str, heartbeat: Heartbeat | None) -> Any:
    import optuna
    import sqlalchemy.exc

    options: dict[str, Any] = {"engine_kwargs": {"pool_pre_ping": True}}
    if heartbeat is not None:
        parameters = inspect.signature(optuna.storages.RDBStorage).parameters
        on_stale = "heartbeat_stale_trial_callback" if "heartbeat_stale_trial_callback" in parameters else \
            "failed_trial_callback"  # its name before Optuna 4.9
        options.update(heartbeat_interval=heartbeat.interval, grace_period=heartbeat.grace,
                       **{on_stale: retry_callback()})
    last: Exception | None = None
    for attempt in range(CREATE_ATTEMPTS):
        try:
            return optuna.storages.RDBStorage(url, **options)
        except (sqlalchemy.exc.IntegrityError, sqlalchemy.exc.ProgrammingError,
                sqlalchemy.exc.OperationalError) as exc:
            # Another process is creating the tables right now (or the server is starting): wait and try again.
            last = exc
            time.sleep(CREATE_BACKOFF_SECONDS * (attempt + 1) * (0.5 + random.random()))
    raise ConfigError(f"cannot open the study storage {url}: {type(last).__name__}: {str(last).splitlines()[0]}")


@contextlib.contextmanager
def claiming(url: str, study_name: str) -> Iterator[None]:
    """One sweep at a time (of those sharing the study at ``url``) counts the study's trials and asks for new ones.

    PostgreSQL: a session advisory lock keyed by the study's name, held on a connection of its own (the trials the
    sweep asks for are committed by Optuna's own sessions before it is released). A journal or SQLite file: an
    ``fcntl`` lock on ``<file>.claim.lock``. Other databases: no turns (two sweeps may then run one trial more than
    ``n_trials`` between them).
    """
    if url.startswith("postgresql"):
        import sqlalchemy

        key = zlib.crc32(study_name.encode("utf-8"))
        with _engine(url).connect() as connection:
            connection.execute(sqlalchemy.text("SELECT pg_advisory_lock(:key)"), {"key": key})
            try:
                yield
            finally:
                connection.execute(sqlalchemy.text("SELECT pg_advisory_unlock(:key)"), {"key": key})
        return
    path = url[len("journal:"):] if url.startswith("journal:") else \
        url[len("sqlite:///"):] if url.startswith("sqlite:///") else None
    if not path:
        yield
        return
    with open(f"{path}.claim.lock", "a+b") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


_ENGINES: dict[str, Any] = {}


def _engine(url: str) -> Any:
    """One SQLAlchemy engine per database for the claims (a connection pool, not one connection per trial)."""
    import sqlalchemy

    if url not in _ENGINES:
        _ENGINES[url] = sqlalchemy.create_engine(url, pool_pre_ping=True, pool_size=1)
    return _ENGINES[url]
