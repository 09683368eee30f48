"""int8 post-training quantization, next to export: calibration images, Paddle Inference int8, ONNX int8.

Three steps, each its own function, composed by :func:`paddletrain.deploy.exporter.export_checkpoint`:

1. :func:`calibration_files` and :func:`check_calibration_files`: the calibration source (a folder of images, a
   list file or a glob, read as ``paddletrain.predict`` reads its ``input=``) must name readable images of the
   model's kind (channel count, not far smaller than its input) before any slow work starts.
   :func:`calibration_inputs` then decodes them through the export's own ``preprocess.json`` pipeline.
2. :func:`quantize_paddle`: Paddle's static post-training quantization
   (``paddle.static.quantization.PostTrainingQuantization``) on the model saved in the older ProgramDesc format
   (the only one it reads in Paddle 3.3: on a PIR ``model.json`` it stops on an assertion that the program is
   a ``Program``). The int8 program runs in Paddle Inference on oneDNN's int8 kernels
   (:class:`paddletrain.deploy.predictor.Predictor` with ``precision="int8"``).
3. :func:`quantize_onnx`: onnxruntime's static quantization of an fp32 ``model.onnx`` (the ``onnx`` extra).

The first convolution (3 input channels: little work, and it sees raw pixels) and the classifier (it writes
the logits) stay fp32 by default (``keep_ends``; Paddle Inference needs the Predictor's help for the classifier,
``paddletrain.deploy.predictor.int8_op_types``): see docs/inference.md ("int8") for the measurement. Before tracing, the
model's batch norms absorb the output shift its int8 weight rounding causes (``paddletrain.deploy.bias_correction``).
``reduce_range`` quantizes for CPUs without VNNI (``REDUCED_ACTIVATION_WIDENING``, ``REDUCE_RANGE_BY_RUNTIME``).
"""
from __future__ import annotations

import logging
import tempfile
from collections.abc import Iterator, Sequence
from contextlib import contextmanager, nullcontext
from pathlib import Path
from typing import Any

import numpy as np

from paddletrain.deploy.bias_correction import weight_rounding_corrected
from paddletrain.deploy.inputs import resolve_inputs
from paddletrain.errors import UserError

log = logging.getLogger("paddletrain")

# Paddle's calibration algorithms offered here (PostTrainingQuantization also has emd, min_max and ptf).
QUANT_ALGOS = ("KL", "hist", "mse", "avg", "abs_max")
# onnxruntime calibrates with its own methods; these are the counterparts of Paddle's (mse and avg have none).
ONNX_CALIBRATION = {"abs_max": "MinMax", "KL": "Entropy", "hist": "Percentile"}
# onnxruntime's two int8 graph forms; QDQ measured faster on an AVX2 CPU (docs/inference.md, "int8").
ONNX_QUANT_FORMAT = "QDQ"
# Paddle's hist keeps the 99.999th percentile of |activation|; onnxruntime's Percentile gets the same.
HIST_PERCENT = 0.99999
CALIBRATION_BATCH = 8
# An image this many times smaller than the model's input side would be upscaled into a blur unlike anything
# the model was trained on: a calibration folder of CIFAR thumbnails for a 224 px model, say.
MAX_UPSCALE = 2.0
# quant_reduce_range: on x86 CPUs without VNNI (AVX2, AVX-512 without VNNI) oneDNN's u8 x s8 int8 convolution
# multiplies with vpmaddubsw, which adds each pair of u8 activation x s8 weight products into an int16 with
# saturation: 2 * 255 * 127 > 32767, so large products are clipped (oneDNN's "Nuances of int8 computations").
# onnxruntime's reduce_range quantizes weights into 7 bits for this. Paddle Inference cannot be given 7-bit
# weights: its oneDNN passes dequantize the saved int8 weights and quantize them again from their per-channel
# absolute maximum into [-127, 127]. So the Paddle export narrows the other factor: every activation's calibrated
# range is widened by 255 / 127, so an unsigned activation's int8 code is at most 127 and 2 * 127 * 127 = 32258
# fits in int16. The cost is one bit of activation resolution; measured in docs/inference.md ("int8").
REDUCED_ACTIVATION_WIDENING = 255 / 127
# quant_reduce_range=null picks per runtime, by measurement on the AVX2-only CPU (docs/inference.md, "int8"):
# - Paddle: off. Its loss came mostly from the classifier running in int8 (paddletrain.deploy.predictor.
#   INT8_FP32_OP_TYPES_WITH_ENDS_KEPT); with that fixed, 7-bit activation codes moved the Fashion-MNIST resnet20
#   from +0.35 to +0.01 points (97.8% -> 98.2% agreement) but the ants/bees shufflenet from -0.65 to -1.96
#   (99.3% -> 96.7%): one bit of activation resolution cost more than the saturation it prevents.
# - onnxruntime: on. 7-bit weights raised the ants/bees shufflenet's top-1 agreement from 90-94% to 97-99% at
#   64, 128 and 200 calibration photos, and cost the resnet20 about a point of it (96.4% -> 95.2%, +0.98 ->
#   +0.22 points of top-1).
REDUCE_RANGE_BY_RUNTIME = {"paddle": False, "onnx": True}
# Ops whose weights Paddle quantizes; the first and last of them in the program are the ends kept fp32.
_WEIGHT_OPS = ("conv2d", "depthwise_conv2d", "mul", "matmul", "matmul_v2")
_LEGACY_GRAPH = "model.pdmodel"
_PARAMS = "model.pdiparams"


def reduce_range_for(runtime: str, requested: bool | None) -> bool:
    """Whether ``runtime`` (``paddle`` or ``onnx``) quantizes with a reduced range: ``requested``, or when it is
    ``None`` the runtime's measured default (``REDUCE_RANGE_BY_RUNTIME``)."""
    return REDUCE_RANGE_BY_RUNTIME[runtime] if requested is None else bool(requested)


def calibration_files(spec: str | Path) -> list[str]:
    """The image files a ``calibration=`` value names: a folder (recursive), a list file or a glob.

    A list file holds one path a line, relative to the list's folder; a label column after the path (a
    PaddleClas ``path label`` list) is ignored, so a training list works as it is.
    """
    spec = str(spec)
    if not Path(spec).exists() and not any(c in spec for c in "*?["):
        raise UserError(f"calibration={spec!r} does not exist; pass a folder of images or a list file")
    try:
        files = resolve_inputs(spec)
    except UserError as exc:
        raise UserError(f"calibration: {exc}") from None
    return [_strip_label(path) for path in files]


def _strip_label(path: str) -> str:
    """``path`` itself when it exists, else ``path`` without a trailing ``<space|tab><label>`` column."""
    if Path(path).exists():
        return path
    for separator in ("\t", " "):
        head, _, tail = path.rpartition(separator)
        if head and tail.replace(",", "").isdigit():
            return head
    return path


def choose_calibration_files(files: Sequence[str], count: int) -> list[str]:
    """``count`` files spread evenly over the sorted list (every class of a class-sorted folder), or all."""
    ordered = sorted(files)
    if len(ordered) <= count:
        return ordered
    picks = np.unique(np.linspace(0, len(ordered) - 1, count).round().astype(int))
    return [ordered[i] for i in picks]


def check_calibration_files(files: Sequence[str], input_size: Sequence[int], spec: str | Path) -> None:
    """Refuse calibration images the model cannot be calibrated on, reading only their headers.

    Each must be a readable image with the model's channel count (grey for a 1-channel model, colour for a
    3-channel one) whose shorter side is at least ``1 / MAX_UPSCALE`` of the model's input side.
    """
    from PIL import Image

    channels, height, width = (int(v) for v in input_size)
    smallest = min(height, width) / MAX_UPSCALE
    for path in files:
        try:
            with Image.open(path) as image:
                mode, size = image.mode, image.size
        except Exception as exc:  # PIL raises many types for files that are not images
            raise UserError(f"calibration={str(spec)!r}: {path} is not a readable image ({type(exc).__name__}: "
                            f"{exc})") from None
        image_channels = 1 if mode in ("1", "L", "LA", "I", "F") or mode.startswith("I;16") else 3
        if image_channels != channels:
            kind = "grey" if image_channels == 1 else "colour"
            raise UserError(f"calibration={str(spec)!r}: {path} is a {kind} image ({mode}) but the model takes "
                            f"{channels} channel(s); calibrate with images like those it was trained on")
        if min(size) < smallest:
            raise UserError(f"calibration={str(spec)!r}: {path} is {size[0]}x{size[1]}, more than {MAX_UPSCALE:g}x "
                            f"smaller than the model's {width}x{height} input; calibrate with images like those it "
                            f"was trained on")


def calibration_inputs(files: Sequence[str], preprocessing: Any) -> np.ndarray:
    """The files decoded and preprocessed (``preprocessing``: the export's :class:`~paddletrain.deploy.predictor.
    Preprocessing`) into one float32 NCHW array."""
    from paddletrain.data.formats.images import ImageReadError, open_image

    inputs = []
    for path in files:
        try:
            inputs.append(preprocessing(open_image(path)))
        except ImageReadError as exc:
            raise UserError(f"calibration: cannot decode {path}: {exc}") from None
    return np.stack(inputs).astype(np.float32, copy=False)


def _batches(inputs: np.ndarray, batch: int | None, equal: bool = False) -> list[np.ndarray]:
    """Calibration batches; a graph exported with a fixed batch size, or ``equal``, gets batches of one size."""
    size = batch or min(CALIBRATION_BATCH, len(inputs))
    chunks = [inputs[i:i + size] for i in range(0, len(inputs), size)]
    if (batch or equal) and len(chunks[-1]) < size:  # pad the last one by repeating images (zeros skew the ranges)
        chunks[-1] = np.resize(chunks[-1], (size, *inputs.shape[1:])).astype(np.float32)
    return chunks


def quantize_paddle(model: Any, out_dir: str | Path, input_spec: Any, inputs: np.ndarray, algo: str,
                    keep_ends: bool = True, batch: int | None = None, reduce_range: bool = False,
                    bias_correction: bool = True) -> list[Path]:
    """Write ``model`` (a dygraph Layer in eval mode) as a Paddle Inference int8 program to ``out_dir``.

    The model is traced and saved in the ProgramDesc format into a temporary folder, calibrated on ``inputs``
    (float32 NCHW, already preprocessed) with ``algo`` (one of ``QUANT_ALGOS``), and saved as ``model.pdmodel``
    + ``model.pdiparams``. ``keep_ends`` keeps the first and the last weighted op (stem convolution,
    classifier) in fp32. ``reduce_range`` widens every activation's range by ``REDUCED_ACTIVATION_WIDENING`` so
    CPUs without VNNI cannot saturate (see there). With ``bias_correction`` the output-mean shift that rounding
    each layer's weights to int8 causes is moved into the batch norm (or bias) after it before tracing
    (:func:`~paddletrain.deploy.bias_correction.weight_rounding_corrected`; ``model`` is restored afterwards).
    Returns the files written.
    """
    import paddle
    from paddle.pir_utils import OldIrGuard
    from paddle.static.quantization import PostTrainingQuantization

    if algo not in QUANT_ALGOS:
        raise UserError(f"quant_algo={algo!r} is not one of {', '.join(QUANT_ALGOS)}")
    out = Path(out_dir)
    chunks = _batches(inputs, batch)
    corrected = (weight_rounding_corrected(model, inputs, keep_ends, CALIBRATION_BATCH) if bias_correction
                 else nullcontext())
    with corrected, tempfile.TemporaryDirectory(prefix="paddletrain-fp32-") as fp32_dir, OldIrGuard():
        static = paddle.jit.to_static(model, input_spec=[input_spec], full_graph=True)
        paddle.jit.save(static, str(Path(fp32_dir) / "model"))
        paddle.enable_static()
        try:
            executor = paddle.static.Executor(paddle.CPUPlace())
            skip = _end_weights(executor, fp32_dir) if keep_ends else None
            ptq = PostTrainingQuantization(
                executor=executor, model_dir=fp32_dir, model_filename=_LEGACY_GRAPH, params_filename=_PARAMS,
                data_loader=lambda: ({input_spec.name: chunk} for chunk in chunks), batch_nums=len(chunks),
                algo=algo, hist_percent=HIST_PERCENT, onnx_format=True, skip_tensor_list=skip)
            ptq.quantize()
            ptq.save_quantized_model(str(out), model_filename=_LEGACY_GRAPH, params_filename=_PARAMS)
            if reduce_range:
                widen_activation_ranges(out, REDUCED_ACTIVATION_WIDENING)
        finally:
            paddle.disable_static()
    return [out / _LEGACY_GRAPH, out / _PARAMS]


def activation_scales(model_dir: str | Path) -> dict[str, float]:
    """The calibrated range (the largest magnitude kept) of every quantized activation of a saved int8 program.

    Read from the ``Scale`` inputs of its ``quantize_linear``/``dequantize_linear`` ops whose tensor is not a
    weight; Paddle Inference takes each activation's int8 scale from these.
    """
    with saved_program(model_dir) as (program, _, scope):
        return {name: float(np.asarray(scope.find_var(name).get_tensor()).max())
                for name in _activation_scale_names(program)}


def widen_activation_ranges(model_dir: str | Path, factor: float) -> None:
    """Multiply every activation range of the int8 program saved in ``model_dir`` by ``factor``, in place.

    Weights and their scales are left as they are (Paddle Inference requantizes weights itself).
    """
    import paddle

    with saved_program(model_dir) as (program, executor, scope):
        for name in _activation_scale_names(program):
            tensor = scope.find_var(name).get_tensor()
            tensor.set((np.asarray(tensor) * factor).astype(np.float32), paddle.CPUPlace())
        feeds, fetches = _feeds_and_fetches(program)
        paddle.static.save_inference_model(str(Path(model_dir) / Path(_LEGACY_GRAPH).stem), feeds, fetches,
                                           executor, program=program)


def simulated_logits(model_dir: str | Path, inputs: np.ndarray) -> np.ndarray:
    """The outputs of the int8 program saved in ``model_dir`` with its int8 arithmetic simulated in fp32.

    Paddle's static executor runs each ``quantize_linear``/``dequantize_linear`` pair as rounding to the int8
    grid and back, and every other op in fp32: the int8 model as calibrated, without any CPU's int8 kernels.
    Set beside the Predictor's int8 outputs, it tells a loss that calibration causes from one that int8
    execution on this CPU adds (docs/inference.md, "int8"). Inputs go in batches of ``CALIBRATION_BATCH``, or of
    the graph's fixed batch size (the last one padded).
    """
    outputs = []
    with saved_program(model_dir) as (program, executor, _):
        (feed, *_), (fetch, *_) = _feeds_and_fetches(program)
        fixed = feed.shape[0] if feed.shape[0] > 0 else None
        for chunk in _batches(inputs, fixed):
            outputs.append(executor.run(program, feed={feed.name: chunk}, fetch_list=[fetch])[0])
    return np.concatenate(outputs)[:len(inputs)]


def _feeds_and_fetches(program: Any) -> tuple[list[Any], list[Any]]:
    """A loaded inference program's input and output variables, in order (from its feed and fetch ops)."""
    block = program.global_block()
    return ([block.var(op.output("Out")[0]) for op in block.ops if op.type == "feed"],
            [block.var(op.input("X")[0]) for op in block.ops if op.type == "fetch"])


def _activation_scale_names(program: Any) -> list[str]:
    """The ``Scale`` tensors of a program's quantize/dequantize ops on activations, each once (a quantize and its
    dequantize share one)."""
    persistable = {var.name for var in program.list_vars() if var.persistable}
    names = [op.input("Scale")[0] for op in program.global_block().ops
             if op.type in ("quantize_linear", "dequantize_linear") and op.input("X")[0] not in persistable]
    return list(dict.fromkeys(names))


@contextmanager
def saved_program(model_dir: str | Path) -> Iterator[tuple[Any, Any, Any]]:
    """A saved int8 ProgramDesc model loaded in static mode into a scope of its own: (program, executor, scope).

    Raises:
        UserError: ``model_dir`` has no ``model.pdmodel`` + ``model.pdiparams`` (an fp32 export of Paddle 3.3 is
            a PIR ``model.json``; int8 exports are written in the older format).
    """
    import paddle
    from paddle.pir_utils import OldIrGuard

    missing = [name for name in (_LEGACY_GRAPH, _PARAMS) if not (Path(model_dir) / name).is_file()]
    if missing:
        raise UserError(f"{model_dir} has no {' and no '.join(missing)}: not a saved int8 program (export one with "
                        "precision=int8)")
    scope = paddle.static.Scope()
    with OldIrGuard(), paddle.static.scope_guard(scope):
        was_dynamic = paddle.in_dynamic_mode()
        paddle.enable_static()
        try:
            executor = paddle.static.Executor(paddle.CPUPlace())
            program, _, _ = paddle.static.load_inference_model(str(model_dir), executor, model_filename=_LEGACY_GRAPH,
                                                               params_filename=_PARAMS)
            yield program, executor, scope
        finally:
            if was_dynamic:
                paddle.disable_static()


def _end_weights(executor: Any, model_dir: str) -> list[str]:
    """The weight names of the first and the last weighted op of a saved ProgramDesc model."""
    import paddle

    program, _, _ = paddle.static.load_inference_model(model_dir, executor, model_filename=_LEGACY_GRAPH,
                                                       params_filename=_PARAMS)
    persistable = {var.name for var in program.list_vars() if var.persistable}
    weights = [name for op in program.global_block().ops if op.type in _WEIGHT_OPS
               for name in op.input_arg_names if name in persistable]
    return sorted({weights[0], weights[-1]}) if weights else []


def require_onnx_quantization() -> Any:
    """``onnxruntime.quantization``, or a UserError naming the extra that installs it."""
    try:
        from onnxruntime import quantization  # optional dependency (the onnx extra; it needs ml_dtypes)
    except ImportError as exc:
        raise UserError(f"format=onnx precision=int8 needs onnxruntime's quantization tools ({exc}): "
                        "pip install paddletrain[onnx]") from None
    return quantization


def check_onnx_algo(algo: str) -> None:
    """onnxruntime has counterparts of some of Paddle's algorithms only."""
    if algo not in ONNX_CALIBRATION:
        raise UserError(f"quant_algo={algo} has no onnxruntime counterpart; with format=onnx use one of "
                        f"{', '.join(ONNX_CALIBRATION)}")


class _Reader:
    """onnxruntime's CalibrationDataReader protocol over preprocessed batches."""

    def __init__(self, name: str, chunks: list[np.ndarray]) -> None:
        self._feeds = iter([{name: chunk} for chunk in chunks])

    def get_next(self) -> dict[str, np.ndarray] | None:
        return next(self._feeds, None)


def quantize_onnx(fp32_onnx: str | Path, target: str | Path, inputs: np.ndarray, algo: str,
                  keep_ends: bool = True, batch: int | None = None, quant_format: str = ONNX_QUANT_FORMAT,
                  reduce_range: bool = False) -> Path:
    """Quantize the fp32 ``fp32_onnx`` with onnxruntime's static quantization into ``target``.

    Symmetric int8 activations and per-channel int8 weights in ``quant_format`` (``QDQ`` or ``QOperator``;
    see ``ONNX_QUANT_FORMAT``), after onnxruntime's ``quant_pre_process`` (shape inference, graph
    optimisation), calibrated on ``inputs`` with the onnxruntime counterpart of ``algo``. ``reduce_range``:
    onnxruntime's 7-bit weights ([-64, 64]), for CPUs without VNNI (see ``REDUCED_ACTIVATION_WIDENING``).
    """
    import onnx  # installed with onnxruntime's quantization tools (the onnx extra)

    quantization = require_onnx_quantization()
    check_onnx_algo(algo)
    target = Path(target)
    with tempfile.TemporaryDirectory(prefix="paddletrain-onnx-") as tmp:
        prepared = Path(tmp) / "prepared.onnx"
        # onnx shape inference covers a CNN; the symbolic one (for dynamic shapes) would need sympy
        quantization.shape_inference.quant_pre_process(str(fp32_onnx), str(prepared), skip_symbolic_shape=True)
        graph = onnx.load(str(prepared))
        name = graph.graph.input[0].name
        weighted = [node.name for node in graph.graph.node if node.op_type in ("Conv", "Gemm", "MatMul")]
        exclude = sorted({weighted[0], weighted[-1]}) if keep_ends and weighted else None
        extra = {"ActivationSymmetric": True}
        if algo == "hist":
            extra["CalibPercentile"] = 100 * HIST_PERCENT
        quantization.quantize_static(
            # equal: onnxruntime's histogram calibrators stack every batch's outputs into one array
            str(prepared), str(target), _Reader(name, _batches(inputs, batch, equal=True)),
            quant_format=getattr(quantization.QuantFormat, quant_format), per_channel=True,
            activation_type=quantization.QuantType.QInt8, weight_type=quantization.QuantType.QInt8,
            nodes_to_exclude=exclude, calibrate_method=getattr(quantization.CalibrationMethod, ONNX_CALIBRATION[algo]),
            reduce_range=reduce_range, extra_options=extra)
    return target
