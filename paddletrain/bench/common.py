"""What every benchmark shares: option parsing, synthetic data, timed windows, memory and the environment.

Timing rules (from the benchmark issue): pin the CPU threads once for all arms, warm every arm up, time
several windows of steps with a device sync at each window's end, interleave arms window by window
(A B C A B C ...) so drift and neighbours' load hit every arm alike, and report medians.
"""
from __future__ import annotations

import dataclasses
import math
import os
import platform
import resource
import statistics
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any, TypeVar

import numpy as np
import paddle

from paddletrain.errors import ConfigError

C = TypeVar("C")

# The bench-only model for measuring per-step framework overhead: its compute is negligible on purpose.
TINY_MODEL = "tiny"


def parse_options(schema: type[C], args: Sequence[str], command: str) -> C:
    """``key=value`` arguments validated against the dataclass ``schema`` (types, unknown keys)."""
    from omegaconf import OmegaConf
    from omegaconf.errors import OmegaConfBaseException

    for arg in args:
        if "=" not in arg:
            raise ConfigError(f"bench {command}: expected key=value, got {arg!r}")
    try:
        merged = OmegaConf.merge(OmegaConf.structured(schema), OmegaConf.from_dotlist(list(args)))
        return OmegaConf.to_object(merged)  # type: ignore[return-value]
    except OmegaConfBaseException as exc:
        keys = ", ".join(f.name for f in dataclasses.fields(schema))  # type: ignore[arg-type]
        key = getattr(exc, "full_key", None)
        reason = str(getattr(exc, "msg", exc)).splitlines()[0]
        where = f" {key}:" if key else ""
        raise ConfigError(f"bench {command}:{where} {reason} (valid keys: {keys}, out)") from None


def check_options(cfg: Any, command: str) -> None:
    """Raise ConfigError naming the first option whose value its ``*BenchConfig`` declaration does not allow."""
    from paddletrain.config import check_values

    check_values(cfg, context=f"bench {command}: ")


class TinyNet(paddle.nn.Layer):
    """conv(8) -> BN -> ReLU -> global pool -> linear: enough to exercise every training-step part."""

    def __init__(self, num_classes: int = 10, in_chans: int = 3) -> None:
        super().__init__()
        self.conv = paddle.nn.Conv2D(in_chans, 8, 3, padding=1, bias_attr=False)
        self.bn = paddle.nn.BatchNorm2D(8)
        self.pool = paddle.nn.AdaptiveAvgPool2D(1)
        self.fc = paddle.nn.Linear(8, num_classes)

    def forward(self, x: paddle.Tensor) -> paddle.Tensor:
        return self.fc(self.pool(paddle.nn.functional.relu(self.bn(self.conv(x)))).flatten(1))


def bench_model(name: str, num_classes: int, data_format: str = "NCHW", seed: int = 0,
                width: float = 1.0) -> paddle.nn.Layer:
    """A registry model built as ``fit`` builds it (:func:`paddletrain.build.build_model` on a ``model`` config),
    or the bench's ``tiny``; initialised from ``seed`` so every arm starts equal. ``width``: ``model.width``."""
    from omegaconf import OmegaConf

    from paddletrain.build import build_model
    from paddletrain.config import ModelConfig

    paddle.seed(seed)
    if name == TINY_MODEL:
        if data_format != "NCHW" or width != 1.0:
            raise ConfigError(f"bench: model={TINY_MODEL} supports only data_format=NCHW and width=1")
        return TinyNet(num_classes)
    model = ModelConfig(name=name, data_format=data_format, width=width)
    cfg = OmegaConf.create({"model": OmegaConf.structured(model)})
    return build_model(cfg, num_classes=num_classes, in_chans=3)


def synthetic_batches(count: int, batch_size: int, image_size: int, num_classes: int,
                      seed: int = 0) -> list[list[paddle.Tensor]]:
    """``count`` distinct ``[images, labels]`` batches already on the current device (NCHW float32)."""
    rng = np.random.default_rng(seed)
    return [[paddle.to_tensor(rng.standard_normal((batch_size, 3, image_size, image_size), dtype=np.float32)),
             paddle.to_tensor(rng.integers(0, num_classes, (batch_size,), dtype=np.int64))]
            for _ in range(count)]


def cycle(batches: Sequence[Any], steps: int) -> list[Any]:
    """``steps`` items taken round-robin from ``batches``."""
    return [batches[i % len(batches)] for i in range(steps)]


def device_sync() -> None:
    """Wait for queued device work (a no-op for CPU, whose kernels run synchronously)."""
    if not paddle.device.get_device().startswith("cpu"):
        paddle.device.synchronize()


def on_gpu() -> bool:
    return paddle.device.get_device().startswith("gpu")


def reset_peak_memory() -> None:
    if on_gpu():
        paddle.device.cuda.reset_max_memory_allocated()


def peak_memory_mb() -> dict[str, float | None]:
    """Device memory peak on a GPU (since the last reset); on CPU the process's peak RSS (never resets)."""
    if on_gpu():
        return {"peak_gpu_allocated_mb": paddle.device.cuda.max_memory_allocated() / 2**20, "peak_rss_mb": None}
    # Linux reports ru_maxrss in KiB.
    return {"peak_gpu_allocated_mb": None, "peak_rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024}


Window = Callable[[int], float]


def interleave(arms: dict[str, Window], windows: int, steps: int, warmup: int) -> dict[str, list[float]]:
    """Run every arm's warm-up, then ``windows`` rounds of A B C ...; returns seconds per step per window.

    An arm is ``run(steps) -> elapsed seconds`` and must end its window with a device sync.
    """
    for run in arms.values():
        if warmup:
            run(warmup)
    per_step: dict[str, list[float]] = {name: [] for name in arms}
    for _ in range(windows):
        for name, run in arms.items():
            per_step[name].append(run(steps) / steps)
    return per_step


def timed(fn: Callable[[], Any]) -> float:
    """Seconds ``fn`` takes, including a final device sync."""
    start = time.perf_counter()
    fn()
    device_sync()
    return time.perf_counter() - start


def summarize(seconds_per_step: Sequence[float], batch_size: int) -> dict[str, Any]:
    """Median ms/step and images/s, plus the spread across windows (max-min over median)."""
    median = statistics.median(seconds_per_step)
    return {
        "ms_per_step": median * 1e3,
        "images_per_s": batch_size / median,
        "spread": (max(seconds_per_step) - min(seconds_per_step)) / median,
        "windows_ms": [round(s * 1e3, 3) for s in seconds_per_step],
    }


def paired_ratio(numerator: Sequence[float], denominator: Sequence[float]) -> float:
    """Median of window-by-window ratios: robust to drift that hits neighbouring windows alike."""
    return statistics.median(n / d for n, d in zip(numerator, denominator, strict=True))


def median_interval(values: Sequence[float], confidence: float = 0.95) -> tuple[float, float] | None:
    """A distribution-free interval holding the median of what ``values`` sample with at least ``confidence``:
    the k-th smallest and k-th largest value, k from the binomial distribution of how many values fall below the
    median. None when there are too few values for it (6 for 95%)."""
    ordered, n = sorted(values), len(values)
    below, k = 0.0, 0  # P(fewer than k+1 of n values below the median) summed while it stays in the tail
    while k < n and below + math.comb(n, k) / 2**n <= (1 - confidence) / 2:
        below += math.comb(n, k) / 2**n
        k += 1
    return (ordered[k - 1], ordered[n - k]) if k >= 1 else None


def paired_ratio_interval(numerator: Sequence[float], denominator: Sequence[float],
                          confidence: float = 0.95) -> tuple[float, float] | None:
    """:func:`median_interval` of the window-by-window ratios :func:`paired_ratio` takes the median of."""
    return median_interval([n / d for n, d in zip(numerator, denominator, strict=True)], confidence)


def environment(cpu_threads: int | None = None) -> dict[str, Any]:
    """Where and under which load the numbers were measured; call before measuring, then :func:`finished`."""
    from paddletrain.devices import usable_cores

    cores = usable_cores()
    return {
        "paddle": paddle.__version__,
        "python": platform.python_version(),
        "device": paddle.device.get_device(),
        "cpu": platform.processor() or platform.machine(),
        "cpu_cores": cores,
        "cpu_threads": cpu_threads,
        "load_average_1m": round(os.getloadavg()[0], 2),
        "time": time.strftime("%Y-%m-%d %H:%M:%S"),
        "_start": time.perf_counter(),
    }


def finished(env: dict[str, Any]) -> dict[str, Any]:
    """``env`` with the load average at the end and the benchmark's wall time added."""
    env = dict(env)
    env["seconds"] = round(time.perf_counter() - env.pop("_start"), 1)
    env["load_average_1m_end"] = round(os.getloadavg()[0], 2)
    return env


def write_jpeg_folder(root: Path, num_images: int, image_size: int, num_classes: int = 4, seed: int = 0,
                      quality: int = 90) -> Path:
    """An image folder ``root/train/<class>/*.jpg`` of smooth random images (JPEG decodes like photos).

    Returns ``root``. Used by the data and inference benchmarks when no real dataset is given.
    """
    from PIL import Image

    rng = np.random.default_rng(seed)
    for i in range(num_images):
        class_dir = root / "train" / f"class{i % num_classes}"
        class_dir.mkdir(parents=True, exist_ok=True)
        # Upsampled low-resolution noise: smooth regions and edges, so the JPEG is photo-sized, not noise-sized.
        small = rng.integers(0, 256, (max(2, image_size // 16),) * 2 + (3,), dtype=np.uint8)
        image = Image.fromarray(small).resize((image_size, image_size), Image.BILINEAR)
        image.save(class_dir / f"{i:05d}.jpg", quality=quality)
    return root
