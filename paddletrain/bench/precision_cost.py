"""``bench precision``: what an inference precision costs in logits, on your weights and your images.

The model is exported once and run by the Predictor in each precision; every predictor is judged against fp32
dygraph with the export parity check's own measure (:func:`paddletrain.deploy.exporter.compare_logits`). Beside them,
rows for mistakes the parity check exists to catch (batch norm in train mode, BGR input, unnormalised input),
so the tolerance can be read against both::

    python -m paddletrain.bench precision model=vision arch=shufflenet_v2_x0_25 num_classes=1000 \\
        pretrained=../shared/data/pretrained/shufflenet_v2_x0_25.pdparams trust_pickle=true \\
        images=../shared/data/hymenoptera_data/val
"""
from __future__ import annotations

import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import paddle
from omegaconf import OmegaConf
from PIL import Image

from paddletrain.bench.common import check_options, environment, finished
from paddletrain.config import DataConfig, allowed
from paddletrain.data import preprocessing_info
from paddletrain.deploy.exporter import TOLERANCE, compare_logits, export_model, reference_logits
from paddletrain.deploy.predictor import PRECISIONS, Predictor, check_precision_runs_on, cpu_bf16_support
from paddletrain.errors import ConfigError
from paddletrain.job.runtime import setup_runtime
from paddletrain.models import create_model

IMAGE_SUFFIXES = (".jpg", ".jpeg", ".png", ".bmp")


@dataclass
class PrecisionBenchConfig:
    model: str = "resnet18"
    # For model=vision: the paddle.vision builder.
    arch: str | None = None
    num_classes: int = allowed(1000, ge=1)
    # A weight source as in model.pretrained (file, vision:, paddleclas:, hub:); None = random weights.
    pretrained: str | None = None
    trust_pickle: bool = False
    # A folder of images (searched recursively); None = standard-normal inputs.
    images: str | None = None
    max_images: int = allowed(256, ge=1)
    image_size: int = allowed(224, ge=1)
    batch_size: int = allowed(16, ge=1)
    # None: fp32, plus bf16 where the CPU can run it (natively or emulated).
    precisions: list[str] | None = allowed(None, choices=PRECISIONS)
    cpu_threads: int | None = allowed(None, ge=1)


def _inputs(cfg: PrecisionBenchConfig, preprocess: Any) -> tuple[np.ndarray, str]:
    if cfg.images is None:
        rng = np.random.default_rng(0)
        shape = (min(cfg.max_images, 32), 3, cfg.image_size, cfg.image_size)
        return rng.standard_normal(shape, dtype=np.float32), "standard-normal inputs"
    root = Path(cfg.images)
    files = sorted(p for p in root.rglob("*") if p.is_file() and p.suffix.lower() in IMAGE_SUFFIXES)
    if not files:
        raise ConfigError(f"bench precision: images={cfg.images} holds no {'/'.join(IMAGE_SUFFIXES)} files")
    files = files[:cfg.max_images]
    arrays = []
    for path in files:
        with Image.open(path) as image:
            arrays.append(preprocess(np.asarray(image.convert("RGB"))))
    return np.stack(arrays), f"{len(files)} images from {cfg.images}"


def _precisions(cfg: PrecisionBenchConfig) -> list[str]:
    if cfg.precisions is None:
        return ["fp32", "bf16"] if cpu_bf16_support() != "none" else ["fp32"]
    for precision in cfg.precisions:
        check_precision_runs_on(precision, "cpu")
    return list(cfg.precisions)


def _mistakes(model: paddle.nn.Layer, inputs: np.ndarray, mean: list[float], std: list[float]) -> dict[str, Any]:
    """Logits of the same model fed or run the wrong way."""
    model.train()
    with paddle.no_grad():
        train_bn = np.concatenate([model(paddle.to_tensor(inputs[i:i + 32])).numpy()
                                   for i in range(0, len(inputs), 32)])
    model.eval()
    m, s = (np.asarray(v, np.float32).reshape(1, -1, 1, 1) for v in (mean, std))
    return {"mistake: batch norm in train mode": train_bn,
            "mistake: BGR instead of RGB": reference_logits(model, np.ascontiguousarray(inputs[:, ::-1])),
            "mistake: unnormalised input": reference_logits(model, inputs * s + m)}


def run_precision(cfg: PrecisionBenchConfig) -> dict[str, Any]:
    """One row per precision (and per mistake): relative logit error, top-1 agreement, clear flips, verdict."""
    check_options(cfg, "precision")
    runtime = setup_runtime("cpu", cfg.cpu_threads)
    env = environment(runtime.cpu_threads)
    options = {"arch": cfg.arch} if cfg.arch else {}
    paddle.seed(0)
    model = create_model(cfg.model, num_classes=cfg.num_classes, pretrained=cfg.pretrained,
                         trust_pickle=cfg.trust_pickle, **options)
    model.eval()
    imagenet = dict(mean=[0.485, 0.456, 0.406], std=[0.229, 0.224, 0.225])
    data = OmegaConf.structured(DataConfig(image_size=cfg.image_size, eval_transform="imagenet", **imagenet))
    rows = []
    with tempfile.TemporaryDirectory(prefix="paddletrain-bench-") as tmp:
        model_dir = export_model(model, Path(tmp), input_size=(3, cfg.image_size, cfg.image_size),
                                 preprocessing=preprocessing_info(data))
        predictors = {p: Predictor(model_dir, device="cpu", cpu_threads=runtime.cpu_threads, precision=p)
                      for p in _precisions(cfg)}
        inputs, source = _inputs(cfg, next(iter(predictors.values())).preprocessing)
        reference = reference_logits(model, inputs)
        outputs = {f"predictor {p}": np.concatenate([predictor.predict(inputs[i:i + cfg.batch_size])
                                                     for i in range(0, len(inputs), cfg.batch_size)])
                   for p, predictor in predictors.items()}
    outputs.update(_mistakes(model, inputs, imagenet["mean"], imagenet["std"]))
    loosest = max(TOLERANCE, key=TOLERANCE.get)  # a mistake must fail even the loosest tolerance
    for name, logits in outputs.items():
        judged_as = name.split()[-1] if name.startswith("predictor") else loosest
        report = compare_logits(logits, reference, TOLERANCE[judged_as])
        rows.append({"logits": name, "tolerance of": judged_as, "relative error": report.relative_error,
                     "tolerance": report.tolerance, "top-1 agreement": report.top1_agreement,
                     "clear flips": report.top1_flips, "passes": report.passed})
    return {"benchmark": "precision", "config": vars(cfg), "environment": finished(env), "rows": rows,
            "notes": [f"{cfg.model}{f' ({cfg.arch})' if cfg.arch else ''} with "
                      f"{cfg.pretrained or 'random weights'}, {source}, {cfg.image_size}px, against fp32 dygraph; "
                      f"bf16 on this CPU: {cpu_bf16_support()}"]}
