"""MKL's code path on this CPU: its own choice against the one paddletrain sets (:mod:`paddletrain.devices`).

The path is fixed when MKL first runs, so each arm is a process of its own: ``python -m comparisons step_profile``
with ``MKL_DEBUG_CPU_TYPE`` set empty (MKL's own choice: what a program that does not import paddletrain gets) or
left to paddletrain. The arms alternate, ``rounds`` times each, and the medians of the training step's images/s
and of the 2048 x 2048 ``paddle.matmul`` are compared. On an Intel CPU, or an AMD one without AVX2, both arms take
MKL's own path and the ratio is 1 within noise.
"""
from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from comparisons.step_profile import StepProfileConfig
from paddletrain.bench.common import check_options, environment, finished
from paddletrain.config import allowed
from paddletrain.devices import MKL_CPU_TYPE_ENV, cpu_flags, mkl_cpu_type
from paddletrain.errors import ConfigError

ARMS = {"MKL's own path": "", "paddletrain's": None}


@dataclass
class MklDispatchConfig(StepProfileConfig):
    """The step profile's keys (its model, batch, threads...), run once per arm and round."""

    steps: int = allowed(30, ge=1)
    repeats: int = allowed(5, ge=1)
    rounds: int = allowed(3, ge=1)
    timeout_minutes: float = allowed(10.0, gt=0)


def _arm(value: str | None, cfg: MklDispatchConfig, out: Path) -> dict[str, Any]:
    env = {k: v for k, v in os.environ.items() if k != MKL_CPU_TYPE_ENV}
    if value is not None:
        env[MKL_CPU_TYPE_ENV] = value
    profile = {key: getattr(cfg, key) for key in StepProfileConfig.__dataclass_fields__}
    args = [sys.executable, "-m", "comparisons", "step_profile", *(f"{k}={v}" for k, v in profile.items()),
            f"out={out}"]
    done = subprocess.run(args, env=env, capture_output=True, text=True, timeout=60 * cfg.timeout_minutes,
                          cwd=Path(__file__).resolve().parents[1])
    if done.returncode != 0:
        raise ConfigError(f"mkl_dispatch: the step_profile process failed: {done.stderr[-2000:]}")
    result = json.loads(out.read_text())
    square = next(row["GFLOP/s"] for row in result["peaks"] if row["what"].startswith("2048") and "paddle" in
                  row["what"])
    return {"images/s": cfg.batch_size / result["step_seconds"], "gemm": square}


def run_mkl_dispatch(cfg: MklDispatchConfig) -> dict[str, Any]:
    check_options(cfg, "mkl_dispatch")
    env = environment()
    measured: dict[str, list[dict[str, Any]]] = {arm: [] for arm in ARMS}
    with tempfile.TemporaryDirectory(prefix="mkl-dispatch-") as tmp:
        for round_ in range(cfg.rounds):
            for arm, value in ARMS.items():
                measured[arm].append(_arm(value, cfg, Path(tmp) / f"{round_}-{len(measured[arm])}.json"))
    vendor, flags = cpu_flags()
    chosen = mkl_cpu_type(vendor, flags)
    rows = []
    for arm, runs in measured.items():
        rows.append({"MKL path": arm if arm != "paddletrain's" else f"paddletrain's ({MKL_CPU_TYPE_ENV}={chosen})",
                     "training images/s (median)": round(statistics.median(r["images/s"] for r in runs), 1),
                     "2048 matmul GFLOP/s (median)": round(statistics.median(r["gemm"] for r in runs), 1),
                     "runs": len(runs)})
    base, ours = rows
    ratio = ours["training images/s (median)"] / base["training images/s (median)"]
    notes = [f"CPU vendor {vendor or 'unknown'}; {cfg.model} at batch {cfg.batch_size}, {cfg.image_size} px, "
             f"{cfg.cpu_threads} thread(s); arms alternate, {cfg.rounds} processes each",
             f"training ratio paddletrain's / MKL's own: {ratio:.2f}"]
    return {"benchmark": "mkl_dispatch", "config": vars(cfg), "environment": finished(env), "rows": rows,
            "notes": notes, "ratio": ratio}
