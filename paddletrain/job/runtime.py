"""Process-level setup: device selection, CPU threads and seeding."""
from __future__ import annotations

import logging
import os
import random
from dataclasses import dataclass
from typing import Any

import numpy as np
import paddle

from paddletrain.devices import DEVICES, usable_cores
from paddletrain.errors import ConfigError

log = logging.getLogger("paddletrain")


@dataclass
class RuntimeInfo:
    device: str
    cpu_threads: int
    paddle_version: str
    # Why this many CPU threads, for the start-up line (e.g. "8 usable cores, 2 ranks on this node, ...").
    cpu_threads_reason: str = ""


def ranks_on_this_node() -> int:
    """Processes of this job on this machine (``paddle.distributed.launch`` sets ``PADDLE_LOCAL_SIZE``); 1 alone."""
    try:
        return max(1, int(os.environ.get("PADDLE_LOCAL_SIZE", "1")))
    except ValueError:
        return 1


def default_cpu_threads(data_workers: int = 0, ranks: int = 1, cores: int | None = None) -> tuple[int, str]:
    """Threads for Paddle's CPU math when the user sets none, and why: this process's share of the usable cores
    (``cores`` divided among the ``ranks`` on this machine), less the cores the data side needs, at least 1.

    The data side is one core per loader worker (a worker decoding and augmenting keeps its core busy), or with
    no workers one core left for everything else the machine runs. Measured (docs/performance.md#cpu-threads): a
    compute thread that has to share its core stalls every thread at each parallel region, so a thread too many
    costs 1.5-4.6x on a 2-core machine with anything else running, while on an idle one the second thread gained
    nothing for resnet20 (1.02x slower) and 1.34x for resnet50 at 224 px. Hence 1 thread on 2 cores, and all but
    the data side's cores on bigger machines.
    """
    cores = usable_cores() if cores is None else cores
    ranks = max(1, ranks)
    share = max(1, cores // ranks)
    threads = max(1, share - max(1, data_workers))
    parts = [f"{cores} usable core{'s' if cores != 1 else ''}"]
    if ranks > 1:
        parts.append(f"{share} per rank of the {ranks} on this node")
    if data_workers:
        parts.append(f"less {data_workers} data worker{'s' if data_workers != 1 else ''}")
    else:
        parts.append("less 1 left for the rest of the machine")
    return threads, ", ".join(parts)


def select_device(device: str = "auto") -> str:
    """Resolve ``auto``/``cpu``/``gpu`` to a Paddle device string; ``gpu`` without CUDA is an error."""
    if device not in DEVICES:
        raise ValueError(f"trainer.device must be one of {', '.join(DEVICES)}; got {device!r}")
    has_gpu = paddle.device.is_compiled_with_cuda() and paddle.device.cuda.device_count() > 0
    if device == "gpu" and not has_gpu:
        raise ValueError("trainer.device=gpu but this Paddle build has no usable GPU "
                         f"(paddle {paddle.__version__}, compiled with CUDA: {paddle.device.is_compiled_with_cuda()}); "
                         "install paddlepaddle-gpu or use trainer.device=cpu")
    if device == "auto":
        device = "gpu" if has_gpu else "cpu"
    if device == "gpu":
        local_rank = int(os.environ.get("PADDLE_LOCAL_RANK", os.environ.get("FLAGS_selected_gpus", "0").split(",")[0]))
        return f"gpu:{local_rank}"
    return "cpu"


def check_machine(trainer: Any, sync_bn: bool = False, training: bool = True) -> str:
    """The config's rules that depend on this machine: ``trainer.device`` exists here, and ``model.sync_bn`` (in
    training) has several GPU processes to synchronise. Returns the device; a failure is a ``ConfigError``."""
    try:
        device = select_device(trainer.device)
    except ValueError as exc:
        raise ConfigError(str(exc)) from None
    if not training or not sync_bn:
        return device
    if trainer.devices < 2:
        raise ConfigError(f"model.sync_bn=true needs trainer.devices >= 2 (it averages BatchNorm statistics across "
                          f"processes); this run has trainer.devices={trainer.devices}: set model.sync_bn=false")
    if not device.startswith("gpu"):
        raise ConfigError(f"model.sync_bn=true needs GPUs (Paddle runs SyncBatchNorm only there); this run trains on "
                          f"the CPU (trainer.device={trainer.device}): set model.sync_bn=false")
    return device


def set_cpu_threads(threads: int | None, data_workers: int = 0, ranks: int | None = None) -> int:
    """Set the thread count of Paddle's CPU math (it uses one thread unless told otherwise); ``None`` chooses
    :func:`default_cpu_threads` for ``data_workers`` and ``ranks`` (default: the ranks on this node)."""
    return _choose_threads(threads, data_workers, ranks)[0]


def _choose_threads(threads: int | None, data_workers: int, ranks: int | None) -> tuple[int, str]:
    if threads is None:
        threads, reason = default_cpu_threads(data_workers, ranks if ranks is not None else ranks_on_this_node())
    else:
        reason = "set explicitly"
    if threads < 1:
        raise ValueError(f"trainer.cpu_threads must be >= 1, got {threads}")
    paddle.base.core.set_num_threads(threads)
    return threads, reason


def setup_runtime(device: str = "auto", cpu_threads: int | None = None, deterministic: bool = False,
                  data_workers: int = 0, ranks: int | None = None) -> RuntimeInfo:
    """Select the device and CPU threads, and log them with the Paddle version once.

    ``cpu_threads=None`` chooses the count from the usable cores, the ``data_workers`` of this process's
    loader and the ``ranks`` on this node (default: from the environment), see :func:`default_cpu_threads`.
    ``deterministic`` asks cuDNN for deterministic algorithms (slower); CPU kernels are deterministic already.
    """
    if deterministic and paddle.device.is_compiled_with_cuda():  # the flag exists only in CUDA builds
        paddle.set_flags({"FLAGS_cudnn_deterministic": True})
    resolved = select_device(device)
    paddle.set_device(resolved)
    threads, reason = _choose_threads(cpu_threads, data_workers, ranks)
    info = RuntimeInfo(device=resolved, cpu_threads=threads, paddle_version=paddle.__version__,
                       cpu_threads_reason=reason)
    log.info("Device %s, %d CPU thread%s (%s), paddle %s", info.device, threads, "s" if threads != 1 else "",
             reason, info.paddle_version)
    return info


def seed_everything(seed: int) -> None:
    """Seed python, numpy and paddle so a run is repeatable."""
    random.seed(seed)
    np.random.seed(seed % (2**32))
    paddle.seed(seed)
