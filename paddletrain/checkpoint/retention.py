"""Which checkpoints to keep: the last N by step, the best K by a metric, and the one a run resumed from.

The manager only ever deletes checkpoints it saved itself (or learned about through ``load_state_dict``),
and only after the new checkpoint and the ``latest.json``/``best.json`` pointers are durable.

Pointers are small JSON files replaced atomically rather than symlinks: symlinks need privileges on
Windows and are unsupported by some network and object-store mounts, and a JSON file can also carry the
step and metric so a reader need not open the checkpoint.
"""
from __future__ import annotations

import json
import logging
import math
import os
import shutil
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from ._fs import replace_json_atomically, write_error
from .errors import CheckpointError
from .manifest import read_manifest
from .storage import interrupted_save_name, save_checkpoint
from .untrusted import (
    StateValueError,
    checked_int,
    checked_mapping,
    checked_number,
    checked_optional_int,
    confined_path,
    is_plain_int,
    show,
)

log = logging.getLogger(__name__)

LATEST_POINTER = "latest.json"
BEST_POINTER = "best.json"


@dataclass
class _Record:
    name: str
    global_step: int
    epoch: int | None
    metric: float | None
    created: float


def checkpoint_name(epoch: int, global_step: int) -> str:
    """The one naming scheme of checkpoint directories: ``epoch0003-step0000120`` (sorts by time).

    No ``=`` in it: Hydra would read a path holding one as an override when it is given on the command line.
    """
    return f"epoch{epoch:04d}-step{global_step:07d}"


def _checked_name(root: Path, name: Any, key: str = "checkpoint name") -> str:
    # Names come from files and saved state; a path in one must never let pruning reach outside root.
    return confined_path(root, name, key, plain_name=True).name


def _record(item: Any, root: Path, key: str) -> _Record:
    """A record from saved state, every field checked (the name is pruned, the numbers rank)."""
    checked_mapping(item, key)
    return _Record(
        name=_checked_name(root, item.get("name"), f"{key}.name"),
        global_step=checked_int(item.get("global_step"), f"{key}.global_step", minimum=-1),
        epoch=checked_optional_int(item.get("epoch"), f"{key}.epoch"),
        metric=_as_metric(item.get("metric")),
        created=checked_number(item.get("created"), f"{key}.created", finite=True),
    )


def _pointer(record: _Record) -> dict[str, Any]:
    data = asdict(record)
    if data["metric"] is not None and not math.isfinite(data["metric"]):
        data["metric"] = str(data["metric"])  # strict JSON has no inf
    return data


def _as_metric(value: Any) -> float | None:
    try:
        metric = float(value)
    except (TypeError, ValueError):
        return None
    return None if math.isnan(metric) else metric



class CheckpointManager:
    """Save checkpoints under ``root`` and prune old ones.

    Args:
        root: directory holding one sub-directory per checkpoint.
        keep_last: newest checkpoints (by global step) to keep; at least 1, as resuming needs the newest.
        keep_best: best checkpoints by ``monitor`` to keep; 0 keeps none for their metric.
        monitor: name of the metric that ranks checkpoints (recorded in the metadata); None: no ranking.
        mode: ``"max"`` or ``"min"``: whether a larger or smaller metric is better. NaN/None is always worst.
    """

    def __init__(self, root: str | os.PathLike, keep_last: int = 1, keep_best: int = 1,
                 monitor: str | None = None, mode: str = "max") -> None:
        if mode not in ("max", "min"):
            raise ValueError(f"checkpoint mode must be 'max' or 'min', got {mode!r}")
        if keep_last < 1:
            raise ValueError(f"checkpoint keep_last must be >= 1 (resuming needs the newest), got {keep_last}")
        if keep_best < 0:
            raise ValueError(f"checkpoint keep_best must be >= 0, got {keep_best}")
        self.root = Path(root)
        self.keep_last, self.keep_best, self.monitor, self.mode = keep_last, keep_best, monitor, mode
        self._records: dict[str, _Record] = {}
        self._protected: str | None = None

    # -- saving ---------------------------------------------------------------------------------------
    def save(self, state: dict, name: str | None = None, metadata: dict | None = None,
             metric: float | None = None) -> Path:
        """Save ``state`` as a new checkpoint, update the pointers, then prune. Returns its path.

        ``metadata`` must hold ``global_step`` (and should hold ``epoch``); the default name is
        :func:`checkpoint_name` (``epoch0003-step0000120``). ``metric`` is the value of ``monitor`` for this checkpoint.
        """
        metadata = dict(metadata or {})
        step, epoch = metadata.get("global_step"), metadata.get("epoch")
        if not isinstance(step, int):
            raise ValueError(f"checkpoint metadata must hold an int 'global_step', got {metadata!r}")
        if name is None:
            name = checkpoint_name(epoch if isinstance(epoch, int) else 0, step)
        _checked_name(self.root, name)
        if self.monitor is not None:
            metadata.setdefault("monitor", self.monitor)
            metadata.setdefault("monitor_mode", self.mode)
            metadata["metric"] = metric
        path = save_checkpoint(self.root / name, state, metadata)
        manifest = read_manifest(path)
        self._records[name] = _Record(name, step, epoch if isinstance(epoch, int) else None,
                                      _as_metric(metric), float(manifest["created"]))
        self._write_pointers()
        self._prune()
        return path

    def protect(self, path: str | os.PathLike) -> None:
        """Never delete ``path`` (the checkpoint this run resumed from), and rank it with the others.

        A hidden ``.tmp-<name>-*``/``.old-<name>-*`` path (``find_latest`` returns one when a crash left the
        newest complete checkpoint there) stands for ``<name>``, which the next save restores it to.
        """
        path = Path(path)
        if path.parent.resolve() != self.root.resolve():
            return  # outside root: the manager would never delete it anyway
        self._protected = interrupted_save_name(path) or path.name
        self._adopt(self._protected, path)

    def _adopt(self, name: str, path: Path | None = None) -> None:
        # A checkpoint's own state was captured before it was recorded; read its record from its manifest.
        if name in self._records:
            return
        path = path or self.root / name
        try:
            manifest = read_manifest(path)
        except CheckpointError as error:
            log.warning("not tracking %s: %s", path, error)
            return
        meta = manifest.get("metadata") or {}
        step, epoch = meta.get("global_step"), meta.get("epoch")
        self._records[name] = _Record(name, step if is_plain_int(step) else -1, epoch if is_plain_int(epoch) else None,
                                      _as_metric(meta.get("metric")), manifest["created"])

    # -- ranking --------------------------------------------------------------------------------------
    def _by_recency(self) -> list[_Record]:
        return sorted(self._records.values(), key=lambda r: (r.global_step, r.created), reverse=True)

    def _by_quality(self) -> list[_Record]:
        if self.monitor is None or self.keep_best == 0:
            return []
        ranked = [r for r in self._records.values() if r.metric is not None]
        sign = -1.0 if self.mode == "max" else 1.0
        # Ties go to the earlier checkpoint: it reached the value first.
        return sorted(ranked, key=lambda r: (sign * r.metric, r.global_step, r.created))

    @property
    def last_path(self) -> Path | None:
        newest = self._by_recency()
        return self.root / newest[0].name if newest else None

    @property
    def best_path(self) -> Path | None:
        best = self._by_quality()
        return self.root / best[0].name if best else None

    def _write_pointers(self) -> None:
        for pointer, records in ((LATEST_POINTER, self._by_recency()), (BEST_POINTER, self._by_quality())):
            try:
                if records:
                    replace_json_atomically(self.root / pointer, _pointer(records[0]))
                else:
                    (self.root / pointer).unlink(missing_ok=True)
            except OSError as error:
                # The checkpoint itself is complete; nothing is pruned, so every earlier one stays too.
                raise write_error(self.root / pointer, error, "checkpoint pointer") from error

    def _prune(self) -> None:
        keep = {r.name for r in self._by_recency()[: self.keep_last]}
        keep |= {r.name for r in self._by_quality()[: self.keep_best]}
        if self._protected is not None:
            keep.add(self._protected)
        for name in [n for n in self._records if n not in keep]:
            log.info("removing old checkpoint %s", self.root / name)
            del self._records[name]
            shutil.rmtree(self.root / name, ignore_errors=True)

    # -- resume ---------------------------------------------------------------------------------------
    def state_dict(self) -> dict[str, Any]:
        """Tracked checkpoints and their metrics, to store inside the training state."""
        return {"version": 1, "monitor": self.monitor, "mode": self.mode,
                "records": [asdict(r) for r in self._records.values()]}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore tracking from :meth:`state_dict`; checkpoints deleted since are dropped.

        Every record is checked first (``StateValueError`` names the bad one): its name must be a plain
        directory name inside ``root`` (no path, no symlink out), its counters integers.
        """
        checked_mapping(state, "(manager state)")
        items = state.get("records", [])
        if not isinstance(items, list):
            raise StateValueError("records", f"is {show(items)}: expected a list")
        records = [_record(item, self.root, f"records[{i}]") for i, item in enumerate(items)]
        if state.get("monitor") != self.monitor or state.get("mode") != self.mode:
            log.warning("checkpoint ranking changed from %s/%s to %s/%s: earlier metrics may not compare",
                           show(state.get("monitor")), show(state.get("mode")), self.monitor, self.mode)
        self._records = {r.name: r for r in records if (self.root / r.name).is_dir()}
        if self._protected is not None:
            self._adopt(self._protected)


def read_pointer(root: str | os.PathLike, which: str = "latest") -> Path | None:
    """The checkpoint ``latest.json`` or ``best.json`` under ``root`` points to, if it still exists."""
    if which not in ("latest", "best"):
        raise ValueError(f"which must be 'latest' or 'best', got {which!r}")
    pointer = Path(root) / (LATEST_POINTER if which == "latest" else BEST_POINTER)
    try:
        name = _checked_name(Path(root), json.loads(pointer.read_text("utf-8"))["name"])
    except (OSError, ValueError, KeyError, TypeError, RecursionError):
        return None
    path = Path(root) / name
    return path if path.is_dir() else None
