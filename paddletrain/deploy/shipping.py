"""What ships: every runtime target exported from one checkpoint and measured against it.

:func:`compare_targets` exports each target this machine can run (:data:`TARGETS`: Paddle Inference fp32, bf16 and
int8; ONNX fp32 and int8) through :func:`paddletrain.deploy.exporter.export_checkpoint`, evaluates each on the whole
validation set next to the checkpoint's dygraph model on the same preprocessed inputs, and reports top-1 (mAP for
a multi-label model), agreement, logit error, latency, throughput and size (:class:`ShipReport`). A target that
disagrees gets a layer-by-layer comparison (:mod:`~paddletrain.deploy.divergence`). The command is
:mod:`paddletrain.ship`.
"""
from __future__ import annotations

import importlib.util
import json
import logging
import time
from collections.abc import Callable, Iterator
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import paddle
from omegaconf import MISSING

from paddletrain.checkpoint.locate import locate_checkpoint
from paddletrain.config import RuntimeConfig, allowed, check_field, cli_schema
from paddletrain.data import DatasetError, ImageFolderDataset, LabelListDataset, SampleIndex
from paddletrain.data.formats.folder_scan import scan_split
from paddletrain.data.formats.label_list_file import read_label_list
from paddletrain.deploy import exporter as exporting
from paddletrain.deploy.divergence import Divergence, find_divergence
from paddletrain.deploy.native_output import stdout_to_stderr
from paddletrain.deploy.predictor import (
    PARAMS_FILE,
    ExportedModel,
    OnnxPredictor,
    Preprocessing,
    cpu_bf16_support,
    find_graph_file,
    load_predictor,
    sigmoid,
)
from paddletrain.deploy.quantize import quantize_onnx
from paddletrain.errors import UserError
from paddletrain.job.runtime import set_cpu_threads
from paddletrain.metrics import topk_correct
from paddletrain.metrics.multilabel import multilabel_report
from paddletrain.rebuild import rebuild_checkpoint

log = logging.getLogger("paddletrain")

REPORT_JSON = "report.json"
REPORT_MD = "report.md"
THROUGHPUT_BATCHES = (8, 32)
# Consecutive timed calls of one target before the next takes its turn (see time_targets).
ROUND_CALLS = 5
# The export's preprocessing is built from training's eval transform classes and must reproduce it exactly, as
# export's parity check requires.
PREPROCESS_TOLERANCE = 1e-6
# int8 keeps 7 bits of magnitude (u = 2^-7); a layer's output is judged by the rule export.TOLERANCE applies to
# bf16 and fp16 (32 unit roundoffs). The export itself judges int8 by agreement and accuracy, not by logits,
# so this bound serves the layer-by-layer search only. A quantized resnet20 prefix measured 0.02 (Paddle) and
# 0.05 (ONNX QDQ) against it, a broken layer far above (tests/test_ship.py).
INT8_LAYER_TOLERANCE = 32 * 2.0 ** -7


@cli_schema("ship")
@dataclass
class ShipConfig(RuntimeConfig):
    """Typed schema of `python -m paddletrain.ship` (conf/ship.yaml)."""

    checkpoint: str = MISSING
    # None: outputs/ship/<time>. Each target's export goes to <out_dir>/<target>/; the log to <out_dir>/ship.log.
    out_dir: str | None = None
    # The validation set: a folder of class folders, or a label list ('<path> <class index>' lines, or a
    # multi-label list for a multi-label model) whose paths are relative to val_root. None: the checkpoint's own
    # validation split.
    val: str | None = None
    # Where the checkpoint's dataset lives now, if it moved (overrides data.root, as in export).
    data_root: str | None = None
    # With val=<label list>: the folder its paths are relative to (None: the list's own folder), and the
    # delimiter between path and label.
    val_root: str | None = None
    delimiter: str = " "
    # Largest drop of top-1 (mAP for a multi-label model) from the checkpoint's, in points, that still ships.
    tolerance: float = allowed(1.0, ge=0)
    # Below this top-1 (or decision) agreement with the checkpoint, or past `tolerance`, the first diverging
    # layer is looked for.
    min_agreement: float = allowed(0.99, ge=0, le=1)
    # Calibration images of int8 targets: a folder or a label list. None: the training split of the checkpoint's
    # dataset (<root>/train of an image folder; otherwise the int8 export's own default), never the validation set
    # being scored, which would flatter int8.
    calibration: str | None = None
    calibration_images: int = allowed(200, ge=1)
    # Images per predictor call while scoring the validation set.
    batch_size: int = allowed(32, ge=1)
    # Timed calls per batch size (batch 1 for latency; 8 and 32 for throughput), interleaved across targets.
    timing_runs: int = allowed(20, ge=1)
    # Images the layer-by-layer comparison runs (those the target disagrees on first).
    divergence_images: int = allowed(8, ge=1)


# ---------------------------------------------------------------------------------------------------------------
# Targets


def _native_bf16() -> str | None:
    support = cpu_bf16_support()
    if support == "fast":
        return None
    return (f"this CPU has no native bfloat16 (AVX512-BF16 or AMX); oneDNN bf16 support: {support}"
            + (" (emulated: slower than fp32)" if support == "emulated" else ""))


def _onnx_extra() -> str | None:
    missing = [name for name in ("paddle2onnx", "onnxruntime") if not _importable(name)]
    return f"needs {' and '.join(missing)}: pip install paddletrain[onnx]" if missing else None


def _importable(module: str) -> bool:
    return importlib.util.find_spec(module) is not None


@dataclass(frozen=True)
class Target:
    """A way to ship the model: a format and precision of :func:`paddletrain.deploy.exporter.export_checkpoint`, and the
    runtime that runs it (``format``: ``paddle`` = Paddle Inference, ``onnx`` = onnxruntime).

    ``unavailable`` says why this machine cannot run it (None: it can), so a skipped target always has a reason.
    """

    name: str
    format: str
    precision: str
    unavailable: Callable[[], str | None]

    def export(self, checkpoint: str, out_dir: Path, options: ExportOptions) -> ExportedModel:
        """Export the checkpoint for this target into ``out_dir`` and open it in this target's runtime."""
        extra: dict[str, Any] = {}
        if self.precision == "int8":
            extra = {"calibration": options.calibration, "calibration_images": options.calibration_images}
        # check=False: the report scores the whole validation set against the checkpoint, a superset of the
        # export's parity check on a few images.
        exporting.export_checkpoint(checkpoint, out_dir, format=self.format, precision=self.precision, check=False,
                                    data_root=options.data_root, device="cpu", cpu_threads=options.cpu_threads,
                                    imports=options.imports, weights=options.weights, **extra)
        return self.load(out_dir, options.cpu_threads)

    def load(self, out_dir: Path, cpu_threads: int | None) -> ExportedModel:
        """The export in ``out_dir`` in this target's runtime, in the precision the export recorded."""
        return load_predictor(out_dir, backend=self.format, device="cpu", cpu_threads=cpu_threads)

    def run_layer(self, layer: paddle.nn.Layer, input_size: tuple[int, int, int], inputs: np.ndarray,
                  scratch: Path, cpu_threads: int | None = None) -> np.ndarray:
        """A Layer (a prefix of the model) through this target's export and runtime: for the layer-by-layer
        comparison."""
        # int8: the prefix is calibrated on the inputs it is compared on, so a diverging layer is one that int8
        # execution (not the choice of calibration images) moves beyond its tolerance.
        calibration = inputs if self.precision == "int8" else None
        if self.format == "onnx":
            exporting.export_model(layer, scratch, input_size=input_size)
            fp32_onnx = exporting.export_onnx(scratch)
            if calibration is not None:
                with stdout_to_stderr():  # onnxruntime's calibration prints; stdout carries the table
                    quantize_onnx(fp32_onnx, fp32_onnx, calibration, exporting.DEFAULT_QUANT_ALGO)
        else:
            exporting.export_model(layer, scratch, input_size=input_size, precision=self.precision,
                                   calibration=calibration)
        return self.load(scratch, cpu_threads).predict(inputs)


TARGETS: tuple[Target, ...] = (
    Target("paddle-fp32", "paddle", "fp32", lambda: None),
    Target("paddle-bf16", "paddle", "bf16", _native_bf16),
    Target("paddle-int8", "paddle", "int8", lambda: None),
    Target("onnx-fp32", "onnx", "fp32", _onnx_extra),
    Target("onnx-int8", "onnx", "int8", _onnx_extra),
)


def layer_tolerance(precision: str) -> float:
    """The relative error a layer's output may have in ``precision`` (export.TOLERANCE's rule)."""
    return exporting.TOLERANCE.get(precision, INT8_LAYER_TOLERANCE)


@dataclass
class ExportOptions:
    """What every target's export shares."""

    data_root: str | None = None
    cpu_threads: int | None = None
    imports: list[str] = field(default_factory=list)
    calibration: str | None = None
    calibration_images: int = 200
    weights: str = "auto"


# ---------------------------------------------------------------------------------------------------------------
# The report


@dataclass
class TargetResult:
    """One target's line of the report; ``status`` is ``ok``, ``skipped`` or ``failed`` (``reason`` says why)."""

    target: str
    format: str
    precision: str
    status: str
    reason: str | None = None
    score: float | None = None
    # Points (percent) of top-1 or mAP above (+) or below (-) the checkpoint's.
    delta_points: float | None = None
    agreement: float | None = None
    relative_logit_error: float | None = None
    latency_ms_p50: float | None = None
    latency_ms_p95: float | None = None
    # Images per second by batch size.
    throughput: dict[int, float] = field(default_factory=dict)
    size_bytes: int | None = None
    export_dir: str | None = None
    divergence: Divergence | None = None


@dataclass
class ShipReport:
    """What :func:`compare_targets` found: the checkpoint's score and every target's."""

    checkpoint: str
    val: str
    num_images: int
    # "top1" or "mAP".
    metric: str
    reference_score: float
    tolerance: float
    targets: list[TargetResult]
    # Largest |preprocess.json pipeline - training eval transform| over the scored images: the targets and the
    # checkpoint here share the former, so a mismatch (BGR, other resize) would otherwise go unseen.
    preprocess_max_diff: float = 0.0

    def dropped(self) -> list[TargetResult]:
        """Targets that drop more than ``tolerance`` points below the checkpoint, or failed to export."""
        return [t for t in self.targets
                if t.status == "failed" or (t.status == "ok" and t.delta_points < -self.tolerance)]

    @property
    def preprocessing_matches(self) -> bool:
        return self.preprocess_max_diff <= PREPROCESS_TOLERANCE

    @property
    def passed(self) -> bool:
        return not self.dropped() and self.preprocessing_matches

    def to_dict(self) -> dict[str, Any]:
        out = asdict(self)
        out["passed"] = self.passed
        return out

    def rows(self) -> list[list[str]]:
        """The table: a header, then one row per target."""
        header = ["target", self.metric, "Δ points", "agreement", "rel. logit error", "p50 ms (b1)", "p95 ms (b1)",
                  *(f"img/s b{b}" for b in THROUGHPUT_BATCHES), "size MB", "note"]
        rows = [header, ["checkpoint (dygraph)", f"{self.reference_score:.4f}", *[""] * (len(header) - 2)]]
        for t in self.targets:
            if t.status != "ok":
                rows.append([t.target, *[""] * (len(header) - 2), f"{t.status}: {t.reason}"])
                continue
            note = "" if t.divergence is None else str(t.divergence)
            rows.append([t.target, f"{t.score:.4f}", f"{t.delta_points:+.2f}", f"{t.agreement:.2%}",
                         f"{t.relative_logit_error:.1e}", f"{t.latency_ms_p50:.2f}", f"{t.latency_ms_p95:.2f}",
                         *(f"{t.throughput[b]:.0f}" for b in THROUGHPUT_BATCHES), f"{t.size_bytes / 1e6:.2f}",
                         note])
        return rows

    def markdown(self) -> str:
        rows = self.rows()
        lines = ["| " + " | ".join(rows[0]) + " |", "|" + "---|" * len(rows[0])]
        lines += ["| " + " | ".join(row) + " |" for row in rows[1:]]
        failures = [t.target for t in self.dropped()] + ([] if self.preprocessing_matches else ["preprocessing"])
        verdict = "PASS" if self.passed else "FAIL: " + ", ".join(failures)
        return (f"{self.checkpoint} on {self.val} ({self.num_images} images), tolerance {self.tolerance:g} "
                f"points: {verdict}\n\n" + "\n".join(lines) + "\n")

    def table(self) -> str:
        rows = self.rows()
        widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
        return "\n".join("  ".join(cell.ljust(w) for cell, w in zip(row, widths, strict=True)).rstrip()
                         for row in rows)


# ---------------------------------------------------------------------------------------------------------------
# The validation set


def validation_set(rebuilt: Any, val: str | None, val_root: str | None = None,
                   delimiter: str = " ") -> tuple[Any, str]:
    """The dataset to score and how to name it: the checkpoint's validation split, a folder of class folders,
    or a label list (read as training reads its lists)."""
    classes = list(rebuilt.splits.classes)
    if val is None:
        return rebuilt.splits.val, "the checkpoint's validation split"
    path = Path(val)
    multilabel = rebuilt.multilabel_threshold is not None
    try:
        if path.is_dir():
            if multilabel:
                raise UserError(f"val={val!r} is a folder, but the checkpoint is a multi-label model: give its "
                                "multi-label list ('<path><TAB>0,1,0,...' lines) and val_root")
            return _folder_dataset(path, classes, rebuilt.splits.in_chans), str(path)
        if path.is_file():
            root = val_root or str(path.parent)
            found = read_label_list(path, root, key="val", delimiter=delimiter, multilabel=multilabel,
                                    num_classes=len(classes))
            return LabelListDataset(found.index, classes, in_chans=rebuilt.splits.in_chans), str(path)
    except DatasetError as exc:
        raise UserError(str(exc)) from exc
    raise UserError(f"val={val!r} is neither a folder of class folders nor a label list file")


def _folder_dataset(folder: Path, classes: list[str], in_chans: int) -> LabelListDataset:
    """The images of ``folder/<class>/`` labelled by the checkpoint's classes (scanned as imagefolder scans)."""
    found = scan_split(folder.parent, folder.name, classes, folder)
    if found.unknown:
        raise UserError(f"val={str(folder)!r}: class folders {found.unknown} are not classes of the checkpoint "
                        f"({', '.join(classes)})")
    if not found.samples:
        raise UserError(f"val={str(folder)!r} holds no images in class folders named like the checkpoint's "
                        f"classes ({', '.join(classes)})")
    relpaths = [str(Path(p).relative_to(folder)) for p, _ in found.samples]
    index = SampleIndex.build(folder, relpaths, [label for _, label in found.samples])
    return LabelListDataset(index, classes, in_chans=in_chans)


def _batches(dataset: Any, batch_size: int, indices: list[int] | None = None) -> Iterator[list[Any]]:
    """The dataset's decoded images (``indices``, default all), ``batch_size`` a time."""
    order = list(range(len(dataset))) if indices is None else indices
    for start in range(0, len(order), batch_size):
        yield [dataset.load_image(i) for i in order[start:start + batch_size]]


def _stack(images: list[Any], transform: Callable[[Any], np.ndarray]) -> np.ndarray:
    return np.stack([transform(image) for image in images])


# ---------------------------------------------------------------------------------------------------------------
# Scoring


def score(logits: np.ndarray, targets: np.ndarray, threshold: float | None) -> float:
    """Top-1 accuracy, or mAP of a multi-label model (``threshold`` set), of ``logits`` on ``targets``."""
    if threshold is not None:
        return multilabel_report(sigmoid(logits), targets, threshold).metrics("val").get("val/mAP", float("nan"))
    hits = topk_correct(paddle.to_tensor(logits), paddle.to_tensor(np.asarray(targets, np.int64)), [1])
    return float(hits.numpy()[0]) / len(logits)


def _targets_of(dataset: Any) -> np.ndarray:
    return np.asarray(dataset.targets)


def time_targets(predictors: dict[str, ExportedModel], sample: np.ndarray, runs: int) -> dict[str, dict[str, Any]]:
    """Latency p50/p95 (ms) at batch 1 and images/s at each of :data:`THROUGHPUT_BATCHES`, per target.

    Targets take turns (rounds of :data:`ROUND_CALLS` timed calls each, ``runs`` timed calls in all), so a busy
    machine slows them alike. Each turn starts with an untimed call: the runtime that ran before keeps its threads
    spinning for a while (onnxruntime and OpenMP both do), which made the next runtime's first call 4-5x slower
    on 2 cores (resnet20 at 16 px, Paddle Inference after onnxruntime). Throughput uses the median call time.
    """
    timings: dict[str, dict[int, list[float]]] = {name: {b: [] for b in (1, *THROUGHPUT_BATCHES)}
                                                  for name in predictors}
    for batch in (1, *THROUGHPUT_BATCHES):
        inputs = np.resize(sample, (batch, *sample.shape[1:]))  # repeats the images when there are fewer
        while predictors and len(next(iter(timings.values()))[batch]) < runs:
            for name, predictor in predictors.items():
                predictor.predict(inputs)  # untimed: see above (and oneDNN builds a new shape's kernels here)
                for _ in range(min(ROUND_CALLS, runs - len(timings[name][batch]))):
                    start = time.perf_counter()
                    predictor.predict(inputs)
                    timings[name][batch].append(time.perf_counter() - start)
    return {name: {"latency_ms_p50": float(np.percentile(t[1], 50) * 1e3),
                   "latency_ms_p95": float(np.percentile(t[1], 95) * 1e3),
                   "throughput": {b: b / float(np.median(t[b])) for b in THROUGHPUT_BATCHES}}
            for name, t in timings.items()}


def model_size(predictor: ExportedModel) -> int:
    """Bytes of the files the runtime loads: the graph and weights, or the ONNX file."""
    if isinstance(predictor, OnnxPredictor):
        return predictor.onnx_file.stat().st_size
    return find_graph_file(predictor.model_dir).stat().st_size + (predictor.model_dir / PARAMS_FILE).stat().st_size


# ---------------------------------------------------------------------------------------------------------------
# The comparison


def compare_targets(checkpoint: str, out_dir: str | Path, val: str | None = None, data_root: str | None = None,
                    val_root: str | None = None, delimiter: str = " ", tolerance: float = 1.0,
                    min_agreement: float = 0.99, calibration: str | None = None, calibration_images: int = 200,
                    batch_size: int = 32, timing_runs: int = 20, divergence_images: int = 8,
                    cpu_threads: int | None = None, imports: list[str] = (),
                    targets: tuple[Target, ...] | None = None, weights: str = "auto") -> ShipReport:
    """Export ``checkpoint`` to every target this machine runs, score each on the validation set next to the
    checkpoint, time it, and look for the first diverging layer of any that disagrees.

    ``checkpoint`` is what ``export`` takes (a checkpoint directory, or a run directory with ``:best``/``:last``);
    ``val`` a folder of class folders or a label list whose paths are relative to ``val_root`` (None: the
    checkpoint's validation split); ``data_root`` where the checkpoint's dataset is now; ``tolerance`` in
    points of top-1 (mAP for a multi-label model); ``targets``: :data:`TARGETS` unless given. Writes
    ``report.json`` and ``report.md`` into ``out_dir`` and each export into ``out_dir/<target>/``. Raises
    :class:`UserError` for bad input; a target that drops is in the report (``report.passed``), not an
    exception.
    """
    for key, value in (("tolerance", tolerance), ("min_agreement", min_agreement), ("batch_size", batch_size),
                       ("timing_runs", timing_runs), ("divergence_images", divergence_images),
                       ("calibration_images", calibration_images), ("cpu_threads", cpu_threads)):
        check_field(ShipConfig, key, value)
    targets = TARGETS if targets is None else tuple(targets)
    set_cpu_threads(cpu_threads)
    rebuilt = rebuild_checkpoint(checkpoint, data_root, imports, weights)
    dataset, val_name = validation_set(rebuilt, val, val_root, delimiter)
    if len(dataset) == 0:
        raise UserError(f"the validation set ({val_name}) is empty")
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    options = ExportOptions(data_root, cpu_threads, list(imports), calibration or default_calibration(rebuilt),
                            calibration_images, weights)
    results, predictors = _export_all(checkpoint, out, targets, options)
    preprocessing = Preprocessing(rebuilt.preprocessing)  # what each export's preprocess.json holds
    threshold = rebuilt.multilabel_threshold
    reference, outputs, preprocess_diff = _run_all(rebuilt, predictors, dataset, preprocessing, batch_size)
    labels = _targets_of(dataset)
    reference_score = score(reference, labels, threshold)
    sample = _stack(next(_batches(dataset, max(THROUGHPUT_BATCHES))), preprocessing)
    timings = time_targets(predictors, sample, timing_runs)
    metric = "mAP" if threshold is not None else "top1"
    report = ShipReport(str(locate_checkpoint(checkpoint)), val_name, len(dataset), metric, reference_score,
                        tolerance, list(results.values()), preprocess_diff)
    for name, predictor in predictors.items():
        result = results[name]
        _score_target(result, predictor, outputs[name], reference, labels, threshold, reference_score)
        for key, value in timings[name].items():
            setattr(result, key, value)
        if result.agreement < min_agreement or result.delta_points < -tolerance:
            result.divergence = _divergence(rebuilt.exportable, dataset, preprocessing, outputs[name], reference,
                                            threshold, divergence_images, _target_of(targets, name), cpu_threads)
    write_report(report, out)
    return report


def _score_target(result: TargetResult, predictor: ExportedModel, output: np.ndarray, reference: np.ndarray,
                  labels: np.ndarray, threshold: float | None, reference_score: float) -> None:
    """Fill ``result``'s accuracy, agreement, logit error and size from the target's logits on the whole set."""
    parity = exporting.compare_logits(output, reference, layer_tolerance(result.precision), threshold)
    result.score = score(output, labels, threshold)
    result.delta_points = 100.0 * (result.score - reference_score)
    result.agreement = parity.top1_agreement if threshold is None else parity.decision_agreement
    result.relative_logit_error = parity.relative_error
    result.size_bytes = model_size(predictor)


def default_calibration(rebuilt: Any) -> str | None:
    """The training split of the checkpoint's dataset as a calibration folder (``<root>/train`` of an image folder),
    so int8 never calibrates on the validation set it is scored on; None for a dataset without such a folder
    (the int8 export then applies its own default)."""
    train = rebuilt.splits.train
    if isinstance(train, ImageFolderDataset):
        return str(train.root / train.split)
    return None


def _target_of(targets: tuple[Target, ...], name: str) -> Target:
    return next(t for t in targets if t.name == name)


def _export_all(checkpoint: str, out: Path, targets: tuple[Target, ...],
                options: ExportOptions) -> tuple[dict[str, TargetResult], dict[str, ExportedModel]]:
    """Export every target this machine runs; the others are skipped with their reason, and one whose export
    fails is ``failed`` with the error."""
    results: dict[str, TargetResult] = {}
    predictors: dict[str, ExportedModel] = {}
    for target in targets:
        result = TargetResult(target.name, target.format, target.precision, status="ok")
        results[target.name] = result
        result.reason = target.unavailable()
        if result.reason is not None:
            result.status = "skipped"
            log.info("%s: skipped (%s)", target.name, result.reason)
            continue
        export_dir = out / target.name
        log.info("%s: exporting to %s", target.name, export_dir)
        try:
            predictors[target.name] = target.export(checkpoint, export_dir, options)
        except UserError as exc:
            if not predictors and target is targets[0]:
                raise  # the first target failing is the checkpoint's or the input's fault, not a runtime's
            result.status, result.reason = "failed", str(exc)
            log.error("%s: export failed: %s", target.name, exc)
            continue
        result.export_dir = str(export_dir)
    return results, predictors


def _run_all(rebuilt: Any, predictors: dict[str, ExportedModel], dataset: Any, preprocessing: Preprocessing,
             batch_size: int) -> tuple[np.ndarray, dict[str, np.ndarray], float]:
    """The checkpoint's logits and every target's on the whole validation set, the same inputs (the export's
    preprocessing) for all; and how far that preprocessing is from training's eval transform on these images."""
    reference: list[np.ndarray] = []
    outputs: dict[str, list[np.ndarray]] = {name: [] for name in predictors}
    preprocess_diff = 0.0
    for images in _batches(dataset, batch_size):
        inputs = _stack(images, preprocessing)
        preprocess_diff = max(preprocess_diff, float(np.abs(inputs - _stack(images, rebuilt.eval_transform)).max()))
        reference.append(exporting.reference_logits(rebuilt.model, inputs))
        for name, predictor in predictors.items():
            outputs[name].append(predictor.predict(inputs))
    outputs = {name: np.concatenate(chunks) for name, chunks in outputs.items()}
    return np.concatenate(reference), outputs, preprocess_diff


def _divergence(model: paddle.nn.Layer, dataset: Any, preprocessing: Preprocessing, output: np.ndarray,
                reference: np.ndarray, threshold: float | None, count: int, target: Target,
                cpu_threads: int | None) -> Divergence:
    """The first diverging layer of ``target``, judged on the images it disagrees on most (then the others)."""
    if threshold is None:
        disagree = output.argmax(1) != reference.argmax(1)
    else:
        boundary = np.log(threshold / (1.0 - threshold))  # sigmoid(logit) > threshold  <=>  logit > boundary
        disagree = ((output > boundary) != (reference > boundary)).any(1)
    error = np.linalg.norm(output - reference, axis=1)
    order = np.lexsort((-error, ~disagree))  # disagreements first, each group by its logit error
    inputs = _stack(next(_batches(dataset, count, [int(i) for i in order[:count]])), preprocessing)
    tolerance = layer_tolerance(target.precision)
    try:
        found = find_divergence(model, inputs, lambda layer, size, x, scratch: target.run_layer(
            layer, size, x, scratch, cpu_threads), tolerance)
    except UserError as exc:
        found = Divergence(layer=None, tolerance=tolerance, reason=str(exc))
    log.warning("%s disagrees with the checkpoint: %s", target.name, found)
    return found


def write_report(report: ShipReport, out_dir: Path) -> None:
    """``report.json`` and ``report.md`` in ``out_dir``."""
    (out_dir / REPORT_JSON).write_text(json.dumps(report.to_dict(), indent=2) + "\n", encoding="utf-8")
    (out_dir / REPORT_MD).write_text(report.markdown(), encoding="utf-8")


# ---------------------------------------------------------------------------------------------------------------
# The command line
