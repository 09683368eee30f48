"""A job on this node: which ranks it runs (:func:`node_spec`), starting them under a watchdog with restarts
(:func:`launch_ranks`), and how the job ends (:func:`end_run`, :func:`finish`): one line and one
:class:`~paddletrain.errors.ExitCode`, the same in a rank as in a single process.

``python -m paddletrain.fit`` composes these from its config; nothing here reads one beyond the SLURM plan.
"""
from __future__ import annotations

import logging
import os
import signal
import sys
from pathlib import Path
from typing import Any, NoReturn

from paddletrain.errors import ExitCode, FaultAfterWhichRunContinues, TrainingInterrupted, ending_of, exit_with
from paddletrain.job import distributed, slurm
from paddletrain.job.launcher import Launcher, NodeSpec
from paddletrain.job.processes import stop_request
from paddletrain.job.restart import run_with_restarts
from paddletrain.job.rundir import discard_failed_start
from paddletrain.job.watchdog import Watchdog

log = logging.getLogger("paddletrain")


def node_spec(cfg: Any) -> NodeSpec:
    """This node's share of the job: from SLURM's variables when srun started this process (with one task per
    device this process becomes its rank and launches nothing), else from the trainer.* keys."""
    t = cfg.trainer
    if not distributed.is_launched():
        cluster = slurm.plan(cfg)
        if cluster is not None:
            slurm.activate(cluster)
            if distributed.is_launched():  # this task is a rank now: the run's log file is rank 0's alone
                distributed.setup_rank_logging(distributed.rank())
            log.info("%s", cluster.describe())
            return cluster.node_spec
    return NodeSpec(t.devices, t.num_nodes, t.node_rank, t.master)


def launch_ranks(spec: NodeSpec, program: Path, args: list[str], run_dir: Path, stop_plan: str,
                 collective_timeout: float, max_restarts: int) -> None:
    """Start this node's ranks (``spec``), each running ``program`` with ``args``, under a watchdog, restarting
    the job from its newest checkpoint up to ``max_restarts`` times.

    Returns when the job finished; otherwise ends it (:func:`finish`) with its verdict.
    """
    log_dir = run_dir / "launch" if spec.nnodes == 1 else run_dir / "launch" / f"node{spec.node_rank}"
    if spec.node_rank > 0:  # the run's log file belongs to rank 0's node
        root = logging.getLogger()
        for handler in [h for h in root.handlers if isinstance(h, logging.FileHandler)]:
            root.removeHandler(handler)
    # NCCL's own collective timeout (milliseconds; gloo has a fixed one) backs up the watchdog, which speaks first
    # because it names the ranks that did not arrive.
    os.environ.setdefault("PADDLE_PG_TIMEOUT", str(int(2000 * collective_timeout)))
    # Other nodes' heartbeats are read too when the run directory is shared (it should be: docs/distributed.md).
    watched = [log_dir, *sorted(p for p in log_dir.parent.glob("node*") if p != log_dir)] if spec.nnodes > 1 else [
        log_dir]
    watchdog = Watchdog(watched, collective_timeout, expected=spec.global_ranks())

    def attempt(rank_args: list[str]) -> tuple[int, str]:
        outcome = Launcher(spec, log_dir, stop_plan, watchdog=watchdog).run(program, rank_args)
        return outcome.code, outcome.message

    code, message = run_with_restarts(attempt, args, max_restarts, run_dir / "checkpoints")
    if code == ExitCode.OK:
        return
    # A rank's bad-input error is a failed start of the whole job (its one line says why).
    finish(code, message, run_dir=run_dir if code == ExitCode.USER_ERROR else None)


def stop_line(exc: TrainingInterrupted, saves_checkpoints: bool, continue_with: str) -> str:
    """What a stop left behind and how to continue (``continue_with``: the command), in one line."""
    name = signal.Signals(exc.signum).name
    if exc.step is None:
        return f"Stopped by {name} during start-up; nothing to save"
    by = f" (received by rank {exc.rank})" if exc.rank is not None and distributed.is_launched() else ""
    if not saves_checkpoints:
        return f"Stopped by {name}{by} after step {exc.step}; nothing saved (callbacks.checkpoint is off)"
    resume = f"Continue with: {continue_with}"
    if distributed.rank() != 0:
        return f"Stopped by {name}{by} after step {exc.step}; rank 0 saves the checkpoint. {resume}"
    if exc.checkpoint is None:
        return f"Stopped by {name}{by} after step {exc.step}; no checkpoint could be saved (see the log above)"
    return f"Stopped by {name}{by} after step {exc.step}; saved {exc.checkpoint}. {resume}"


def end_run(exc: BaseException, run_dir: Path, saves_checkpoints: bool, continue_with: str) -> NoReturn:
    """Log how ``exc`` ended the run in one line (no traceback unless it is unexpected) and exit with its code.

    The code and line are :func:`~paddletrain.errors.ending_of`'s; a run adds the rank a lost peer had, what a
    stop saved and how to continue (:func:`stop_line`), and tells its launcher.
    """
    lost = distributed.as_rank_lost(exc)
    if isinstance(exc, KeyboardInterrupt):
        exc = TrainingInterrupted(signal.SIGINT)
    if lost is not None:  # before the stop case: a lost peer is the cause even if a signal also arrived
        finish(ExitCode.RANK_LOST, f"rank {distributed.rank()} {lost}", lost_ranks=lost.lost_ranks)
    if isinstance(exc, TrainingInterrupted):
        finish(exc.exit_code, stop_line(exc, saves_checkpoints, continue_with),
               run_dir=run_dir if exc.step is None else None)
    code, message = ending_of(exc)
    if code == ExitCode.UNEXPECTED and stop_request.requested:
        # A rank that stopped during start-up can break a peer's collective: that is part of the same stop.
        log.debug("error while stopping", exc_info=exc)
        finish(ExitCode.interrupted(stop_request.signum),
               stop_line(TrainingInterrupted(stop_request.signum), saves_checkpoints, continue_with))
    if code == ExitCode.UNEXPECTED:
        log.error("Unexpected error", exc_info=exc)
    if isinstance(exc, FaultAfterWhichRunContinues):
        saved = f"; the steps trained are saved in {exc.saved}" if exc.saved else ""
        finish(code, f"{message}{saved}; once that is mended, continue with: {continue_with}")
    finish(code, message, run_dir=run_dir if code == ExitCode.USER_ERROR else None)


def finish(code: int, message: str, lost_ranks: list[int] | None = None,
           run_dir: Path | None = None) -> NoReturn:
    """Say how the run ended in one line and exit with ``code``.

    A rank reports it to its launcher (:func:`paddletrain.job.distributed.report_outcome`); a single process logs it.
    ``run_dir`` is given when the run failed to start (bad input, or stopped during start-up): the directory is
    removed when it holds nothing but what the start wrote (:func:`paddletrain.job.rundir.discard_failed_start`).
    """
    message += slurm.requeue_after(code)  # after the stop saved: SLURM ends the job's processes when it requeues
    if distributed.is_launched():
        distributed.report_outcome(code, message, lost_ranks)
        sys.exit(code)
    if run_dir is not None and discard_failed_start(run_dir):
        message += f" (removed the run directory {run_dir}: it held nothing but this start's files)"
    exit_with(code, message)
