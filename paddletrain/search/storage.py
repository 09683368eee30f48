"""Where a study lives: an embedded journal file in the sweep directory by default, a real database across machines.

- ``None`` (default): Optuna's journal file ``<sweep dir>/study.journal``: nothing to start, and several processes
  on one machine may write it at once (file locks), which SQLite's single writer does not take well.
- ``sqlite:///path.db``: one machine, one writer at a time.
- ``postgresql://user@host/db`` (or ``mysql://``): several ``fit -m`` commands on several machines join one study.
  Optuna creates its tables on first use, and two processes that start at the same moment on an empty database
  can both try (PostgreSQL refuses the second ``CREATE TABLE`` with a unique violation in ``pg_type``):
  :func:`open_storage` retries with a short, jittered back-off until the tables exist.

Trials record a heartbeat, so a trial whose process died (a kill, a lost node) is found stale by the next sweep
and continued from its newest checkpoint rather than counted as running forever.
"""
from __future__ import annotations

import logging
import random
import time
from pathlib import Path
from typing import Any

from paddletrain.errors import ConfigError

log = logging.getLogger("paddletrain")

JOURNAL_FILE = "study.journal"
# Seconds between a running trial's heartbeats, and after how many missed ones it counts as dead.
HEARTBEAT_SECONDS = 30
GRACE_SECONDS = 120
# Table creation collisions: how often and how long to retry.
CREATE_ATTEMPTS = 8
CREATE_BACKOFF_SECONDS = 0.5


def storage_url(storage: str | None, sweep_dir: Path) -> str:
    """The storage a sweep uses, as a string that every trial process can open again."""
    if storage:
        return str(storage)
    return f"journal:{Path(sweep_dir).resolve() / JOURNAL_FILE}"


def open_storage(url: str) -> Any:
    """An Optuna storage for ``url`` (see the module docstring for the forms), with trial heartbeats."""
    import optuna

    if url.startswith("journal:"):
        path = Path(url[len("journal:"):])
        path.parent.mkdir(parents=True, exist_ok=True)
        backend_cls = getattr(optuna.storages, "JournalFileBackend", None)
        if backend_cls is None:  # Optuna < 4 named it JournalFileStorage
            backend_cls = optuna.storages.JournalFileStorage
        return optuna.storages.JournalStorage(backend_cls(str(path)))
    if "://" not in url:
        raise ConfigError(f"hydra.sweeper.storage={url!r} is neither a database URL (sqlite:///..., "
                          "postgresql://...) nor null (a journal file in the sweep directory)")
    return _rdb_storage(url)


def _rdb_storage(url: str) -> Any:
    import optuna
    import sqlalchemy.exc

    last: Exception | None = None
    for attempt in range(CREATE_ATTEMPTS):
        try:
            return optuna.storages.RDBStorage(url, heartbeat_interval=HEARTBEAT_SECONDS, grace_period=GRACE_SECONDS,
                                              engine_kwargs={"pool_pre_ping": True})
        except (sqlalchemy.exc.IntegrityError, sqlalchemy.exc.ProgrammingError,
                sqlalchemy.exc.OperationalError) as exc:
            # Another process is creating the tables right now (or the server is starting): wait and try again.
            last = exc
            time.sleep(CREATE_BACKOFF_SECONDS * (attempt + 1) * (0.5 + random.random()))
    raise ConfigError(f"cannot open the study storage {url}: {type(last).__name__}: {str(last).splitlines()[0]}")
