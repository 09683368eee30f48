"""No silent hangs: every rank leaves a heartbeat saying where it is; the launcher ends a job that stopped moving.

Why files watched by paddletrain's launcher, rather than a timeout inside Paddle: Paddle 3.3.1 has no
per-collective timeout for gloo that Python can set (``init_parallel_env`` creates ``ProcessGroupGloo`` without
one; ``PADDLE_PG_TIMEOUT`` is not applied to it: measured, gloo gives up after a fixed 30 s whatever it says),
and a rank stuck inside a collective runs no Python code, so it cannot say who it is waiting for. The launcher,
which already supervises every rank, can: the ranks of a data-parallel job pass the same collectives in the same
order, so when ranks stop moving, those furthest ahead are waiting for those behind.

- **Rank side** (:class:`paddletrain.callbacks.heartbeat.Heartbeat`, a callback added to every rank started by
  paddletrain's launcher): at each training batch, validation and epoch boundary it writes
  ``heartbeat.<rank>.json`` in the launch log directory: its position (comparable across ranks) and a description
  such as ``step 12 of epoch 0 (forward, backward and the gradient all_reduce)``.
- **Launcher side** (:class:`Watchdog`): notes when each rank's heartbeat last changed (on its own clock, so the
  nodes' clocks need not agree); when one has not changed for ``trainer.collective_timeout`` seconds,
  :func:`stall_line` names the ranks that did not arrive and where the others wait, and the launcher ends the job
  with :attr:`~paddletrain.errors.ExitCode.TIMED_OUT`.

Start-up (reading data, building the model, the ranks meeting) is not watched: no rank has a heartbeat yet.
"""
from __future__ import annotations

import json
import logging
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path

log = logging.getLogger("paddletrain")

HEARTBEAT_GLOB = "heartbeat.*.json"
# A rank that stays at one position (validation batches) refreshes its heartbeat at most this often.
REFRESH_SECONDS = 1.0
# Every record is padded to this size and written over the previous one in place: one pwrite per beat (a
# temporary file and a rename cost 2-3 ms a beat on the busy test machine, over 1% of a tiny step).
RECORD_BYTES = 1024

# A rank's position is (epoch, stage, batch, 0 before / 1 after the batch's step): every rank passes the same
# positions in the same order, so positions compare across ranks. Validation batches are not counted (the padded
# shards differ in length; validation has no collective until its end).
EPOCH_START, TRAINING, VALIDATION, AFTER_VALIDATION, EPOCH_END = range(5)


def heartbeat_path(log_dir: Path, rank_id: int) -> Path:
    return Path(log_dir) / f"heartbeat.{rank_id}.json"


@dataclass
class RankState:
    """What the launcher last read from one rank's heartbeat, and when (its own clock) that last changed."""

    position: tuple
    where: str
    since: float


def stall_line(states: dict[int, RankState], now: float, timeout: float, expected: Iterable[int] = (),
               ended_first: set[int] | None = None) -> str | None:
    """One line naming the ranks that did not arrive and where the others wait, or None while all is moving.

    The job counts as stalled when a rank's heartbeat has not changed for ``timeout`` seconds. ``expected``:
    ranks that should have a heartbeat; one without any, while others train, is still starting.
    ``ended_first``: judge now, whatever the ages, a job that already ended on a lost peer, these ranks ending
    first: a hang only if some rank was late and none of them was (a rank killed while late is lost, not hung).
    """
    force = ended_first is not None
    if not states:
        return None
    stuck = [r for r, s in states.items() if now - s.since >= timeout]
    if not stuck and not force:
        return None
    # Judged now (force): the wait was ended by another timeout than this one.
    limit = "" if force else f" (trainer.collective_timeout={timeout:g} s)"
    ahead = max(s.position for s in states.values())
    waiting = sorted(r for r, s in states.items() if s.position == ahead)
    late = {r: f"last seen in {s.where}, {now - s.since:.0f} s ago" for r, s in sorted(states.items())
            if s.position < ahead}
    late.update({r: "not training yet (still starting)" for r in expected if r not in states})
    if force and (not late or ended_first & set(late)):
        return None
    if late:
        first = states[waiting[0]]
        details = "; ".join(f"rank {r} {text}" for r, text in sorted(late.items()))
        return (f"{_ranks(late)} did not arrive: {_ranks(waiting)} waited {now - first.since:.0f} s in "
                f"{first.where}{limit}; {details}")
    stalled = states[stuck[0]]
    return f"{_ranks(stuck)} made no progress for {now - stalled.since:.0f} s in {stalled.where}{limit}"


def _ranks(ranks: Iterable[int]) -> str:
    """``rank 1`` or ``ranks 0, 2``."""
    ranks = sorted(ranks)
    return f"rank {ranks[0]}" if len(ranks) == 1 else "ranks " + ", ".join(map(str, ranks))


class Watchdog:
    """The launcher's side: reads the heartbeats of ``expected`` ranks in ``log_dirs`` (see the module docstring)."""

    def __init__(self, log_dirs: list[Path], timeout: float, expected: Iterable[int] = (),
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.log_dirs = [Path(d) for d in log_dirs]
        self.timeout = float(timeout)
        self.expected = list(expected)
        self.clock = clock
        self._states: dict[int, RankState] = {}
        self._raw: dict[int, str] = {}
        self._done: set[int] = set()
        self._started = time.time()

    def reset(self) -> None:
        """A new attempt: forget what was seen and remove this node's heartbeats of an earlier one."""
        self._states.clear()
        self._raw.clear()
        self._done.clear()
        self._started = time.time()
        for path in self.log_dirs[0].glob(HEARTBEAT_GLOB):
            path.unlink(missing_ok=True)

    def poll(self) -> str | None:
        """Read the heartbeats; the line saying how the job stalled once it has, else None."""
        self._read()
        return stall_line(self._states, self.clock(), self.timeout, self._waiting_for())

    def describe(self, ended_first: set[int]) -> str | None:
        """After the job ended on a lost peer, ``ended_first`` ending first: who was late and where the others
        waited, when it was a hang (:func:`stall_line`). Ranks of other nodes count as ending first: this launcher
        cannot see whether they were killed."""
        self._read()
        unseen = set(self._states) - set(self.expected)
        return stall_line(self._states, self.clock(), self.timeout, self._waiting_for(),
                          ended_first=set(ended_first) | unseen)

    def _waiting_for(self) -> list[int]:
        return [r for r in self.expected if r not in self._done]

    def _read(self) -> None:
        now = self.clock()
        for directory in self.log_dirs:
            for path in directory.glob(HEARTBEAT_GLOB):
                try:
                    if path.stat().st_mtime < self._started - 1:  # another node's, from an earlier attempt
                        continue
                    raw = path.read_text()
                    record = json.loads(raw)
                    rank_id, position, where = int(record["rank"]), tuple(record["position"]), str(record["where"])
                except (OSError, ValueError, KeyError, TypeError):
                    continue  # being replaced, or not ours
                if record.get("done"):
                    self._done.add(rank_id)
                    self._states.pop(rank_id, None)
                elif self._raw.get(rank_id) != raw:
                    self._raw[rank_id] = raw
                    self._states[rank_id] = RankState(position, where, now)
