"""Inference throughput and latency vs batch size: dygraph eval vs the exported Paddle Inference predictor.

- ``dygraph``: ``model.eval()`` under ``paddle.no_grad()``, logits fetched to NumPy (as a predictor returns).
- ``predictor_<precision>``: the model exported by ``paddletrain.deploy.exporter.export_model`` and run by
  ``paddletrain.deploy.predictor.Predictor`` (oneDNN on CPU unless ``use_mkldnn=false``) on the same arrays, once
  per precision: fp32, and bf16 where the CPU runs it natively (AVX512-BF16/AMX). ``<arm>_rel_error`` is
  its relative logit error against dygraph on that batch (the export parity check's measure): the price of bf16.
  ``precisions=[fp32,int8]`` adds the int8 export (calibrated on standard-normal inputs: a speed measurement, its
  logits mean nothing) and ``predictor_int8_vs_fp32``, its speed-up over the fp32 predictor, paired by window.
All arms run on the same pinned threads, windows interleaved per batch size; latency is the median time of
one batch, throughput images/s. ``predict``: ``paddletrain.deploy.batch_prediction.predict_files`` end to end (decode,
preprocess in workers, predict) on synthetic JPEGs vs the bare predictor on ready arrays of the same count,
for each predictor precision (and for the onnxruntime predictor of the fp32 export, which ``predict`` picks for
fp32 when onnxruntime is installed).
``runtimes``: Paddle Inference fp32 vs onnxruntime fp32 on one export of ``runtimes_model`` (its Paddle graph and
its ``model.onnx``) at each thread count and batch size, every arm interleaved with every other per batch size:
the measurement behind ``paddletrain.deploy.predictor.FASTEST_CPU_RUNTIME``.
"""
from __future__ import annotations

import importlib.util
import math
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import paddle

from paddletrain.bench.common import (
    bench_model,
    check_options,
    environment,
    finished,
    interleave,
    paired_ratio,
    timed,
    write_jpeg_folder,
)
from paddletrain.config import allowed
from paddletrain.deploy.exporter import compare_logits, export_model
from paddletrain.deploy.predictor import PRECISIONS
from paddletrain.errors import ConfigError
from paddletrain.job.runtime import DEVICES


@dataclass
class InferenceBenchConfig:
    model: str = "resnet18"
    image_size: int = allowed(224, ge=1)
    num_classes: int = allowed(1000, ge=1)
    batch_sizes: list[int] = allowed(factory=lambda: [1, 8, 32, 64], ge=1)
    # Each timed window runs ceil(images_per_window / batch) batches.
    images_per_window: int = allowed(64, ge=1)
    windows: int = allowed(3, ge=1)
    warmup: int = allowed(1, ge=0)
    use_mkldnn: bool = True
    # Predictor precisions to compare with dygraph fp32; None = fp32, plus bf16 on CPUs that run it natively.
    precisions: list[str] | None = allowed(None, choices=PRECISIONS)
    # Files for the predict_files end-to-end comparison; 0 skips it.
    predict_images: int = allowed(256, ge=0)
    predict_batch_size: int = allowed(32, ge=1)
    # Decode processes; None = predict's default (half the cores), which leaves the predictor its threads.
    predict_workers: int | None = allowed(None, ge=0)
    predict_windows: int = allowed(2, ge=1)
    cpu_threads: int | None = allowed(None, ge=1)
    device: str = allowed("auto", choices=DEVICES)
    # Paddle Inference vs onnxruntime (fp32, CPU) on one export of this model; runtimes_threads=[] skips it.
    runtimes_model: str = "resnet50"
    runtimes_threads: list[int] = allowed(factory=lambda: [1, 2], ge=1)
    runtimes_batch_sizes: list[int] = allowed(factory=lambda: [1, 8], ge=1)
    runtimes_windows: int = allowed(5, ge=1)
    # Also time Paddle Inference on the older ProgramDesc graph (model.pdmodel) of the same weights, which the
    # Predictor runs with memory reuse (PIR graphs cannot have it).
    runtimes_programdesc: bool = False


def _dygraph_arm(model: paddle.nn.Layer, batch: np.ndarray) -> Callable[[int], float]:
    images = paddle.to_tensor(batch)

    def run(steps: int) -> float:
        def work() -> None:
            with paddle.no_grad():
                for _ in range(steps):
                    model(images).numpy()
        return timed(work)

    return run


def _predictor_arm(predictor: Any, batch: np.ndarray) -> Callable[[int], float]:
    def run(steps: int) -> float:
        def work() -> None:
            for _ in range(steps):
                predictor.predict(batch)
        return timed(work)

    return run


def _preprocessing(cfg: InferenceBenchConfig) -> dict[str, Any]:
    from omegaconf import OmegaConf

    from paddletrain.config import DataConfig
    from paddletrain.data import preprocessing_info

    imagenet = dict(mean=[0.485, 0.456, 0.406], std=[0.229, 0.224, 0.225])
    data = OmegaConf.structured(DataConfig(image_size=cfg.image_size, eval_transform="imagenet", **imagenet))
    return preprocessing_info(data)


def _precisions(cfg: InferenceBenchConfig, device: str) -> list[str]:
    from paddletrain.deploy.predictor import check_precision_runs_on, cpu_bf16_support

    if cfg.precisions is None:
        native_bf16 = device == "cpu" and cfg.use_mkldnn and cpu_bf16_support() == "fast"
        return ["fp32", "bf16"] if native_bf16 else ["fp32"]
    if not cfg.precisions:
        raise ConfigError("bench inference: precisions=[] names no predictor; e.g. precisions=[fp32,bf16]")
    for precision in cfg.precisions:
        check_precision_runs_on(precision, device, cfg.use_mkldnn)
    return list(cfg.precisions)


def _int8_export(cfg: InferenceBenchConfig, model: paddle.nn.Layer, workdir: Path) -> Path:
    """The model quantized to int8, calibrated on standard-normal inputs (enough to time it)."""
    calibration = np.random.default_rng(2).standard_normal((16, 3, cfg.image_size, cfg.image_size), dtype=np.float32)
    return export_model(model, workdir / "int8", input_size=(3, cfg.image_size, cfg.image_size),
                        preprocessing=_preprocessing(cfg), precision="int8", calibration=calibration)


def batch_table(cfg: InferenceBenchConfig, model: paddle.nn.Layer,
                predictors: dict[str, Any]) -> list[dict[str, Any]]:
    """One row per batch size: dygraph and each predictor's latency, images/s, speed-up and logit error."""
    rng = np.random.default_rng(0)
    rows = []
    for batch_size in cfg.batch_sizes:
        batch = rng.standard_normal((batch_size, 3, cfg.image_size, cfg.image_size), dtype=np.float32)
        steps = max(1, math.ceil(cfg.images_per_window / batch_size))
        arms = {"dygraph": _dygraph_arm(model, batch)}
        arms.update({f"predictor_{p}": _predictor_arm(predictor, batch) for p, predictor in predictors.items()})
        per_batch = interleave(arms, cfg.windows, steps, cfg.warmup)
        row: dict[str, Any] = {"batch_size": batch_size}
        for arm, seconds in per_batch.items():
            median = statistics.median(seconds)
            row[f"{arm}_latency_ms"] = median * 1e3
            row[f"{arm}_images_per_s"] = batch_size / median
        with paddle.no_grad():
            reference = model(paddle.to_tensor(batch)).numpy()
        for precision, predictor in predictors.items():
            arm = f"predictor_{precision}"
            row[f"{arm}_vs_dygraph"] = paired_ratio(per_batch["dygraph"], per_batch[arm])
            row[f"{arm}_rel_error"] = compare_logits(predictor.predict(batch), reference, 1.0).relative_error
        if {"fp32", "int8"} <= predictors.keys():
            row["predictor_int8_vs_fp32"] = paired_ratio(per_batch["predictor_fp32"], per_batch["predictor_int8"])
        rows.append(row)
    return rows


def predict_pipeline(cfg: InferenceBenchConfig, predictor: Any, workdir: Path) -> dict[str, Any]:
    """predict_files' images/s on JPEGs vs the bare predictor's on ready arrays, interleaved windows."""
    from paddletrain.deploy.batch_prediction import default_num_workers, predict_files

    source = max(cfg.image_size, round(cfg.image_size / 0.875))
    root = write_jpeg_folder(workdir / "images", cfg.predict_images, source)
    paths = sorted(str(p) for p in root.rglob("*.jpg"))
    batch = np.random.default_rng(1).standard_normal(
        (cfg.predict_batch_size, 3, cfg.image_size, cfg.image_size), dtype=np.float32)
    n_batches = math.ceil(len(paths) / cfg.predict_batch_size)
    workers = default_num_workers() if cfg.predict_workers is None else cfg.predict_workers
    end_to_end, inside, bare = [], [], []
    for _ in range(cfg.predict_windows):
        summary = predict_files(predictor, paths, batch_size=cfg.predict_batch_size, num_workers=workers,
                                topk=5, output=workdir / "predictions.jsonl", progress=False)
        if summary.n_failed:
            raise RuntimeError(f"predict_files failed on {summary.n_failed} synthetic images")
        end_to_end.append(summary.images_per_s)
        inside.append(summary.predictor_images_per_s)
        bare.append(n_batches * cfg.predict_batch_size / _predictor_arm(predictor, batch)(n_batches))
    e2e, raw = statistics.median(end_to_end), statistics.median(bare)
    return {"images": len(paths), "batch_size": cfg.predict_batch_size, "num_workers": workers,
            "predict_files_images_per_s": e2e, "predictor_share_images_per_s": statistics.median(inside),
            "bare_predictor_images_per_s": raw, "ratio": e2e / raw}


# Run in a fresh process: Paddle picks the graph format it saves when it starts (FLAGS_enable_pir_api).
_PROGRAMDESC_EXPORT = """
import sys
from paddletrain.bench.common import bench_model
from paddletrain.deploy.exporter import export_model
name, classes, size, out = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), sys.argv[4]
export_model(bench_model(name, classes).eval(), out, input_size=(3, size, size))
"""


def _programdesc_export(cfg: InferenceBenchConfig, out: Path) -> Path:
    """``runtimes_model`` (the same seeded weights as :func:`runtime_table`'s) exported as a ProgramDesc graph."""
    args = [cfg.runtimes_model, str(cfg.num_classes), str(cfg.image_size), str(out)]
    result = subprocess.run([sys.executable, "-c", _PROGRAMDESC_EXPORT, *args], capture_output=True, text=True,
                            env={**os.environ, "FLAGS_enable_pir_api": "0"})
    if result.returncode != 0 or not (out / "model.pdmodel").is_file():
        raise RuntimeError(f"bench inference: the ProgramDesc export failed: {result.stderr[-2000:]}")
    return out


# Paddle's OpenMP threads spin for 200 ms after a run (Intel OpenMP's KMP_BLOCKTIME), and would take the core
# from the next arm's threads: each window starts after they have gone to sleep. (The pause is not timed.)
SETTLE_SECONDS = 0.25


def _settled_arm(predictor: Any, batch: np.ndarray) -> Callable[[int], float]:
    arm = _predictor_arm(predictor, batch)

    def run(steps: int) -> float:
        time.sleep(SETTLE_SECONDS)
        return arm(steps)

    return run


def runtime_table(cfg: InferenceBenchConfig, workdir: Path) -> list[dict[str, Any]]:
    """Paddle Inference fp32 / onnxruntime fp32 on one export, per batch size and thread count.

    Every (runtime, threads) arm of a batch size runs in the same interleaved windows, so load that comes and
    goes hits them alike; ``paddle_vs_onnx`` is the median of the per-window speed ratios (> 1: Paddle faster).
    """
    from paddletrain.deploy.exporter import export_onnx
    from paddletrain.deploy.predictor import OnnxPredictor, Predictor

    model = bench_model(cfg.runtimes_model, cfg.num_classes)
    model.eval()
    model_dir = export_model(model, workdir / "runtimes", input_size=(3, cfg.image_size, cfg.image_size),
                             preprocessing=_preprocessing(cfg))
    export_onnx(model_dir)
    runtimes = {}
    for threads in cfg.runtimes_threads:
        runtimes[f"paddle_{threads}t"] = Predictor(model_dir, device="cpu", cpu_threads=threads,
                                                   use_mkldnn=cfg.use_mkldnn, precision="fp32")
        runtimes[f"onnx_{threads}t"] = OnnxPredictor(model_dir, device="cpu", cpu_threads=threads)
    if cfg.runtimes_programdesc:
        programdesc = _programdesc_export(cfg, workdir / "runtimes-programdesc")
        for threads in cfg.runtimes_threads:
            runtimes[f"programdesc_{threads}t"] = Predictor(programdesc, device="cpu", cpu_threads=threads,
                                                            use_mkldnn=cfg.use_mkldnn, precision="fp32")
    rng = np.random.default_rng(2)
    rows = []
    for batch_size in cfg.runtimes_batch_sizes:
        batch = rng.standard_normal((batch_size, 3, cfg.image_size, cfg.image_size), dtype=np.float32)
        steps = max(1, math.ceil(cfg.images_per_window / batch_size))
        per_batch = interleave({name: _settled_arm(p, batch) for name, p in runtimes.items()},
                               cfg.runtimes_windows, steps, cfg.warmup)
        for threads in cfg.runtimes_threads:
            paddle_s, onnx_s = per_batch[f"paddle_{threads}t"], per_batch[f"onnx_{threads}t"]
            rows.append({"model": cfg.runtimes_model, "batch_size": batch_size, "threads": threads,
                         "paddle_latency_ms": statistics.median(paddle_s) * 1e3,
                         "onnx_latency_ms": statistics.median(onnx_s) * 1e3,
                         "paddle_vs_onnx": paired_ratio(onnx_s, paddle_s),
                         "paddle_windows_s": paddle_s, "onnx_windows_s": onnx_s})
            if cfg.runtimes_programdesc:
                programdesc_s = per_batch[f"programdesc_{threads}t"]
                rows[-1].update(programdesc_latency_ms=statistics.median(programdesc_s) * 1e3,
                                programdesc_vs_onnx=paired_ratio(onnx_s, programdesc_s),
                                programdesc_windows_s=programdesc_s)
    return rows


def _onnx_available() -> str | None:
    """Why the onnxruntime comparison cannot run here, or None when it can."""
    missing = [name for name in ("paddle2onnx", "onnxruntime") if importlib.util.find_spec(name) is None]
    return f"{' and '.join(missing)} not installed (pip install paddletrain[onnx])" if missing else None


def _onnx_predictor(predictor: Any, workdir: Path) -> Any:
    """The onnxruntime predictor of ``predictor``'s export (converted here), with the same threads."""
    from paddletrain.deploy.exporter import export_onnx
    from paddletrain.deploy.predictor import OnnxPredictor

    copy = workdir / "onnx-export"
    shutil.copytree(predictor.model_dir, copy)
    export_onnx(copy)
    return OnnxPredictor(copy, device="cpu", cpu_threads=predictor.runtime.cpu_threads)


def run_inference(cfg: InferenceBenchConfig) -> dict[str, Any]:
    """The batching table (dygraph vs predictor) and the predict_files pipeline ratio."""
    from paddletrain.deploy.predictor import Predictor
    from paddletrain.job.runtime import setup_runtime

    check_options(cfg, "inference")
    if not cfg.batch_sizes:
        raise ConfigError("bench inference: batch_sizes=[] names no batch size; e.g. batch_sizes=[1,8,32]")
    runtime = setup_runtime(cfg.device, cfg.cpu_threads)
    env = environment(runtime.cpu_threads)
    model = bench_model(cfg.model, cfg.num_classes)
    model.eval()
    precisions = _precisions(cfg, runtime.device)
    with tempfile.TemporaryDirectory(prefix="paddletrain-bench-") as tmp:
        model_dir = export_model(model, Path(tmp) / "export", input_size=(3, cfg.image_size, cfg.image_size),
                                 preprocessing=_preprocessing(cfg))
        dirs = {p: _int8_export(cfg, model, Path(tmp)) if p == "int8" else model_dir for p in precisions}
        predictors = {p: Predictor(dirs[p], device=cfg.device, cpu_threads=runtime.cpu_threads,
                                   use_mkldnn=cfg.use_mkldnn, precision=p) for p in precisions}
        rows = batch_table(cfg, model, predictors)
        onnx_missing = _onnx_available()
        pipe_arms = {f"paddle {p}": predictor for p, predictor in predictors.items()}
        if "fp32" in predictors and runtime.device == "cpu" and not onnx_missing and cfg.predict_images:
            pipe_arms["onnxruntime fp32"] = _onnx_predictor(predictors["fp32"], Path(tmp))
        pipelines = [{"runtime": arm, **predict_pipeline(cfg, predictor, Path(tmp))}
                     for arm, predictor in pipe_arms.items()] if cfg.predict_images else []
        compare = cfg.runtimes_threads and runtime.device == "cpu" and not onnx_missing
        runtimes = runtime_table(cfg, Path(tmp)) if compare else []
    goals = []
    for precision in precisions:
        worst = min(r[f"predictor_{precision}_vs_dygraph"] for r in rows)
        goals.append({"goal": f"predictor ({precision}) >= 4 x dygraph (fp32) at every batch size",
                      "measured": worst, "met": worst >= 4.0})
    at_8 = [r["predictor_int8_vs_fp32"] for r in rows if r["batch_size"] == 8 and "predictor_int8_vs_fp32" in r]
    if at_8:  # issue 19: >= 2 x on AVX2 CPUs (>= 3 x where VNNI or AMX exist)
        goals.append({"goal": "predictor (int8) >= 2 x predictor (fp32) at batch 8", "measured": at_8[0],
                      "met": at_8[0] >= 2.0})
    for pipeline in pipelines:
        goals.append({"goal": f"predict_files >= 0.9 x bare predictor ({pipeline['runtime']})",
                      "measured": pipeline["ratio"], "met": pipeline["ratio"] >= 0.9})
    for row in runtimes:
        goals.append({"goal": f"Paddle Inference fp32 >= 1.0 x onnxruntime fp32 ({row['model']}, batch "
                              f"{row['batch_size']}, {row['threads']} thread{'s' if row['threads'] > 1 else ''})",
                      "measured": row["paddle_vs_onnx"], "met": row["paddle_vs_onnx"] >= 1.0})
    notes = [f"{cfg.model} at {cfg.image_size}px, {cfg.num_classes} classes, oneDNN "
             f"{'on' if cfg.use_mkldnn else 'off'} in the predictor; predictor precisions {', '.join(precisions)}"]
    if onnx_missing and (cfg.runtimes_threads or cfg.predict_images):
        notes.append(f"no onnxruntime comparison: {onnx_missing}")
    return {"benchmark": "inference", "config": vars(cfg), "environment": finished(env),
            "rows": rows, "pipeline": pipelines, "runtimes": runtimes, "goals": goals, "notes": notes}
