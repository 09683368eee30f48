"""A checkpoint taken to Paddle Inference (fp32, bf16, int8) or ONNX, and proven against it.

:func:`export_checkpoint` rebuilds the model from the config saved in the checkpoint, traces it with
``paddle.jit.to_static`` and saves it with ``paddle.jit.save`` next to ``preprocess.json`` (input size, mean/std,
resize/crop, labels); int8 goes through :mod:`~paddletrain.deploy.quantize`. The parity check then runs the saved
model in its runtime and the dygraph model on a few validation images of the checkpoint's own dataset
(:class:`ParityReport`); a difference beyond :data:`TOLERANCE` fails the export. :func:`export_model` does the same
for a model in hand. The command is :mod:`paddletrain.export`.
"""
from __future__ import annotations

import inspect
import json
import logging
import tempfile
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import paddle
from omegaconf import MISSING

from paddletrain.config import RuntimeConfig, allowed, check_field, cli_schema
from paddletrain.deploy.native_output import stdout_to_stderr
from paddletrain.deploy.predictor import (
    GRAPH_FILES,
    MODEL_PREFIX,
    ONNX_FILE,
    PARAMS_FILE,
    PRECISIONS,
    PREPROCESS_FILE,
    PREPROCESS_FORMAT_VERSION,
    OnnxPredictor,
    Predictor,
    Preprocessing,
    check_precision_runs_on,
    find_graph_file,
    read_metadata,
)
from paddletrain.deploy.quantize import (
    QUANT_ALGOS,
    calibration_files,
    calibration_inputs,
    check_calibration_files,
    check_onnx_algo,
    choose_calibration_files,
    quantize_onnx,
    quantize_paddle,
    reduce_range_for,
    require_onnx_quantization,
)
from paddletrain.errors import ExitCode, UserError
from paddletrain.job.runtime import set_cpu_threads
from paddletrain.rebuild import RebuiltCheckpoint, rebuild_checkpoint

log = logging.getLogger("paddletrain")

FORMATS = ("paddle", "onnx")
INPUT_NAME = "x"
ONNX_OPSET = 13
# 1 is Hydra's own exit status for a command line it rejects; 3 means "ran, but the result is not good",
# as in paddletrain.predict.
EXIT_USER_ERROR = ExitCode.USER_ERROR
EXIT_PARITY_FAILED = ExitCode.BAD_RESULT
# Parity tolerance: the largest relative RMS error of the logits (each image's logits centred, since softmax
# ignores a shift) that still counts as the same model. Low precision: 32 unit roundoffs of the format
# (bf16 keeps 8 significant bits, u = 2^-8; fp16 11 bits, u = 2^-11). Rounding error grows with depth; measured
# bf16 errors (docs/inference.md, the same on an AMX Xeon and an AVX512-BF16 EPYC) were 1-2 u for ResNets and
# 12-14 u for shufflenet_v2 on real photos, so 32 u holds for both with room, while the mistakes the check
# exists for (batch norm in train mode, BGR input, transposed or unnormalised input, other weights) measured
# 58-256 u, above it. fp32 has no format error worth the name: oneDNN's other summation orders move logits by
# ~1e-6 relative, and 1e-3 leaves headroom for deep nets.
UNIT_ROUNDOFF = {"fp16": 2.0 ** -11, "bf16": 2.0 ** -8}
TOLERANCE = {"fp32": 1e-3, **{name: 32 * u for name, u in UNIT_ROUNDOFF.items()}}
# A top-1 disagreement is a flip (a failure) only when the reference's top-2 margin exceeds this many tolerated
# per-logit errors: each of the two logits may move by 3 of them before the order is in doubt. A multi-label
# decision (one logit against the fixed threshold) is a flip when that logit is more than half of it away.
FLIP_MARGIN = 6.0
# int8 moves logits by design (a few percent), so an int8 export is judged by what it changes: its top-1 (or
# multi-label decision) agreement with the checkpoint and the accuracy it loses on the check images. The defaults
# catch a broken quantization (PaddleSlim #364, timm #1412: tens of points lost, agreement near chance) on the
# 16 default check images, where one image is 6.25 points; they are not an accuracy measurement, which needs a
# whole validation set. Measured agreement on trained models is in docs/inference.md ("int8").
QUANT_MIN_AGREEMENT = 0.85
QUANT_MAX_ACCURACY_DROP = 0.07
DEFAULT_QUANT_ALGO = "hist"
DEFAULT_CALIBRATION_IMAGES = 128


@cli_schema("export")
@dataclass
class ExportConfig(RuntimeConfig):
    """Typed schema of `python -m paddletrain.export` (conf/export.yaml)."""

    checkpoint: str = MISSING
    # None: outputs/export/<time>. The command logs into <out_dir>/export.log too.
    out_dir: str | None = None
    format: str = allowed("paddle", choices=FORMATS)
    # "dynamic" or a fixed batch size (checked by parse_batch).
    batch: str = "dynamic"
    precision: str = allowed("fp32", choices=PRECISIONS)
    check: bool = True
    num_check_images: int = allowed(16, ge=1)
    # Where the checkpoint's dataset lives now, if it moved since training (overrides data.root).
    data_root: str | None = None
    # precision=int8: images to calibrate on (folder, list file or glob); None = the checkpoint's training split.
    calibration: str | None = None
    calibration_images: int = allowed(DEFAULT_CALIBRATION_IMAGES, ge=1)
    quant_algo: str = allowed(DEFAULT_QUANT_ALGO, choices=QUANT_ALGOS)
    # Keep the first convolution and the classifier in fp32.
    quant_keep_ends: bool = True
    # Quantize so CPUs without VNNI (AVX2, AVX-512 without VNNI) cannot saturate int16 sums: 7-bit activation codes
    # in Paddle, 7-bit weights in onnxruntime (paddletrain.deploy.quantize.REDUCED_ACTIVATION_WIDENING). None: each
    # runtime's measured default, off for Paddle, on for onnxruntime
    # (paddletrain.deploy.quantize.REDUCE_RANGE_BY_RUNTIME).
    quant_reduce_range: bool | None = None
    # Move the mean output change that rounding each layer's weights to int8 causes into the batch norm (or bias)
    # after it (paddletrain.deploy.bias_correction). Paddle int8 only; onnxruntime rounds its weights itself.
    quant_bias_correction: bool = True
    # The int8 parity check: least top-1 (multi-label: decision) agreement, largest accuracy drop (0..1).
    quant_min_agreement: float = allowed(QUANT_MIN_AGREEMENT, ge=0, le=1)
    quant_max_accuracy_drop: float = allowed(QUANT_MAX_ACCURACY_DROP, ge=0, le=1)


@dataclass
class ParityReport:
    """How the exported model and the dygraph model compare on the same inputs.

    A single-label (softmax) model is judged by its top-1 class; a multi-label (sigmoid) one by its per-class
    decisions at ``threshold`` (top-1 means nothing there), and its logits are then compared uncentred, since
    a sigmoid, unlike a softmax, sees a shift.
    """

    num_images: int
    # ||exported - reference|| / ||reference||, each image's logits centred first (single-label).
    relative_error: float
    # The largest relative error allowed (see TOLERANCE); None for int8, which is judged otherwise.
    tolerance: float | None
    max_abs_diff: float
    top1_agreement: float | None = None
    # Top-1 disagreements where the reference's top-2 margin is clear (see FLIP_MARGIN): a real flip, not a tie.
    top1_flips: int | None = None
    preprocess_max_diff: float | None = None
    passed: bool = False
    # Multi-label: the sigmoid threshold, the share of (image, class) decisions that agree, and the clear flips.
    threshold: float | None = None
    decision_agreement: float | None = None
    decision_flips: int | None = None
    # int8 (see judge_quantized): judged by agreement and accuracy on the check images' labels, not by the
    # logit tolerance, which is then reported only. Accuracies are top-1, or per-decision for multi-label.
    min_agreement: float | None = None
    max_accuracy_drop: float | None = None
    accuracy: float | None = None
    reference_accuracy: float | None = None

    @property
    def accuracy_drop(self) -> float | None:
        """How much accuracy the export lost against the checkpoint on the check images (int8 only)."""
        return None if self.accuracy is None else self.reference_accuracy - self.accuracy

    def __str__(self) -> str:
        prep = "" if self.preprocess_max_diff is None else f", preprocess.json vs eval transform max diff " \
                                                          f"{self.preprocess_max_diff:.2e}"
        if self.threshold is None:
            agreement = f"top-1 agreement {self.top1_agreement:.1%}"
            flips = self.top1_flips
        else:
            agreement = f"decision agreement at threshold {self.threshold:g} {self.decision_agreement:.1%}"
            flips = self.decision_flips
        if flips is not None:
            agreement += f", {flips} clear flip(s)"
        if self.min_agreement is None:
            error = f"relative logit error {self.relative_error:.2e} (tolerance {self.tolerance:.2e}"
        else:
            error = f"relative logit error {self.relative_error:.2e} (reported, not judged"
            agreement += (f" (at least {self.min_agreement:.0%}), accuracy {self.accuracy:.1%} vs "
                          f"{self.reference_accuracy:.1%} (drop at most {self.max_accuracy_drop:.1%})")
        return (f"parity on {self.num_images} images: {error}, max |diff| {self.max_abs_diff:.2e}), {agreement}"
                f"{prep} -> {'PASS' if self.passed else 'FAIL'}")


@dataclass
class ExportResult:
    """What :func:`export_checkpoint` wrote and how it was verified."""

    out_dir: Path
    format: str
    files: list[Path]
    parity: ParityReport | None = None
    labels: list[str] = field(default_factory=list)
    # format=onnx: model.onnx in onnxruntime against the same reference logits (included in ``passed``).
    onnx_parity: ParityReport | None = None
    precision: str = "fp32"
    # precision=int8: the calibration images used and the algorithm.
    calibration: list[str] = field(default_factory=list)
    quant_algo: str | None = None
    # precision=int8: whether each runtime's model was quantized with a reduced range ({"paddle": ..., "onnx": ...}).
    quant_reduce_range: dict[str, bool] | None = None

    @property
    def passed(self) -> bool:
        """True when the parity check ran and passed."""
        return self.parity is not None and self.parity.passed


def parse_batch(batch: None | int | str) -> int | None:
    """``None``/``"dynamic"`` -> None, a positive integer (or its string) -> that int."""
    if batch is None or batch == "dynamic":
        return None
    try:
        value = int(batch)
    except (TypeError, ValueError):
        value = 0
    if value < 1 or str(batch).strip() != str(value):
        raise UserError(f"batch={batch!r} must be 'dynamic' or a positive integer")
    return value


def _require_runnable_precision(precision: str) -> None:
    """The export's parity check runs the exported precision, so it must run on this machine."""
    check_field(ExportConfig, "precision", precision)
    if precision == "fp16" and not (paddle.device.is_compiled_with_cuda() and paddle.device.cuda.device_count()):
        raise UserError(
            "precision=fp16: Paddle Inference runs fp16 only on a GPU, and this Paddle "
            f"({paddle.__version__}) has none, so an fp16 model could be neither run nor verified here. Export "
            "precision=fp32 here and load it on the GPU machine with Predictor(..., precision='fp16'), or run "
            "this export there")
    if precision in ("bf16", "int8"):
        check_precision_runs_on(precision, "cpu")


def export_model(model: paddle.nn.Layer, out_dir: str | Path, input_size: tuple[int, int, int] = (3, 224, 224),
                 batch: int | None = None, precision: str = "fp32", preprocessing: dict | None = None,
                 labels: list[str] | None = None, multilabel_threshold: float | None = None,
                 calibration: np.ndarray | None = None, quant_algo: str = DEFAULT_QUANT_ALGO,
                 quant_keep_ends: bool = True, quant_reduce_range: bool | None = None,
                 quant_bias_correction: bool = True, weights: dict | None = None) -> Path:
    """Trace ``model`` in eval mode and save it for Paddle Inference, plus ``preprocess.json``.

    Args:
        model: any Layer taking an NCHW float32 batch.
        out_dir: created if needed; receives ``model.json`` (Paddle >= 3, PIR) or ``model.pdmodel`` (older),
            ``model.pdiparams`` and ``preprocess.json``.
        input_size: (channels, height, width) of one input.
        batch: ``None`` for a dynamic batch dimension, or a fixed batch size.
        precision: ``fp32``; ``fp16`` or ``bf16``, recorded so the Predictor runs the graph in that precision
            by default (the saved weights stay fp32): fp16 on a GPU, bf16 on a CPU through oneDNN. Each needs
            hardware that runs it, where it can be verified. ``int8``: the graph is quantized
            (:func:`paddletrain.deploy.quantize.quantize_paddle`, saved as ``model.pdmodel``) on ``calibration``.
        preprocessing: eval preprocessing as from ``paddletrain.data.preprocessing_info``; without it the
            export holds the model only and ``paddletrain.predict`` cannot decode images for it.
        labels: class names in output order.
        multilabel_threshold: a multi-label (sigmoid) model's decision threshold, recorded as ``"multilabel":
            true`` and ``"threshold"`` so ``paddletrain.predict`` decodes its outputs without being told.
        calibration: ``precision="int8"`` only: preprocessed float32 NCHW calibration inputs.
        quant_algo, quant_keep_ends, quant_reduce_range: ``precision="int8"`` only: the calibration algorithm,
            whether the first convolution and the classifier stay fp32, and whether activations are quantized
            into 7 bits so CPUs without VNNI cannot saturate (``None``: Paddle's default,
            :func:`paddletrain.deploy.quantize.reduce_range_for`); recorded in ``preprocess.json``'s ``"quantization"``.
        quant_bias_correction: ``precision="int8"`` only: correct the output means of layers whose weights are
            rounded to int8 (:mod:`paddletrain.deploy.bias_correction`); recorded there as ``"bias_correction"``.
        weights: which of a checkpoint's weights ``model`` holds (:class:`paddletrain.rebuild.CheckpointWeights`'s
            record), written into ``preprocess.json`` beside ``"tta": null`` (an export runs one view).

    Returns:
        ``out_dir`` as a Path.
    """
    _require_runnable_precision(precision)
    if (precision == "int8") != (calibration is not None):
        raise UserError("calibration inputs are needed for precision=int8, and only for it")
    if len(input_size) != 3 or any(int(v) < 1 for v in input_size):
        raise UserError(f"input_size={tuple(input_size)} must be (channels, height, width)")
    if preprocessing is not None and list(preprocessing.get("input_size", input_size)) != list(input_size):
        raise UserError(f"preprocessing input_size {preprocessing['input_size']} differs from input_size "
                        f"{list(input_size)}")
    if getattr(model, "data_format", "NCHW") != "NCHW":
        log.warning("export_model: a %s model runs in Paddle Inference only without oneDNN "
                    "(Predictor(use_mkldnn=False)); export_checkpoint exports its NCHW twin instead",
                    model.data_format)
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    for name in GRAPH_FILES:  # a graph left by an earlier export of the other format would be found first
        (out / name).unlink(missing_ok=True)
    was_training = model.training
    model.eval()
    try:
        spec = paddle.static.InputSpec([batch, *map(int, input_size)], "float32", INPUT_NAME)
        if precision == "int8":
            with stdout_to_stderr():  # stdout carries the export's JSON summary
                quantize_paddle(model, out, spec, calibration, quant_algo, quant_keep_ends, batch,
                                reduce_range_for("paddle", quant_reduce_range), quant_bias_correction)
        else:
            static = paddle.jit.to_static(model, input_spec=[spec], full_graph=True)
            paddle.jit.save(static, str(out / MODEL_PREFIX))
    finally:
        model.train(was_training)
    meta = {
        "format_version": PREPROCESS_FORMAT_VERSION,
        "input_name": INPUT_NAME,
        "input_size": [int(v) for v in input_size],
        "batch": batch,
        "precision": precision,
        **(preprocessing or {}),
        "labels": list(labels) if labels is not None else None,
        "paddle_version": paddle.__version__,
    }
    if weights is not None:  # which of a checkpoint's weights (paddletrain.rebuild.CheckpointWeights.record); no TTA
        meta.update(weights, tta=None)
    if precision == "int8":  # the Predictor reads keep_ends (paddletrain.deploy.predictor.int8_op_types)
        meta["quantization"] = {"algo": quant_algo, "keep_ends": bool(quant_keep_ends),
                                "reduce_range": reduce_range_for("paddle", quant_reduce_range),
                                "bias_correction": bool(quant_bias_correction)}
    if multilabel_threshold is not None:  # single-label exports stay as they were: readers default to softmax
        meta.update(multilabel=True, threshold=float(multilabel_threshold))
    (out / PREPROCESS_FILE).write_text(json.dumps(meta, indent=2) + "\n", encoding="utf-8")
    return out


def compare_logits(exported: np.ndarray, reference: np.ndarray, tolerance: float,
                   threshold: float | None = None) -> ParityReport:
    """Judge ``exported`` logits against ``reference`` ones (both ``[images, classes]``).

    Passes when the relative RMS error of the centred logits is at most ``tolerance`` and no image whose
    reference top-1 is clear (top-2 margin above ``FLIP_MARGIN`` tolerated per-logit errors) changes its top-1.
    A multi-label model (``threshold``: its sigmoid threshold) is judged by :func:`compare_multilabel_logits`.
    """
    if threshold is not None:
        return compare_multilabel_logits(exported, reference, tolerance, threshold)
    exported = np.asarray(exported, np.float64)
    reference = np.asarray(reference, np.float64)
    centred = reference - reference.mean(axis=1, keepdims=True)
    error = exported - reference
    error -= error.mean(axis=1, keepdims=True)
    # Logits that are all (nearly) equal have no scale of their own: measure against an RMS of 1e-6 then.
    relative = float(np.linalg.norm(error) / max(float(np.linalg.norm(centred)), 1e-6 * np.sqrt(error.size)))
    agree = exported.argmax(1) == reference.argmax(1)
    if reference.shape[1] > 1:
        top2 = np.sort(reference, axis=1)[:, -2:]
        allowed_per_logit = tolerance * np.sqrt((centred ** 2).mean(axis=1))
        clear = top2[:, 1] - top2[:, 0] > FLIP_MARGIN * allowed_per_logit
    else:
        clear = np.zeros(len(reference), bool)
    flips = int(np.sum(~agree & clear))
    return ParityReport(num_images=len(reference), relative_error=relative, tolerance=tolerance,
                        max_abs_diff=float(np.abs(exported - reference).max()), top1_agreement=float(agree.mean()),
                        top1_flips=flips, passed=bool(relative <= tolerance and flips == 0))


def compare_multilabel_logits(exported: np.ndarray, reference: np.ndarray, tolerance: float,
                              threshold: float) -> ParityReport:
    """Judge a multi-label model's ``exported`` logits against ``reference`` ones (both ``[images, classes]``).

    Passes when the relative RMS error of the logits (not centred: a sigmoid sees a shift) is at most
    ``tolerance`` and no clear decision changes: an (image, class) whose reference logit is more than
    ``FLIP_MARGIN / 2`` tolerated per-logit errors away from the threshold's logit must land on the same side.
    """
    exported = np.asarray(exported, np.float64)
    reference = np.asarray(reference, np.float64)
    error = exported - reference
    relative = float(np.linalg.norm(error) / max(float(np.linalg.norm(reference)), 1e-6 * np.sqrt(error.size)))
    boundary = np.log(threshold / (1.0 - threshold))  # sigmoid(logit) > threshold  <=>  logit > boundary
    agree = (exported > boundary) == (reference > boundary)
    allowed_per_logit = tolerance * np.sqrt((reference ** 2).mean(axis=1, keepdims=True))
    clear = np.abs(reference - boundary) > FLIP_MARGIN / 2 * allowed_per_logit
    flips = int(np.sum(~agree & clear))
    return ParityReport(num_images=len(reference), relative_error=relative, tolerance=tolerance,
                        max_abs_diff=float(np.abs(error).max()), threshold=float(threshold),
                        decision_agreement=float(agree.mean()), decision_flips=flips,
                        passed=bool(relative <= tolerance and flips == 0))


def judge_quantized(exported: np.ndarray, reference: np.ndarray, labels: np.ndarray, min_agreement: float,
                    max_accuracy_drop: float, threshold: float | None = None) -> ParityReport:
    """Judge an int8 export's logits by what int8 changes, not by a logit tolerance.

    Passes when the top-1 agreement with ``reference`` (multi-label, ``threshold`` set: the per-class decision
    agreement) is at least ``min_agreement`` and the accuracy against ``labels`` (class indices, or multi-hot
    rows) drops by at most ``max_accuracy_drop`` from the reference's. The logit error is reported only.
    """
    report = compare_logits(exported, reference, float("inf"), threshold)
    labels = np.asarray(labels)
    if threshold is None:
        agreement = report.top1_agreement
        accuracy, reference_accuracy = (float(np.mean(np.argmax(logits, 1) == labels))
                                        for logits in (exported, reference))
    else:
        agreement = report.decision_agreement
        boundary = np.log(threshold / (1.0 - threshold))
        accuracy, reference_accuracy = (float(np.mean((np.asarray(logits) > boundary) == (labels > 0)))
                                        for logits in (exported, reference))
    report.tolerance = None
    report.top1_flips = report.decision_flips = None  # a flip is judged against a logit tolerance: none here
    report.min_agreement, report.max_accuracy_drop = float(min_agreement), float(max_accuracy_drop)
    report.accuracy, report.reference_accuracy = accuracy, reference_accuracy
    # The small slack absorbs float rounding of the difference of two fractions of the same image count.
    report.passed = bool(agreement >= min_agreement and reference_accuracy - accuracy <= max_accuracy_drop + 1e-9)
    return report


def reference_logits(model: paddle.nn.Layer, inputs: np.ndarray) -> np.ndarray:
    """``model``'s logits in eval mode, without autograd."""
    model.eval()
    with paddle.no_grad():
        return model(paddle.to_tensor(inputs)).numpy().astype(np.float32)


def check_parity(predictor: Predictor, model: paddle.nn.Layer, inputs: np.ndarray, tolerance: float,
                 threshold: float | None = None) -> ParityReport:
    """Compare the exported model (``predictor``) with ``model`` in eval mode on ``inputs`` (NCHW float32);
    ``threshold`` for a multi-label model (see :func:`compare_logits`)."""
    return compare_logits(predictor.predict(inputs), reference_logits(model, inputs), tolerance, threshold)


def export_onnx(model_dir: str | Path, opset: int = ONNX_OPSET) -> Path:
    """Convert an export directory's Paddle model to ``model.onnx`` with paddle2onnx (the ``onnx`` extra).

    Nothing is installed on the way (see :func:`no_install_options`).
    """
    paddle2onnx = require_paddle2onnx()

    model_dir = Path(model_dir)
    target = model_dir / ONNX_FILE
    try:
        with stdout_to_stderr():
            paddle2onnx.export(model_filename=str(find_graph_file(model_dir)),
                               params_filename=str(model_dir / PARAMS_FILE), save_file=str(target),
                               opset_version=opset, enable_onnx_checker=True,
                               **no_install_options(paddle2onnx.export))
    except Exception as exc:  # paddle2onnx reports unsupported ops with assorted exception types
        raise UserError(f"paddle2onnx {getattr(paddle2onnx, '__version__', '?')} could not convert "
                        f"{model_dir}: {exc}") from exc
    if not target.is_file():
        raise UserError(f"paddle2onnx finished without writing {target}")
    return target


def no_install_options(export: Any) -> dict[str, Any]:
    """paddle2onnx options that keep an export from installing packages.

    From 1.3 on, paddle2onnx folds constants with polygraphy by default (``optimize_tool="polygraphy"``) after
    setting ``POLYGRAPHY_AUTOINSTALL_DEPS=1``, so polygraphy runs ``pip install onnx_graphsurgeon`` from
    NVIDIA's index whenever it lacks it. Any other value writes the converted graph as it is (paddle2onnx's own
    C++ optimizer, ``enable_optimize``, still runs and installs nothing). Older versions have neither the
    option nor the step.
    """
    return {"optimize_tool": "None"} if "optimize_tool" in inspect.signature(export).parameters else {}


def require_paddle2onnx() -> Any:
    """The paddle2onnx module, or a UserError naming the extra that installs it."""
    try:
        import paddle2onnx  # optional dependency (the onnx extra)
    except ImportError:
        raise UserError("format=onnx needs paddle2onnx, which is not installed: "
                        "pip install paddletrain[onnx]  (or: pip install paddle2onnx)") from None
    return paddle2onnx


def onnx_parity(onnx_file: Path, inputs: np.ndarray, reference: np.ndarray, tolerance: float,
                cpu_threads: int | None = None, threshold: float | None = None) -> ParityReport:
    """Run ``onnx_file`` in onnxruntime (as ``paddletrain.predict`` does) and compare with the reference logits."""
    return compare_logits(onnx_logits(onnx_file, inputs, cpu_threads), reference, tolerance, threshold)


def onnx_logits(onnx_file: Path, inputs: np.ndarray, cpu_threads: int | None = None) -> np.ndarray:
    """``onnx_file``'s logits on ``inputs`` in onnxruntime, as ``paddletrain.predict`` runs it."""
    try:
        predictor = OnnxPredictor(onnx_file, device="cpu", cpu_threads=cpu_threads)
    except UserError as exc:
        if "not installed" not in str(exc):
            raise
        raise UserError("the ONNX parity check needs onnxruntime: pip install onnxruntime, or pass check=false "
                        "to skip it (the Paddle model is still verified)") from None
    return predictor.predict(inputs)


def _check_images(splits: Any, eval_transform: Any, preprocessing: Preprocessing,
                  count: int) -> tuple[np.ndarray, float]:
    """``count`` validation images spread over the split, through the eval transform, plus how far the
    exported preprocessing is from it on the same raw images."""
    val = splits.val
    if len(val) == 0:
        raise UserError("the checkpoint's validation split is empty: no images for the parity check "
                        "(pass check=false to skip it)")
    raws = [val.load_image(i) for i in _spread(len(val), count)]
    inputs = np.stack([eval_transform(raw) for raw in raws])
    exported = np.stack([preprocessing(raw) for raw in raws])
    return inputs, float(np.abs(inputs - exported).max())


def _spread(total: int, count: int) -> list[int]:
    """Up to ``count`` indices spread evenly over ``range(total)`` (every class of a class-sorted split)."""
    return [int(i) for i in np.unique(np.linspace(0, total - 1, min(count, total)).round().astype(int))]


def _check_labels(splits: Any, count: int) -> np.ndarray:
    """The labels (class indices, or multi-hot rows) of the images :func:`_check_images` picks."""
    return np.asarray([splits.val.targets[i] for i in _spread(len(splits.val), count)])


def export_checkpoint(checkpoint_dir: str | Path, out_dir: str | Path, format: str = "paddle",
                      batch: None | int | str = None, precision: str = "fp32", check: bool = True,
                      num_check_images: int = 16, data_root: str | None = None, device: str = "auto",
                      cpu_threads: int | None = None, imports: Sequence[str] = (),
                      calibration: str | Path | None = None, calibration_images: int = DEFAULT_CALIBRATION_IMAGES,
                      quant_algo: str = DEFAULT_QUANT_ALGO, quant_keep_ends: bool = True,
                      quant_reduce_range: bool | None = None, quant_bias_correction: bool = True,
                      quant_min_agreement: float = QUANT_MIN_AGREEMENT,
                      quant_max_accuracy_drop: float = QUANT_MAX_ACCURACY_DROP, weights: str = "auto") -> ExportResult:
    """Rebuild the model of a training checkpoint, export it, and (``check=True``) verify the export.

    ``checkpoint_dir`` is a checkpoint directory, or a run directory with ``:best``/``:last``
    (:func:`~paddletrain.checkpoint.locate.locate_checkpoint`). The dataset of the checkpoint's config is opened
    for the class names, the channel count and the validation images of the parity check (``data_root`` points
    at it if it moved). The modules the checkpoint's config names in ``imports`` are imported, plus ``imports``.
    ``format="onnx"`` also writes ``model.onnx`` (verified in onnxruntime when ``check``, ``result.onnx_parity``).
    The parity result is in ``result.parity``; this function does not raise when parity fails, the CLI turns that
    into exit status 3.

    ``precision="int8"`` quantizes after calibrating on ``calibration_images`` images of ``calibration`` (a
    folder, a list file or a glob; ``None``: the checkpoint's training split) with ``quant_algo``; with
    ``format="onnx"``, ``model.onnx`` is quantized by onnxruntime on the same images; ``quant_reduce_range``
    quantizes for CPUs without VNNI (7-bit activations in Paddle, 7-bit weights in onnxruntime; ``None``: each
    runtime's measured default, :func:`paddletrain.deploy.quantize.reduce_range_for`); ``quant_bias_correction``
    corrects the Paddle model for its int8 weight rounding (:mod:`paddletrain.deploy.bias_correction`). Its parity
    is judged by agreement and accuracy drop (``quant_min_agreement``, ``quant_max_accuracy_drop``;
    :func:`judge_quantized`). ``weights``: which of the checkpoint's weights (``"auto"``: the averaged ones when
    its run validated with them; :func:`paddletrain.rebuild.checkpoint_weights`), recorded in ``preprocess.json``.
    """
    for key, value in (("format", format), ("num_check_images", num_check_images), ("device", device),
                       ("cpu_threads", cpu_threads), ("calibration_images", calibration_images),
                       ("quant_algo", quant_algo), ("quant_min_agreement", quant_min_agreement),
                       ("quant_max_accuracy_drop", quant_max_accuracy_drop), ("weights", weights)):
        check_field(ExportConfig, key, value)
    fixed_batch = parse_batch(batch)
    _require_runnable_precision(precision)
    quantized = precision == "int8"
    if calibration is not None and not quantized:
        raise UserError(f"calibration={str(calibration)!r} is for precision=int8 (precision is {precision})")
    # Everything that can be checked without the model is checked before the slow part.
    if format == "onnx":
        require_paddle2onnx()
        if quantized:
            require_onnx_quantization()
            check_onnx_algo(quant_algo)
    files = calibration_files(calibration) if quantized and calibration is not None else None
    set_cpu_threads(cpu_threads)
    rebuilt = rebuild_checkpoint(checkpoint_dir, data_root, imports, weights)
    labels = list(rebuilt.splits.classes)
    calibration_set = (_calibration_set(rebuilt, files, calibration, calibration_images) if quantized
                       else _CalibrationSet())
    out = export_model(rebuilt.exportable, out_dir, input_size=tuple(rebuilt.preprocessing["input_size"]),
                       batch=fixed_batch, precision=precision, preprocessing=rebuilt.preprocessing, labels=labels,
                       multilabel_threshold=rebuilt.multilabel_threshold, calibration=calibration_set.inputs,
                       quant_algo=quant_algo, quant_keep_ends=quant_keep_ends, quant_reduce_range=quant_reduce_range,
                       quant_bias_correction=quant_bias_correction, weights=rebuilt.weights)
    files_written = sorted(p for p in out.iterdir() if p.name.startswith(MODEL_PREFIX) or p.name == PREPROCESS_FILE)
    result = ExportResult(out_dir=out, format=format, files=files_written, labels=labels, precision=precision,
                          calibration=calibration_set.names, quant_algo=quant_algo if quantized else None,
                          quant_reduce_range={"paddle": reduce_range_for("paddle", quant_reduce_range)}
                          if quantized else None)

    def judge(exported: np.ndarray, tolerance: float) -> ParityReport:
        if quantized:
            return judge_quantized(exported, reference, _check_labels(rebuilt.splits, num_check_images),
                                   quant_min_agreement, quant_max_accuracy_drop, rebuilt.multilabel_threshold)
        return compare_logits(exported, reference, tolerance, rebuilt.multilabel_threshold)

    if check:
        # bf16 and int8 are CPU precisions: verify them there even on a machine with a GPU.
        predictor = Predictor(out, device="cpu" if precision in ("bf16", "int8") else device,
                              cpu_threads=cpu_threads, precision=precision)
        inputs, prep_diff = _check_images(rebuilt.splits, rebuilt.eval_transform, predictor.preprocessing,
                                          num_check_images)
        reference = reference_logits(rebuilt.model, inputs)
        result.parity = judge(predictor.predict(inputs), TOLERANCE.get(precision, 0.0))
        result.parity.preprocess_max_diff = prep_diff
        # The exported preprocessing must reproduce the eval transform exactly: same PIL ops, same order.
        result.parity.passed = result.parity.passed and prep_diff <= 1e-6
    else:
        log.warning("check=false: the exported model was NOT compared with the checkpoint's model")
    if format == "onnx":
        if quantized:
            onnx_reduce_range = reduce_range_for("onnx", quant_reduce_range)
            onnx_file = _export_quantized_onnx(rebuilt, out, fixed_batch, calibration_set.inputs, quant_algo,
                                               quant_keep_ends, onnx_reduce_range)
            result.quant_reduce_range["onnx"] = onnx_reduce_range
        else:
            onnx_file = export_onnx(out)
        result.files.append(onnx_file)
        if check and result.passed:
            result.onnx_parity = judge(onnx_logits(onnx_file, inputs, cpu_threads), TOLERANCE["fp32"])
            (log.info if result.onnx_parity.passed else log.error)("ONNX %s", result.onnx_parity)
            result.parity.passed = result.onnx_parity.passed
    return result


@dataclass
class _CalibrationSet:
    """The preprocessed calibration inputs (float32 NCHW) and where they came from, for the report."""

    inputs: np.ndarray | None = None
    names: list[str] = field(default_factory=list)


def _calibration_set(rebuilt: RebuiltCheckpoint, files: list[str] | None, spec: str | Path | None,
                     count: int) -> _CalibrationSet:
    """``count`` calibration images, preprocessed as the export's ``preprocess.json`` says.

    From ``files`` (what ``calibration=`` named, checked against the model's input before anything is decoded)
    or, without them, from the checkpoint's training split, whose images the model was trained on.
    """
    preprocessing = Preprocessing(rebuilt.preprocessing)
    if files is not None:
        chosen = choose_calibration_files(files, count)
        check_calibration_files(chosen, rebuilt.preprocessing["input_size"], spec)
        inputs, names = calibration_inputs(chosen, preprocessing), chosen
    else:
        train = rebuilt.splits.train
        if len(train) == 0:
            raise UserError("the checkpoint's training split is empty: pass calibration=<folder or list file>")
        picks = _spread(len(train), count)
        inputs = np.stack([preprocessing(train.load_image(i)) for i in picks]).astype(np.float32, copy=False)
        names = [train.describe(i) for i in picks]
    log.info("int8: calibrating on %d image(s)%s", len(names), f" from {spec}" if spec else
             " of the checkpoint's training split")
    return _CalibrationSet(inputs, names)


def _export_quantized_onnx(rebuilt: RebuiltCheckpoint, out: Path, batch: int | None, inputs: np.ndarray, algo: str,
                           keep_ends: bool, reduce_range: bool) -> Path:
    """``out/model.onnx`` quantized by onnxruntime from an fp32 ONNX conversion of the same model; its
    ``reduce_range`` is added to ``preprocess.json``'s ``"quantization"`` as ``onnx_reduce_range``."""
    meta = read_metadata(out)
    meta["quantization"]["onnx_reduce_range"] = reduce_range
    (out / PREPROCESS_FILE).write_text(json.dumps(meta, indent=2) + "\n", encoding="utf-8")
    with tempfile.TemporaryDirectory(prefix="paddletrain-onnx-fp32-") as tmp:
        fp32_dir = export_model(rebuilt.exportable, tmp, input_size=tuple(rebuilt.preprocessing["input_size"]),
                                batch=batch, preprocessing=rebuilt.preprocessing)
        fp32_onnx = export_onnx(fp32_dir)
        with stdout_to_stderr():  # onnxruntime's calibration prints its progress
            return quantize_onnx(fp32_onnx, out / ONNX_FILE, inputs, algo, keep_ends, batch,
                                 reduce_range=reduce_range)
