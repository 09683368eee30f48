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
from pathlib import Path  # noqa: E402
from typing import NoReturn  # noqa: E402

import hydra  # noqa: E402
from hydra.core.hydra_config import HydraConfig  # noqa: E402
from omegaconf import DictConfig  # noqa: E402

from paddletrain.build import monitored_metric, saves_checkpoints, train  # noqa: E402
from paddletrain.cli import command_task, continue_command, run_command  # noqa: E402
from paddletrain.config import register_configs  # noqa: E402
from paddletrain.errors import ExitCode, TrainingInterrupted  # noqa: E402
from paddletrain.job import distributed  # noqa: E402
from paddletrain.job.launch import end_run, finish, launch_ranks, node_spec, stop_line  # noqa: E402
from paddletrain.job.launcher import NodeSpec  # noqa: E402
from paddletrain.job.processes import stop_request  # noqa: E402
from paddletrain.job.rundir import hold_run_dir  # noqa: E402
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
                finish(exc.exit_code, stop_line(exc, saves_checkpoints(cfg), continue_command(run_dir)))
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


def end_with(exc: BaseException, cfg: DictConfig, run_dir: Path) -> NoReturn:
    """End the run for ``exc`` (:func:`paddletrain.job.launch.end_run`), saying how to continue it."""
    end_run(exc, run_dir, saves_checkpoints(cfg), continue_command(run_dir))


def command_line_config_dirs() -> list[str]:
    """``--config-dir=<dir>`` for each config directory this command line added, as absolute paths."""
    sources = HydraConfig.get().runtime.config_sources
    return [f"--config-dir={Path(source.path).resolve()}" for source in sources
            if source.provider == "command-line" and source.schema == "file"]


def launch_workers(cfg: DictConfig, run_dir: Path, spec: NodeSpec) -> None:
    """Start this node's ranks (``spec``) with this run's overrides and run directory
    (:func:`paddletrain.job.launch.launch_ranks`). Returns when the job finished; otherwise it ends here."""
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
    plan = ("the ranks finish their current step, save a checkpoint and stop" if saves_checkpoints(cfg) else
            "the ranks finish their current step and stop (no checkpoint will be saved: checkpointing is off)")
    launch_ranks(spec, Path(__file__), args, run_dir, plan, cfg.trainer.collective_timeout, cfg.trainer.max_restarts)


if __name__ == "__main__":
    run_command(main)
