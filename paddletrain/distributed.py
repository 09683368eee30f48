"""Data parallelism on ``paddle.distributed``: process info, collectives, DataParallel wrapping and launching.

Processes are started by ``paddle.distributed.launch`` (NCCL on GPUs, gloo on CPUs); nothing here is a
launcher or a collective of its own. :func:`launch` runs Paddle's launcher for ``trainer.devices=N`` and
turns its outcome into one clear report.
"""
from __future__ import annotations

import logging
import os
import re
import signal
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any, List, Optional, Sequence

import paddle

log = logging.getLogger("paddletrain")

# Marker that every rank's fatal error line carries, so the parent can name the rank that failed first.
FAILURE_MARKER = "paddletrain rank failure"


def world_size() -> int:
    """Number of processes in the job (1 when not launched by ``paddle.distributed.launch``)."""
    return int(os.environ.get("PADDLE_TRAINERS_NUM", "1"))


def rank() -> int:
    """This process's global rank (0 when not launched)."""
    return int(os.environ.get("PADDLE_TRAINER_ID", "0"))


def is_launched() -> bool:
    """Whether this process is one worker of a multi-process job."""
    return world_size() > 1


def init() -> None:
    """Initialise Paddle's collective environment once, when launched with more than one process."""
    if is_launched() and not paddle.distributed.is_initialized():
        paddle.distributed.init_parallel_env()


def barrier() -> None:
    if is_launched():
        paddle.distributed.barrier()


def broadcast_object(obj: Any, src: int = 0) -> Any:
    """``obj`` as held by rank ``src``, on every rank."""
    if not is_launched():
        return obj
    holder = [obj]
    paddle.distributed.broadcast_object_list(holder, src=src)
    return holder[0]


def all_gather_object(obj: Any) -> List[Any]:
    """Every rank's ``obj``, in rank order, on every rank."""
    if not is_launched():
        return [obj]
    gathered: List[Any] = []
    paddle.distributed.all_gather_object(gathered, obj)
    return gathered


def any_rank(flag: bool) -> bool:
    """True on every rank when ``flag`` is true on at least one (one small all-reduce)."""
    if not is_launched():
        return flag
    value = paddle.to_tensor([1 if flag else 0], dtype="int32")
    paddle.distributed.all_reduce(value, op=paddle.distributed.ReduceOp.MAX)
    return bool(value.item())


def broadcast_buffers(model: paddle.nn.Layer, src: int = 0) -> None:
    """Give every rank rank ``src``'s buffers (BatchNorm running statistics).

    DataParallel averages gradients but each rank updates its own running statistics; evaluating and
    checkpointing with rank 0's makes a distributed evaluation equal a single-process one of the checkpoint.
    """
    # Paddle keeps BatchNorm statistics as non-trainable parameters, not buffers: broadcast both kinds.
    for tensor in model.state_dict().values():
        if tensor.stop_gradient:
            paddle.distributed.broadcast(tensor, src=src)


def wrap(model: paddle.nn.Layer, find_unused_parameters: bool = False, sync_bn: bool = False) -> paddle.nn.Layer:
    """Wrap ``model`` in ``paddle.DataParallel`` (optionally converting BatchNorm to SyncBatchNorm) when launched."""
    if not is_launched():
        return model
    if sync_bn:
        model = paddle.nn.SyncBatchNorm.convert_sync_batchnorm(model)
    return paddle.DataParallel(model, find_unused_parameters=find_unused_parameters)


def unwrap(model: paddle.nn.Layer) -> paddle.nn.Layer:
    """The model inside a ``paddle.DataParallel`` wrapper (or the model itself)."""
    return getattr(model, "_layers", model)


class RankFilter(logging.Filter):
    """Prefixes every record with ``[rank N]`` so warnings and errors from any rank say where they came from."""

    def __init__(self, rank_id: int) -> None:
        super().__init__()
        self.prefix = f"[rank {rank_id}] "

    def filter(self, record: logging.LogRecord) -> bool:
        if not str(record.msg).startswith(self.prefix):
            record.msg = self.prefix + str(record.msg)
        return True


def setup_rank_logging(rank_id: int) -> None:
    """Rank 0 logs as usual; other ranks keep warnings and errors only, tagged with their rank, and don't
    write the run's log file (it belongs to rank 0)."""
    root = logging.getLogger()
    for handler in list(root.handlers):
        if rank_id != 0 and isinstance(handler, logging.FileHandler):
            root.removeHandler(handler)
        else:
            handler.addFilter(RankFilter(rank_id))
    if rank_id != 0:
        logging.getLogger("paddletrain").setLevel(logging.WARNING)


@dataclass
class LaunchResult:
    returncode: int
    log_dir: Path
    failures: List[str]
    # The signal forwarded to the workers, if one stopped the job.
    signum: Optional[int] = None


def launch(nproc: int, module_args: Sequence[str], log_dir: Path, devices: Optional[str] = None) -> LaunchResult:
    """Run ``python -m paddle.distributed.launch --nproc_per_node nproc`` on paddletrain.fit with ``module_args``.

    SIGTERM/SIGINT received here are passed to every worker (each finishes its step, rank 0 checkpoints,
    all exit), and when a worker fails the ranks' own error lines are collected from the worker logs.
    """
    script = Path(__file__).with_name("fit.py")
    cmd = [sys.executable, "-m", "paddle.distributed.launch", "--nproc_per_node", str(nproc),
           "--log_dir", str(log_dir)]
    if devices:
        cmd += ["--devices", devices]
    cmd += [str(script), *module_args]
    log.info("Launching %d processes: %s", nproc, " ".join(cmd))
    proc = subprocess.Popen(cmd, start_new_session=True)
    received: List[int] = []

    def forward(signum: int, frame: Any) -> None:
        received.append(signum)
        log.warning("%s received: asking the %d workers to checkpoint and stop", signal.Signals(signum).name, nproc)
        for pid in _worker_pids(proc.pid):
            try:
                os.kill(pid, signum)
            except ProcessLookupError:
                pass

    previous = {sig: signal.signal(sig, forward) for sig in (signal.SIGTERM, signal.SIGINT)}
    try:
        returncode = proc.wait()
    finally:
        for sig, old in previous.items():
            signal.signal(sig, old)
    return LaunchResult(returncode, log_dir, collect_failures(log_dir) if returncode else [],
                        received[0] if received else None)


def _worker_pids(launcher_pid: int) -> List[int]:
    """The worker processes started by Paddle's launcher (its python children, not their loader workers)."""
    import psutil

    try:
        return [child.pid for child in psutil.Process(launcher_pid).children(recursive=False)]
    except psutil.NoSuchProcess:
        return []


def collect_failures(log_dir: Path) -> List[str]:
    """The failure lines each rank wrote (``FAILURE_MARKER``), ordered by time, from ``workerlog.N`` files."""
    lines = []
    for path in sorted(Path(log_dir).glob("workerlog.*")):
        for line in path.read_text(errors="replace").splitlines():
            if FAILURE_MARKER in line:
                lines.append(line.strip())
    return sorted(lines, key=lambda line: re.findall(r"\d{4}-\d\d-\d\d \d\d:\d\d:\d\d[,.]\d+", line)[:1] or [""])
