"""Process-level setup: device selection, CPU threads and seeding."""
from __future__ import annotations

import logging
import os
import random
from dataclasses import dataclass
from typing import Optional

import numpy as np
import paddle

log = logging.getLogger("paddletrain")

DEVICES = ("auto", "cpu", "gpu")


@dataclass
class RuntimeInfo:
    device: str
    cpu_threads: int
    paddle_version: str


def usable_cores() -> int:
    """CPU cores this process may run on (its affinity mask, which containers and taskset narrow)."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # not Linux
        return os.cpu_count() or 1


def default_cpu_threads() -> int:
    """Threads for Paddle's CPU math when the user sets none: one.

    Measured with paddle 3.3.1 on a 2-core machine (docs/performance.md): dygraph training of resnet20 runs
    at the same speed with 1 and 2 threads on an idle machine, and 2x slower with 2 threads when anything else
    (a DataLoader worker, another job) uses the second core. One thread leaves the other cores to the data
    loader; set ``trainer.cpu_threads`` to measure more on bigger machines.
    """
    return 1


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


def set_cpu_threads(threads: Optional[int]) -> int:
    """Set the thread count of Paddle's CPU math (it uses one thread unless told otherwise)."""
    threads = threads or default_cpu_threads()
    if threads < 1:
        raise ValueError(f"trainer.cpu_threads must be >= 1, got {threads}")
    paddle.base.core.set_num_threads(threads)
    return threads


def setup_runtime(device: str = "auto", cpu_threads: Optional[int] = None, deterministic: bool = False) -> RuntimeInfo:
    """Select the device and CPU threads, and log them with the Paddle version once.

    ``deterministic`` asks cuDNN for deterministic algorithms (slower); CPU kernels are deterministic already.
    """
    if deterministic and paddle.device.is_compiled_with_cuda():  # the flag exists only in CUDA builds
        paddle.set_flags({"FLAGS_cudnn_deterministic": True})
    resolved = select_device(device)
    paddle.set_device(resolved)
    threads = set_cpu_threads(cpu_threads)
    info = RuntimeInfo(device=resolved, cpu_threads=threads, paddle_version=paddle.__version__)
    log.info("Device %s, %d CPU thread(s), paddle %s", info.device, info.cpu_threads, info.paddle_version)
    return info


def seed_everything(seed: int) -> None:
    """Seed python, numpy and paddle so a run is repeatable."""
    random.seed(seed)
    np.random.seed(seed % (2**32))
    paddle.seed(seed)
