"""Data parallelism on ``paddle.distributed``: process info, collectives, DataParallel wrapping, rank outcomes.

Processes are started by ``paddle.distributed.launch`` (NCCL on GPUs, gloo on CPUs); nothing here is a
launcher or a collective of its own (:mod:`paddletrain.job.launcher` supervises Paddle's launcher). Each rank of a
job leaves a :class:`RankOutcome` in the launch log directory when it ends, so the launcher can say in one line
which rank failed, how, and exit with the same code a single process would.
"""
from __future__ import annotations

import json
import logging
import os
import re
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import paddle

from paddletrain.errors import RankLostError
from paddletrain.job.processes import LAUNCHER_ENV

log = logging.getLogger("paddletrain")

# Every rank's final line (failure or stop) carries this marker: it is in the rank's own log for whoever reads
# it, and paddletrain's launcher leaves it out of the console, where it prints one verdict for the whole job.
OUTCOME_MARKER = "paddletrain rank outcome"
# A failure of gloo's transport means a peer is gone (or the network between us is). Gloo names the peer's rank
# in some messages ("TIMEOUT self_rank = 0 pair_rank = 1 ...") and only its address in others ("Read error
# [10.0.0.2]:7552: Connection reset by peer").
_GLOO_TRANSPORT = re.compile(r"gloo/transport/[^\]]*\]\s*(?P<what>.*)")
_GLOO_PAIR_RANK = re.compile(r"pair_rank = (\d+)")
_GLOO_PEER_HOST = re.compile(r"\[([^\]]+)\]:\d+")


def world_size() -> int:
    """Number of processes in the job (1 when not launched by ``paddle.distributed.launch``)."""
    return int(os.environ.get("PADDLE_TRAINERS_NUM", "1"))


def rank() -> int:
    """This process's global rank (0 when not launched)."""
    return int(os.environ.get("PADDLE_TRAINER_ID", "0"))


def is_launched() -> bool:
    """Whether this process is one worker of a multi-process job."""
    return world_size() > 1


def local_rank() -> int:
    """This process's rank among the processes of its machine (0 when not launched)."""
    return int(os.environ.get("PADDLE_LOCAL_RANK", "0"))


def under_paddletrain_launcher() -> bool:
    """Whether ``python -m paddletrain.fit`` started this rank (rather than ``paddle.distributed.launch`` by hand)."""
    return LAUNCHER_ENV in os.environ


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


def all_gather_object(obj: Any) -> list[Any]:
    """Every rank's ``obj``, in rank order, on every rank."""
    if not is_launched():
        return [obj]
    gathered: list[Any] = []
    paddle.distributed.all_gather_object(gathered, obj)
    return gathered


def agree_on_stop(signum: int | None) -> tuple | None:
    """The stop request every rank acts on: ``(signal, rank that received it)`` or None (one small all-reduce).

    Every rank calls this at the same point (after each optimizer step); the lowest rank holding the highest
    signal number wins, so all ranks stop on the same step and can say why.
    """
    if not is_launched():
        return (signum, rank()) if signum else None
    # signal in the high bits, (2^20 - 1 - rank) in the low ones: MAX picks the signal, then the lowest rank.
    code = (int(signum) << 20) + ((1 << 20) - 1 - rank()) if signum else 0
    value = paddle.to_tensor([code], dtype="int64")
    paddle.distributed.all_reduce(value, op=paddle.distributed.ReduceOp.MAX)
    agreed = int(value.item())
    if agreed == 0:
        return None
    return agreed >> 20, (1 << 20) - 1 - (agreed & ((1 << 20) - 1))


def lost_peers(text: str, endpoints: list[str] | None = None,
               self_rank: int | None = None) -> list[int] | None:
    """The ranks a gloo transport failure in ``text`` (an error message or a log) points at, or None if none.

    Exactly the rank gloo names when it does; otherwise the ranks at the peer's address according to
    ``endpoints`` (``PADDLE_TRAINER_ENDPOINTS``, one ``host:port`` per rank), leaving out ``self_rank``. On one
    machine every rank has the same address: then all the others.
    """
    failure = _GLOO_TRANSPORT.search(text)
    if failure is None:
        return None
    named = _GLOO_PAIR_RANK.search(text)
    if named:
        return [int(named.group(1))]
    if endpoints is None:
        endpoints = [e for e in os.environ.get("PADDLE_TRAINER_ENDPOINTS", "").split(",") if e]
        self_rank = rank() if self_rank is None else self_rank
    host = _GLOO_PEER_HOST.search(failure.group("what"))
    candidates = [i for i, endpoint in enumerate(endpoints)
                  if i != self_rank and (host is None or endpoint.rpartition(":")[0] == host.group(1))]
    return candidates or [i for i in range(len(endpoints)) if i != self_rank]


def as_rank_lost(exc: BaseException) -> RankLostError | None:
    """A :class:`RankLostError` when ``exc`` is a collective failing because a peer rank is gone, else None."""
    if isinstance(exc, RankLostError):
        return exc
    peers = lost_peers(str(exc)) if isinstance(exc, RuntimeError) else None
    return RankLostError(peers, str(exc).strip().splitlines()[0][:200]) if peers is not None else None


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
class RankOutcome:
    """How one rank ended: its exit code and the one line that says why (``lost_ranks`` when a peer was lost)."""

    rank: int
    code: int
    message: str
    time: float
    lost_ranks: list[int] | None = None

    @staticmethod
    def path(log_dir: Path, rank_id: int) -> Path:
        return Path(log_dir) / f"outcome.{rank_id}.json"

    @classmethod
    def read_all(cls, log_dir: Path) -> dict[int, RankOutcome]:
        """Every outcome in ``log_dir`` by rank; files that are not ours are ignored."""
        outcomes = {}
        for path in sorted(Path(log_dir).glob("outcome.*.json")):
            try:
                data = json.loads(path.read_text())
                lost = data.get("lost_ranks")
                outcome = cls(int(data["rank"]), int(data["code"]), str(data["message"]), float(data["time"]),
                              None if lost is None else [int(r) for r in lost])
            except (OSError, ValueError, KeyError, TypeError):
                continue
            outcomes[outcome.rank] = outcome
        return outcomes


def report_outcome(code: int, message: str, lost_ranks: list[int] | None = None) -> None:
    """Leave this rank's outcome where its launcher reads it (Paddle's ``PADDLE_LOG_DIR``); no-op when not launched.

    Also logs it with :data:`OUTCOME_MARKER`, for whoever reads this rank's log.
    """
    if not is_launched():
        return
    outcome = RankOutcome(rank(), int(code), str(message), time.time(), lost_ranks)
    level = logging.INFO if code == 0 else logging.WARNING if code >= 128 else logging.ERROR
    log.log(level, "%s (exit %d): %s", OUTCOME_MARKER, code, message)
    log_dir = os.environ.get("PADDLE_LOG_DIR")
    if not log_dir:
        return
    path = RankOutcome.path(Path(log_dir), outcome.rank)
    tmp = path.with_suffix(".tmp")
    try:
        tmp.write_text(json.dumps(asdict(outcome)))
        os.replace(tmp, path)
    except OSError as exc:  # the outcome still is in the log and the exit code
        log.warning("could not write %s: %s", path, exc)
