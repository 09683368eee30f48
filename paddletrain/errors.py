"""Exceptions for mistakes a user can fix, and the exit codes of paddletrain's command lines.

Entry points print an exception's message as one clear line, no traceback, and exit with its :class:`ExitCode`.
"""
from __future__ import annotations

import enum
import logging
import re
import signal
import sys
from typing import NoReturn


class ExitCode(enum.IntEnum):
    """What a command line's exit status means; the same for one process and for every rank of a job.

    docs/reliability.md ("Processes, signals and exit codes") documents this table.
    """

    OK = 0
    # A bug or an environment failure nobody anticipated: the traceback is in the log.
    UNEXPECTED = 1
    # Bad input (config value, data, weights, checkpoint, run directory): one line names the key, file or value.
    USER_ERROR = 2
    # It ran, but the result is not good: training diverged (non-finite loss), an export failed its parity
    # check, some prediction inputs could not be read, a dataset check found errors.
    BAD_RESULT = 3
    # A process of a distributed job was lost (killed, crashed, its machine gone): the line names the rank.
    RANK_LOST = 4
    # A distributed job stopped making progress: a collective waited, or a rank made no step, for longer than
    # trainer.collective_timeout; the line names the ranks that did not arrive and where the others waited.
    TIMED_OUT = 5
    # A data loader worker process died (killed, often by the out-of-memory killer, or crashed in a decoder): the
    # line names it, its signal and the likely cause; fit saved the steps trained and prints how to continue.
    WORKER_LOST = 6
    # Stopped on request, after saving when checkpointing is enabled: 128 + the signal, the shell's convention.
    INTERRUPTED_SIGINT = 128 + signal.SIGINT  # 130
    INTERRUPTED_SIGTERM = 128 + signal.SIGTERM  # 143
    # SLURM's warning before the time limit (`#SBATCH --signal=USR1@90`): saved like SIGTERM; under SLURM the job
    # was also requeued (paddletrain/job/slurm.py).
    INTERRUPTED_SIGUSR1 = 128 + signal.SIGUSR1  # 138

    @classmethod
    def interrupted(cls, signum: int) -> int:
        """The status of a run stopped by ``signum`` (128 + the signal number)."""
        return 128 + int(signum)

    @classmethod
    def describe(cls, code: int) -> str:
        """A short name for ``code``, e.g. ``USER_ERROR`` or ``killed by SIGKILL`` for a negative status."""
        if code < 0:
            try:
                return f"killed by {signal.Signals(-code).name}"
            except ValueError:
                return f"killed by signal {-code}"
        try:
            return cls(code).name
        except ValueError:
            return f"exit status {code}"


class UserError(ValueError):
    """Bad input (config, data, weights, checkpoint) described in terms the user can act on."""


class ConfigError(UserError):
    """A configuration value is invalid; the message names the key, the value and what is allowed."""


class FaultAfterWhichRunContinues(UserError):
    """A fault outside the user's code or config that stops a run (a data server that stays away): ``fit`` saves
    the steps trained since the last checkpoint, as a stop signal does, names the checkpoint in ``saved`` and
    prints the command that continues."""

    saved: str | None = None


class DataWorkerLost(FaultAfterWhichRunContinues):
    """A data loader worker process died; the message names it, its signal and the likely cause."""


class StartRefused(BaseException):
    """A Hydra callback's refusal to start a run (a bad value, a busy run directory), carrying the ``error``.

    A BaseException because Hydra turns any Exception raised in a callback into a warning and carries on;
    :func:`paddletrain.cli.run_command` maps it like the :class:`UserError` it carries.
    """

    def __init__(self, error: UserError) -> None:
        self.error = error
        super().__init__(str(error))


class TrainingInterrupted(Exception):
    """SIGTERM/SIGINT stopped the run: at once during start-up, after the current optimizer step during training.

    ``step`` is the global step training stopped after (None when it stopped during start-up); ``rank`` the
    rank that received the signal (None in a single process); ``checkpoint`` what was saved on the way out.
    """

    def __init__(self, signum: int | str, step: int | None = None, rank: int | None = None) -> None:
        if isinstance(signum, str):
            # A signal that lands inside a config access: OmegaConf re-raises the exception as
            # type(exc)(its message + the key), so the signal is read back from the message.
            named = re.search(r"interrupted by (SIG[A-Z0-9]+)", signum)
            signum = signal.Signals[named.group(1)] if named else signal.SIGTERM
        self.signum = int(signum)
        self.step = step
        self.rank = rank
        self.checkpoint: str | None = None
        self.exit_code = ExitCode.interrupted(signum)
        super().__init__(f"training interrupted by {signal.Signals(signum).name}")


class NonFiniteLossError(RuntimeError):
    """Raised after too many consecutive optimizer steps with a non-finite loss or gradient."""


class RankLostError(RuntimeError):
    """A collective failed because another rank of the job is gone (killed, crashed, or its machine is down).

    ``lost_ranks`` holds the rank, or the ranks it can only be one of (gloo sometimes names just an address).
    """

    def __init__(self, lost_ranks: list[int], detail: str) -> None:
        self.lost_ranks = list(lost_ranks)
        super().__init__(f"lost contact with {describe_ranks(self.lost_ranks)} (killed, crashed or its machine is "
                         f"unreachable): {detail}")


def describe_ranks(ranks: list[int]) -> str:
    """``rank 1``, or ``one of ranks 2, 3`` when it cannot be told which."""
    if len(ranks) == 1:
        return f"rank {ranks[0]}"
    return "one of ranks " + ", ".join(str(r) for r in sorted(ranks))


# ------------------------------------------------------------------------- how a command ends: one line, one code
# Commands log under "paddletrain", the logger their Hydra job logging configures.
_command_log = logging.getLogger("paddletrain")


def ending_of(exc: BaseException) -> tuple[int, str]:
    """The exit code and the one line for ``exc`` ending a command (the table in docs/reliability.md)."""
    if isinstance(exc, StartRefused):
        exc = exc.error
    if isinstance(exc, KeyboardInterrupt):  # SIGINT while Python's own handler ruled
        exc = TrainingInterrupted(signal.SIGINT)
    if isinstance(exc, TrainingInterrupted):
        return exc.exit_code, f"Stopped by {signal.Signals(exc.signum).name}"
    if isinstance(exc, RankLostError):
        return ExitCode.RANK_LOST, str(exc)
    if isinstance(exc, DataWorkerLost):
        return ExitCode.WORKER_LOST, str(exc)
    if isinstance(exc, UserError):
        return ExitCode.USER_ERROR, str(exc)
    if isinstance(exc, NonFiniteLossError):
        return ExitCode.BAD_RESULT, str(exc)
    return ExitCode.UNEXPECTED, f"unexpected {type(exc).__name__}: {exc} (traceback above and in the log)"


def exit_with(code: int, message: str) -> NoReturn:
    """Log how the command ended in one line (a warning for a requested stop) and exit with ``code``."""
    (_command_log.warning if code >= 128 else _command_log.error)("%s", message)
    sys.exit(code)
