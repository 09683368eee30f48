"""`python -m paddletrain.fit`: read the command line, build and train (:mod:`paddletrain.build`), and map how the
run ended to one exit code.

Examples::

    python -m paddletrain.fit                                   # resnet20 on the embedded `shapes` dataset
    python -m paddletrain.fit model=resnet50 data=imagefolder data.root=/data/imagenet trainer.amp.enabled=true
    python -m paddletrain.fit -m optim.lr=0.1,0.05              # a sweep
"""
from __future__ import annotations

if __name__ == "__main__":
    # Hold SIGTERM/SIGINT while Paddle and Hydra load (~2 s in which a signal would kill the process half-started
    # with a Paddle crash report; run_command handles them after the imports), and quiet Paddle's import warnings.
    from paddletrain.job.processes import start_command_process

    start_command_process()

import logging  # noqa: E402
import os  # noqa: E402
import signal  # noqa: E402
import sys  # noqa: E402
from pathlib import Path  # noqa: E402
from typing import NoReturn  # noqa: E402

import hydra  # noqa: E402
from hydra.core.hydra_config import HydraConfig  # noqa: E402
from omegaconf import DictConfig  # noqa: E402

from paddletrain.build import monitored_metric, saves_checkpoints, train  # noqa: E402
from paddletrain.cli import command_task, continue_command, ending_of, exit_with, run_command  # noqa: E402
from paddletrain.config import register_configs  # noqa: E402
from paddletrain.errors import ExitCode, TrainingInterrupted  # noqa: E402
from paddletrain.job import distributed, slurm  # noqa: E402
from paddletrain.job.launcher import Launcher, NodeSpec  # noqa: E402
from paddletrain.job.processes import stop_request  # noqa: E402
from paddletrain.job.restart import run_with_restarts  # noqa: E402
from paddletrain.job.rundir import discard_failed_start, hold_run_dir  # noqa: E402
from paddletrain.job.watchdog import Watchdog  # noqa: E402
from paddletrain.validation import VALIDATED_ENV, validate_once, validated_marker  # noqa: E402

log = logging.getLogger("paddletrain")


def run_dir_from_hydra() -> Path:
    return Path(HydraConfig.get().runtime.output_dir)


register_configs()


def _end(exc: BaseException, cfg: DictConfig) -> NoReturn:
    """What escapes :func:`main` (e.g. from the launcher) ends like what main catches itself."""
    end_with(exc, cfg, run_dir_from_hydra())


@hydra.main(version_base="1.3", config_path="conf", config_name="fit")
@command_task(end=_end)
def main(cfg: DictConfig) -> float | None:
    """Hydra entry point; returns the monitored metric so sweepers can optimise it.

    With ``trainer.devices=N`` (N > 1) or ``trainer.num_nodes`` > 1 this process only launches the ranks
    through ``paddle.distributed.launch`` into the same run directory; each rank runs this function again.
    Every way of ending maps to one :class:`~paddletrain.errors.ExitCode`, the same in a rank as in a single
    process.
    """
    run_dir = run_dir_from_hydra()
    spec = node_spec(cfg)  # a UserError (SLURM's variables against the keys) ends the command in one line
    if (spec.nproc > 1 or spec.nnodes > 1) and not distributed.is_launched():
        with stop_request.interruptible():
            try:
                launch_workers(cfg, run_dir, spec)
            except TrainingInterrupted as exc:  # before the launcher took over the signals
                finish(exc.exit_code, stop_message(exc, cfg, run_dir))
        return None
    try:
        if distributed.is_launched():
            # The ranks meet inside Paddle, where no Python handler runs; a stop request waits until they have
            # met, so that every rank stops at the same point below.
            with stop_request.deferred("stopping once the ranks have met (nothing to save yet)"):
                distributed.init()
                distributed.setup_rank_logging(distributed.rank())
        # Start-up (data, model, restore) has nothing to save: a stop request interrupts it at once.
        with stop_request.interruptible():
            if distributed.is_launched():
                # Direct `paddle.distributed.launch` runs get one run directory too: rank 0's.
                run_dir = Path(distributed.broadcast_object(str(run_dir)))
            metrics = train(cfg, run_dir)
    except (Exception, KeyboardInterrupt) as exc:  # KeyboardInterrupt: SIGINT while someone else's handler ruled
        end_with(exc, cfg, run_dir)
    distributed.report_outcome(ExitCode.OK, "finished")
    return metrics.get(monitored_metric(cfg))


def node_spec(cfg: DictConfig) -> NodeSpec:
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


def end_with(exc: BaseException, cfg: DictConfig, run_dir: Path) -> NoReturn:
    """Log how ``exc`` ended the run in one line (no traceback unless it is unexpected) and exit with its code.

    The code and line are :func:`paddletrain.cli.ending_of`'s; a run adds the rank a lost peer had, what a stop
    saved and how to continue, and tells its launcher.
    """
    lost = distributed.as_rank_lost(exc)
    if isinstance(exc, KeyboardInterrupt):
        exc = TrainingInterrupted(signal.SIGINT)
    if lost is not None:  # before the stop case: a lost peer is the cause even if a signal also arrived
        finish(ExitCode.RANK_LOST, f"rank {distributed.rank()} {lost}", lost_ranks=lost.lost_ranks)
    if isinstance(exc, TrainingInterrupted):
        finish(exc.exit_code, stop_message(exc, cfg, run_dir), run_dir=run_dir if exc.step is None else None)
    code, message = ending_of(exc)
    if code == ExitCode.UNEXPECTED and stop_request.requested:
        # A rank that stopped during start-up can break a peer's collective: that is part of the same stop.
        log.debug("error while stopping", exc_info=exc)
        finish(ExitCode.interrupted(stop_request.signum), stop_message(TrainingInterrupted(stop_request.signum),
                                                                        cfg, run_dir))
    if code == ExitCode.UNEXPECTED:
        log.error("Unexpected error", exc_info=exc)
    finish(code, message, run_dir=run_dir if code == ExitCode.USER_ERROR else None)


def stop_message(exc: TrainingInterrupted, cfg: DictConfig, run_dir: Path) -> str:
    """What a stop left behind and how to continue, in one line."""
    name = signal.Signals(exc.signum).name
    if exc.step is None:
        return f"Stopped by {name} during start-up; nothing to save"
    by = f" (received by rank {exc.rank})" if exc.rank is not None and distributed.is_launched() else ""
    if not saves_checkpoints(cfg):
        return f"Stopped by {name}{by} after step {exc.step}; nothing saved (callbacks.checkpoint is off)"
    resume = f"Continue with: {continue_command(run_dir)}"
    if distributed.rank() != 0:
        return f"Stopped by {name}{by} after step {exc.step}; rank 0 saves the checkpoint. {resume}"
    if exc.checkpoint is None:
        return f"Stopped by {name}{by} after step {exc.step}; no checkpoint could be saved (see the log above)"
    return f"Stopped by {name}{by} after step {exc.step}; saved {exc.checkpoint}. {resume}"


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


def command_line_config_dirs() -> list[str]:
    """``--config-dir=<dir>`` for each config directory this command line added, as absolute paths."""
    sources = HydraConfig.get().runtime.config_sources
    return [f"--config-dir={Path(source.path).resolve()}" for source in sources
            if source.provider == "command-line" and source.schema == "file"]


def launch_workers(cfg: DictConfig, run_dir: Path, spec: NodeSpec) -> None:
    """Start this node's ranks (``spec``) with this run's overrides and run directory.

    Returns when the job finished; otherwise logs its verdict and exits with its code.
    """
    # A bad value or a busy directory raises a UserError: one line from here (main's ending) rather than the
    # same error from every rank. RunDirGuard validated already unless this launcher runs in a sweep.
    validate_once(cfg)
    if spec.node_rank == 0:  # node 0's launcher holds the (shared) run directory for every rank of the job
        hold_run_dir(run_dir)
    # The ranks (this machine, this config) inherit the verdict instead of validating again (validation.py).
    os.environ[VALIDATED_ENV] = validated_marker(cfg)
    overrides = [o for o in HydraConfig.get().overrides.task if not o.startswith("hydra.run.dir=")]
    # The ranks share this run directory; this process already wrote its .hydra/ config there. They search the
    # config directories of this command line too (--config-dir), where e.g. +experiment=... lives.
    args = [*command_line_config_dirs(), *overrides, f"hydra.run.dir={run_dir}", "hydra.output_subdir=null"]
    log_dir = run_dir / "launch" if spec.nnodes == 1 else run_dir / "launch" / f"node{spec.node_rank}"
    if spec.node_rank > 0:  # the run's fit.log belongs to rank 0's node
        root = logging.getLogger()
        for handler in [h for h in root.handlers if isinstance(h, logging.FileHandler)]:
            root.removeHandler(handler)
    plan = ("the ranks finish their current step, save a checkpoint and stop" if saves_checkpoints(cfg) else
            "the ranks finish their current step and stop (no checkpoint will be saved: checkpointing is off)")
    t = cfg.trainer
    # NCCL's own collective timeout (milliseconds; gloo has a fixed one) backs up the watchdog, which speaks first
    # because it names the ranks that did not arrive.
    os.environ.setdefault("PADDLE_PG_TIMEOUT", str(int(2000 * t.collective_timeout)))
    # Other nodes' heartbeats are read too when the run directory is shared (it should be: docs/distributed.md).
    watched = [log_dir, *sorted(p for p in log_dir.parent.glob("node*") if p != log_dir)] if spec.nnodes > 1 else [
        log_dir]
    watchdog = Watchdog(watched, t.collective_timeout, expected=spec.global_ranks())

    def attempt(rank_args: list[str]) -> tuple[int, str]:
        outcome = Launcher(spec, log_dir, plan, watchdog=watchdog).run(Path(__file__), rank_args)
        return outcome.code, outcome.message

    code, message = run_with_restarts(attempt, args, t.max_restarts, run_dir / "checkpoints")
    if code == ExitCode.OK:
        return
    # A rank's bad-input error is a failed start of the whole job (its one line says why).
    finish(code, message, run_dir=run_dir if code == ExitCode.USER_ERROR else None)


if __name__ == "__main__":
    run_command(main)
