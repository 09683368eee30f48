"""A lost rank costs one restart, not the job: ``trainer.max_restarts``, around paddletrain's launcher.

When an attempt of the job ends with a rank lost or hung (:data:`RESTARTABLE`), every rank has already stopped
(Paddle's launcher stops a failed pod's other ranks; the watchdog kills hung ones), and the job is started again
with ``trainer.resume=auto``: from the newest complete checkpoint in the run directory, exactly where it was
saved, so the final weights equal those of the same run left alone. Each restart is logged in one line with its
cause; when the restarts are used up the job ends with the last cause and the count.

Like torchrun's ``--max-restarts`` every rank is stopped and restarted, not only the lost one (the group is
formed anew); unlike torchrun, only endings a retry can pass are restarted (below).

Why here and not Paddle's own ``--max_restart``/``--elastic_level``: Paddle restarts the ranks with the very same
command line (they would start from scratch, or from the checkpoint the user named, not the newest one), it
restarts on any failure, a bad config or a corrupt image included, which would fail again the same way, and it
needs its elastic master; it also prints its own ``Container failed`` reports, where paddletrain prints one
verdict.

Which endings restart, and why:

- ``RANK_LOST`` (a rank killed, e.g. by the out-of-memory killer, crashed inside Paddle, or its machine gone):
  the cause is outside the run; the same step on a fresh process usually passes.
- ``TIMED_OUT`` (a collective or a rank stuck longer than ``trainer.collective_timeout``): typically a network or
  node problem. A hang that is a bug recurs, and costs each restart one timeout.
- Not restarted: ``USER_ERROR`` (config, data, checkpoint: it would fail again at the same place), ``BAD_RESULT``
  (resume is exact, so a diverged run diverges again), ``UNEXPECTED`` (a Python exception in paddletrain or
  Paddle: deterministic replay raises it again, and its traceback is what the user needs), a stop the user asked
  for (SIGTERM/SIGINT), and success.
"""
from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from pathlib import Path

from paddletrain.checkpoint import find_latest
from paddletrain.errors import ExitCode

log = logging.getLogger("paddletrain")

RESTARTABLE = (ExitCode.RANK_LOST, ExitCode.TIMED_OUT)
_RESUME_KEYS = ("trainer.resume=", "+trainer.resume=", "++trainer.resume=")


def restart_args(args: Sequence[str], checkpoints: Path) -> tuple[list[str], str]:
    """The ranks' arguments for a restart, and where it continues from (for the log line).

    With a complete checkpoint in ``checkpoints``, ``trainer.resume=auto`` replaces any ``trainer.resume``
    override; without one the arguments stay as they were (the run starts again as it first did).
    """
    latest = find_latest(checkpoints) if checkpoints.is_dir() else None
    if latest is None:
        return list(args), "from the start (no checkpoint saved yet)"
    kept = [a for a in args if not a.startswith(_RESUME_KEYS)]
    return [*kept, "trainer.resume=auto"], f"from {latest}"


def run_with_restarts(attempt: Callable[[list[str]], tuple[int, str]], args: Sequence[str], max_restarts: int,
                      checkpoints: Path) -> tuple[int, str]:
    """Run ``attempt(args)`` (one launch of the job: its exit code and one line) and restart it on a lost or hung
    rank, at most ``max_restarts`` times, from the newest checkpoint in ``checkpoints``."""
    code, message = attempt(list(args))
    restarts = 0
    while code in RESTARTABLE and restarts < max_restarts:
        restarts += 1
        args, origin = restart_args(args, checkpoints)
        log.warning("Restart %d of %d (trainer.max_restarts), %s, after %s: %s", restarts, max_restarts, origin,
                    ExitCode.describe(code), message)
        code, message = attempt(list(args))
    if code in RESTARTABLE and max_restarts > 0:
        message = f"{message} (no restart left: restarted {restarts} time(s), trainer.max_restarts={max_restarts})"
    return code, message
