"""Run an exported model with Paddle Inference: the :class:`Predictor` API and the exported preprocessing.

An export directory (written by :mod:`paddletrain.export`) holds the graph (``model.json`` with Paddle >= 3's
PIR format, ``model.pdmodel`` with older ones), the weights ``model.pdiparams`` and ``preprocess.json``.

>>> predictor = Predictor("export/")                       # CPU with oneDNN, or the GPU when there is one
>>> image = predictor.preprocessing(PIL.Image.open("cat.jpg"))
>>> logits = predictor.predict(image[None])                 # (1, num_classes)

:class:`OnnxPredictor` runs an export's ``model.onnx`` in onnxruntime the same way; :func:`load_predictor`
chooses between them.
"""
from __future__ import annotations

import json
import logging
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from paddletrain.data.formats.class_names import read_names_file
from paddletrain.deploy.native_output import quiet_pass_statistics
from paddletrain.devices import DEVICES
from paddletrain.errors import UserError

log = logging.getLogger(__name__)

MODEL_PREFIX = "model"
PARAMS_FILE = f"{MODEL_PREFIX}.pdiparams"
# Paddle >= 3 saves the PIR program as JSON; older versions save a protobuf ProgramDesc.
GRAPH_FILES = (f"{MODEL_PREFIX}.json", f"{MODEL_PREFIX}.pdmodel")
ONNX_FILE = f"{MODEL_PREFIX}.onnx"
# Runtimes an export runs in: Paddle Inference (the graph and weights) or onnxruntime (model.onnx).
BACKENDS = ("auto", "paddle", "onnx")
PREPROCESS_FILE = "preprocess.json"
PREPROCESS_FORMAT_VERSION = 1
# fp16 runs on GPUs; bf16 on CPUs through oneDNN (fast with AVX512-BF16 or AMX, emulated and slow without);
# int8 on CPUs through oneDNN, from a graph quantized at export (paddletrain.deploy.quantize), not from an fp32 one.
PRECISIONS = ("fp32", "fp16", "bf16", "int8")
RESIZE_MODES = ("shorter_side", "exact")
# The runtime `backend=auto` picks for an export that has both a Paddle graph and model.onnx, by the precision it
# runs in on a CPU. Measured with `python -m paddletrain.bench inference` (docs/performance.md, "Paddle Inference
# vs onnxruntime"): in fp32, Paddle Inference with oneDNN ran a ResNet-50 at 0.78-0.89 x onnxruntime at 1 and 2
# threads, batch 1 and 8, on an idle AVX2 CPU, with every Predictor setting tried; bf16 runs only in Paddle
# Inference (the ONNX graph is fp32); in int8 Paddle Inference ran 1.2-5.0 x onnxruntime's QDQ graph at batch 8
# and 32 (the resnet20 and the ants/bees shufflenet, `python -m paddletrain.ship`, docs/inference.md); which keeps
# more accuracy depends on the model: ship compares both.
FASTEST_CPU_RUNTIME = {"fp32": "onnx", "bf16": "paddle", "int8": "paddle"}
# What each backend is called in log lines and summaries.
RUNTIME_NAMES = {"paddle": "Paddle Inference", "onnx": "onnxruntime"}
# oneDNN keeps one compiled kernel set per input shape; a bounded cache stops a varying last batch from
# growing memory without limit.
MKLDNN_SHAPE_CACHE = 10
# The op types Paddle Inference 3.3's oneDNN int8 passes can run in int8 (its cpu_quantize_placement_pass). Given
# no list, it runs every op of these types in int8 whose input has a calibrated scale, whether or not the export
# quantized that op.
PADDLE_INT8_OP_TYPES = (
    "concat", "conv2d", "depthwise_conv2d", "fused_conv2d", "fused_conv3d", "fused_matmul", "fused_elementwise_add",
    "fused_elementwise_mul", "fused_elementwise_sub", "elementwise_add", "elementwise_mul", "elementwise_sub", "fc",
    "matmul", "matmul_v2", "nearest_interp", "nearest_interp_v2", "pool2d", "prior_box", "reshape2",
    "fused_transpose", "transpose2", "fusion_gru", "fusion_lstm", "multi_gru", "slice", "split")
# The classifier an int8 export keeps fp32 (``quant_keep_ends``) is a matmul + bias add that Paddle Inference fuses
# into an ``fc`` op after reading which ops the quantization left out, so the mark is lost and the logits were
# computed in int8 (on s8 inputs, 7 bits for a non-negative pooled feature). Leaving ``fc`` out of the int8 op types
# keeps it fp32: Fashion-MNIST resnet20 int8 went from -2.6 to +0.35 points of top-1 (docs/inference.md, "int8").
INT8_FP32_OP_TYPES_WITH_ENDS_KEPT = ("fc",)


def int8_op_types(metadata: dict[str, Any]) -> set[str]:
    """The op types Paddle Inference may run in int8 for an int8 export whose ``preprocess.json`` is ``metadata``.

    Every type oneDNN quantizes, less ``fc`` (the classifier) when the export kept its ends fp32; an export written
    before ``quantization`` was recorded kept them (the default then and now).
    """
    keep_ends = metadata.get("quantization", {}).get("keep_ends", True)
    excluded = set(INT8_FP32_OP_TYPES_WITH_ENDS_KEPT) if keep_ends else set()
    return set(PADDLE_INT8_OP_TYPES) - excluded


def find_graph_file(model_dir: str | Path) -> Path:
    """The graph file of an export directory, whichever format this Paddle version wrote."""
    model_dir = Path(model_dir)
    if not model_dir.is_dir():
        raise UserError(f"model_dir={str(model_dir)!r} is not a directory; pass the output of paddletrain.export")
    for name in GRAPH_FILES:
        if (model_dir / name).is_file():
            return model_dir / name
    raise UserError(f"model_dir={str(model_dir)!r} holds no exported model (expected {' or '.join(GRAPH_FILES)} "
                    f"and {PARAMS_FILE}); export one with `python -m paddletrain.export checkpoint=<dir>`")


def read_metadata(model_dir: str | Path) -> dict[str, Any]:
    """The contents of ``preprocess.json``, or an error naming the file and what is wrong."""
    path = Path(model_dir) / PREPROCESS_FILE
    try:
        meta = json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise UserError(f"{path} is missing; it is written by paddletrain.export next to the model") from None
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise UserError(f"{path} is unreadable or not JSON: {exc}") from exc
    if not isinstance(meta, dict) or "input_size" not in meta:
        raise UserError(f"{path} has no input_size; it was not written by paddletrain.export")
    return meta


def read_labels(path: str | Path) -> list[str]:
    """Class names from a text file, one a line in output order (trailing blank lines ignored)."""
    return read_names_file(path, f"labels={str(path)!r}")


class Preprocessing:
    """Decoded image -> float32 CHW array, exactly as described by an export's ``preprocess.json``.

    Built from the same transform classes as training's eval pipeline, so an exported model sees the inputs
    its checkpoint was validated on. Picklable, so decode workers can carry it.
    """

    def __init__(self, info: dict[str, Any]) -> None:
        # on use: importing this module must not load Paddle (predict's start-up, its decode workers)
        from paddle.vision import transforms as T

        from paddletrain.data.transforms.presets import ResizeIfNeeded, ToNormalizedArray, ToPILImage

        try:
            channels = int(info["input_size"][0])
            mode, resize = info["resize_mode"], int(info["resize"])
            mean, std, interpolation = list(info["mean"]), list(info["std"]), info["interpolation"]
            scale = float(info.get("scale", 1 / 255))
        except (KeyError, TypeError, ValueError, IndexError) as exc:
            raise UserError(f"{PREPROCESS_FILE}: preprocessing is incomplete or malformed ({exc!r})") from exc
        if mode not in RESIZE_MODES:
            raise UserError(f"{PREPROCESS_FILE}: resize_mode={mode!r} is not one of {', '.join(RESIZE_MODES)}")
        if abs(scale - 1 / 255) > 1e-9:
            raise UserError(f"{PREPROCESS_FILE}: scale={scale} is not supported (only 1/255)")
        self.info = dict(info)
        steps: list = [ToPILImage(channels)]
        if mode == "shorter_side":
            steps += [T.Resize(resize, interpolation=interpolation), T.CenterCrop(int(info["crop"]))]
        else:
            steps.append(ResizeIfNeeded(resize, interpolation))
        steps.append(ToNormalizedArray(mean, std))
        self._pipeline = T.Compose(steps)

    def __call__(self, image: Any) -> np.ndarray:
        """A PIL image or uint8 HWC array -> the model's float32 CHW input."""
        return self._pipeline(image)

    def __repr__(self) -> str:
        keys = ("input_size", "resize_mode", "resize", "crop", "interpolation", "mean", "std")
        return f"Preprocessing({', '.join(f'{k}={self.info.get(k)}' for k in keys)})"


def cpu_bf16_support() -> str:
    """``"fast"`` (the CPU has AVX512-BF16 or AMX), ``"emulated"`` (oneDNN converts, slower than fp32) or ``"none"``."""
    from paddle.base import core  # on use: importing this module must not load Paddle

    if core.supports_bfloat16_fast_performance():
        return "fast"
    return "emulated" if core.supports_bfloat16() else "none"


def check_precision_runs_on(precision: str, device: str, use_mkldnn: bool = True) -> None:
    """Raise a :class:`UserError` saying why ``precision`` cannot run on ``device`` (``cpu`` or ``gpu``)."""
    if precision not in PRECISIONS:
        raise UserError(f"precision={precision!r} is not one of {', '.join(PRECISIONS)}")
    if precision == "fp16" and device == "cpu":
        raise UserError("precision=fp16 needs a GPU (Paddle Inference runs fp16 only there); on a CPU use "
                        "precision=fp32, or precision=bf16 on CPUs with AVX512-BF16/AMX")
    if precision == "bf16" and device == "gpu":
        raise UserError("precision=bf16 is the CPU (oneDNN) setting; on a GPU use precision=fp16")
    if precision == "bf16" and not use_mkldnn:
        raise UserError("precision=bf16 runs through oneDNN: it cannot be combined with use_mkldnn=false")
    if precision == "bf16" and cpu_bf16_support() == "none":
        raise UserError("precision=bf16: this CPU has no bfloat16 support in oneDNN (it needs AVX-512); use "
                        "precision=fp32")
    if precision == "int8":
        _check_int8_runs_on(device, use_mkldnn)


def _check_int8_runs_on(device: str, use_mkldnn: bool) -> None:
    from paddle.base import core  # on use: importing this module must not load Paddle

    if device == "gpu":
        raise UserError("precision=int8 is the CPU (oneDNN) setting here; on a GPU use precision=fp16")
    if not use_mkldnn:
        raise UserError("precision=int8 runs through oneDNN: it cannot be combined with use_mkldnn=false")
    if not core.supports_int8():
        raise UserError("precision=int8: this CPU has no int8 support in oneDNN (it needs AVX2 or newer); use "
                        "precision=fp32")


def check_precision_matches_export(precision: str, exported: str, model_dir: Path) -> None:
    """int8 is a property of the graph, not a runtime switch: it runs only an int8 export, and an int8 export only
    in int8 (its weights are stored quantized)."""
    if "int8" in (precision, exported) and precision != exported:
        raise UserError(f"precision={precision} but {model_dir / PREPROCESS_FILE} says the export is {exported}; "
                        "int8 is chosen at export (python -m paddletrain.export ... precision=int8 "
                        "calibration=<images>), so leave precision unset to run what was exported")


def _resolve_device(device: str) -> str:
    import paddle  # on use: importing this module must not load Paddle

    if device not in DEVICES:
        raise UserError(f"device={device!r} is not one of {', '.join(DEVICES)}")
    has_gpu = paddle.device.is_compiled_with_cuda() and paddle.device.cuda.device_count() > 0
    if device == "gpu" and not has_gpu:
        raise UserError(f"device=gpu but this Paddle ({paddle.__version__}) has no usable GPU; use device=cpu")
    return ("gpu" if has_gpu else "cpu") if device == "auto" else device


def read_task(meta: dict[str, Any], path: Path) -> tuple[bool, float | None]:
    """``(multilabel, threshold)`` from ``preprocess.json``: a multi-label (sigmoid) export records both; an export
    without them is single-label (softmax)."""
    multilabel = meta.get("multilabel", False)
    if not isinstance(multilabel, bool):
        raise UserError(f"{path}: multilabel must be true or false, got {multilabel!r}")
    if not multilabel:
        return False, None
    threshold = meta.get("threshold")
    if isinstance(threshold, bool) or not isinstance(threshold, (int, float)) or not 0 < threshold < 1:
        raise UserError(f"{path}: a multi-label export needs a threshold between 0 and 1, got {threshold!r}")
    return True, float(threshold)


def sigmoid(logits: np.ndarray) -> np.ndarray:
    """Element-wise logistic function, stable for large logits of either sign."""
    logits = np.asarray(logits, np.float64)
    out = np.empty_like(logits)
    positive = logits >= 0
    out[positive] = 1.0 / (1.0 + np.exp(-logits[positive]))
    exp = np.exp(logits[~positive])
    out[~positive] = exp / (1.0 + exp)
    return out


@dataclass
class _Runtime:
    device: str
    precision: str
    cpu_threads: int
    mkldnn: bool
    tensorrt: bool
    # paddle or onnx, and why load_predictor chose it (None when the caller built the predictor itself)
    backend: str = "paddle"
    reason: str | None = None
    memory_optim: bool = False

    def describe(self) -> str:
        """One line naming the runtime and its settings, e.g. ``onnxruntime 1.32.0 (fp32, cpu, 2 threads)``."""
        settings = [self.precision, self.device, f"{self.cpu_threads} thread{'s' if self.cpu_threads > 1 else ''}"]
        if self.mkldnn:
            settings.append("oneDNN")
        if self.memory_optim:
            settings.append("memory reuse")
        if self.tensorrt:
            settings.append("TensorRT")
        text = f"{RUNTIME_NAMES[self.backend]} {runtime_version(self.backend)} ({', '.join(settings)})"
        return f"{text}; {self.reason}" if self.reason else text


def runtime_version(backend: str) -> str:
    """The installed version of ``backend``'s runtime (Paddle or onnxruntime)."""
    import importlib.metadata

    name = "onnxruntime" if backend == "onnx" else "paddlepaddle"
    try:
        return importlib.metadata.version(name)
    except importlib.metadata.PackageNotFoundError:  # onnxruntime-gpu, paddlepaddle-gpu, a source build
        module = require_onnxruntime() if backend == "onnx" else __import__("paddle")
        return str(getattr(module, "__version__", "?"))


class ExportedModel:
    """What every runtime of an export shares: ``preprocess.json``, the labels, any batch size on a fixed graph.

    A subclass opens the model in its runtime, sets ``runtime`` and implements :meth:`_run` (one batch the graph
    accepts -> logits), then calls :meth:`_check_outputs`. ``predict`` is the same for all of them, so the
    Paddle Inference and onnxruntime backends are fed and read identically.
    """

    model_dir: Path
    runtime: Any

    def _read_export(self, model_dir: Path, labels: None | str | Path) -> None:
        self.model_dir = model_dir
        self.metadata = read_metadata(self.model_dir)
        self.input_size = tuple(int(v) for v in self.metadata["input_size"])
        self.fixed_batch: int | None = self.metadata.get("batch")
        saved = self.metadata.get("labels")
        if saved is not None and not (isinstance(saved, list) and all(isinstance(name, str) for name in saved)):
            raise UserError(f"{self.model_dir / PREPROCESS_FILE}: labels must be a list of class names")
        self.labels: list[str] | None = read_labels(labels) if labels is not None else (saved or None)
        self.multilabel, self.threshold = read_task(self.metadata, self.model_dir / PREPROCESS_FILE)
        self._labels_source = str(labels) if labels is not None else str(self.model_dir / PREPROCESS_FILE)
        has_preprocessing = "resize_mode" in self.metadata
        self.preprocessing: Preprocessing | None = Preprocessing(self.metadata) if has_preprocessing else None

    def _check_outputs(self) -> None:
        self.num_outputs = self._count_outputs()
        if self.labels is not None and len(self.labels) != self.num_outputs:
            raise UserError(f"{self._labels_source} has {len(self.labels)} labels but the model in {self.model_dir} "
                            f"has {self.num_outputs} outputs; give one class name per output")

    def _count_outputs(self) -> int:
        """The model's output width, from one batch of zeros (Paddle Inference knows it only after a run)."""
        probe = np.zeros((self.fixed_batch or 1, *self.input_size), np.float32)
        return int(self._run(probe).shape[-1])

    @property
    def num_classes(self) -> int:
        """The number of classes the model scores (its output width)."""
        return self.num_outputs

    def predict(self, batch: np.ndarray, probs: bool = False) -> np.ndarray:
        """Logits (or probabilities with ``probs=True``: softmax, or each class's sigmoid for a multi-label
        export) for an ``(N, C, H, W)`` float32 batch.

        Any N works: an export with a fixed batch size gets the batch split and zero-padded to that size.
        """
        batch = np.ascontiguousarray(batch, dtype=np.float32)
        if batch.ndim != 4 or tuple(batch.shape[1:]) != self.input_size:
            raise UserError(f"expected a batch of shape (N, {', '.join(map(str, self.input_size))}), "
                            f"got {tuple(batch.shape)}")
        if len(batch) == 0:
            raise UserError("cannot predict an empty batch")
        if self.fixed_batch:
            logits = np.concatenate([self._run_padded(batch[i:i + self.fixed_batch])
                                     for i in range(0, len(batch), self.fixed_batch)])
        else:
            logits = self._run(batch)
        if not probs:
            return logits
        return sigmoid(logits).astype(np.float32) if self.multilabel else softmax(logits)

    def _run_padded(self, chunk: np.ndarray) -> np.ndarray:
        missing = self.fixed_batch - len(chunk)
        if missing:
            chunk = np.concatenate([chunk, np.zeros((missing, *chunk.shape[1:]), np.float32)])
        return self._run(chunk)[:len(chunk) - missing]

    def _run(self, batch: np.ndarray) -> np.ndarray:
        raise NotImplementedError


class Predictor(ExportedModel):
    """An exported model in Paddle Inference, fed NCHW float32 batches of any size.

    Args:
        model_dir: an export directory (graph, weights and ``preprocess.json``).
        device: ``auto`` (GPU when Paddle has one, else CPU; always the CPU for bf16), ``cpu`` or ``gpu``.
        cpu_threads: threads of the CPU math library; ``None`` = every core this process may use.
        use_mkldnn: run on CPU through oneDNN (about twice as fast as Paddle's plain CPU kernels in fp32 here;
            required for bf16).
        precision: ``fp32``; ``fp16`` (GPU only); ``bf16`` (CPU with oneDNN: several times faster than fp32
            on CPUs with AVX512-BF16 or AMX, at about 2-3 significant digits); ``None`` = what the export
            recorded.
        tensorrt: build TensorRT subgraphs on the GPU (needs a Paddle built with TensorRT).
        gpu_id, gpu_memory_mb: the GPU and its initial memory pool.
        trt_max_batch: largest batch TensorRT's dynamic-shape engine is built for.
        labels: a text file of class names (one a line) replacing the export's; ``None`` = the export's.

    The labels must name every output of the model: a count that differs is refused at construction, after
    one batch of zeros has shown how many outputs the model has (``num_classes``).
    """

    def __init__(self, model_dir: str | Path, device: str = "auto", cpu_threads: int | None = None,
                 use_mkldnn: bool = True, precision: str | None = None, tensorrt: bool = False,
                 gpu_id: int = 0, gpu_memory_mb: int = 512, trt_max_batch: int = 64,
                 labels: None | str | Path = None) -> None:
        # on use: importing this module must not load Paddle (runtime imports it too)
        from paddle import inference

        from paddletrain.devices import usable_cores

        graph = find_graph_file(Path(model_dir))
        params = Path(model_dir) / PARAMS_FILE
        if not params.is_file():
            raise UserError(f"{params} is missing; the export in {model_dir} is incomplete")
        self._read_export(Path(model_dir), labels)

        precision = precision or self.metadata.get("precision", "fp32")
        check_precision_matches_export(precision, self.metadata.get("precision", "fp32"), self.model_dir)
        # bf16 and int8 are CPU precisions, so device=auto runs such an export on the CPU even beside a GPU.
        resolved = "cpu" if device == "auto" and precision in ("bf16", "int8") else _resolve_device(device)
        if resolved == "cpu" and tensorrt:
            raise UserError("tensorrt=true needs a GPU (Paddle Inference runs TensorRT only there); this "
                            "predictor runs on the CPU: use tensorrt=false")
        check_precision_runs_on(precision, resolved, use_mkldnn)
        if precision == "bf16" and cpu_bf16_support() == "emulated":
            log.warning("precision=bf16 on a CPU without AVX512-BF16/AMX: oneDNN emulates it, which is slower "
                        "than fp32")
        # Unlike training, nothing else in this process needs a core while the predictor runs.
        threads = cpu_threads or usable_cores()
        if threads < 1:
            raise UserError(f"cpu_threads={cpu_threads} must be >= 1")

        config = inference.Config(str(graph), str(params))
        config.disable_glog_info()
        memory_optim = graph.suffix == ".pdmodel" and precision == "fp32" and resolved == "cpu"
        if memory_optim:
            # Paddle's advice for inference: reused activation buffers stay in cache. A ResNet-50 ProgramDesc graph
            # ran 1.11 x faster with it than without in one interleaved comparison (batch 1, 1 thread, AVX2); the
            # bench (`bench inference runtimes_programdesc=true`) on a busy machine could not separate it from
            # noise (docs/performance.md). Results are unchanged (tests/test_deploy_predictor.py). PIR graphs
            # (model.json, Paddle 3.3) fail to load with it (memory_optimize_pass is missing from the PIR
            # pipeline); other precisions are not measured with it.
            config.enable_memory_optim()
        config.set_cpu_math_library_num_threads(threads)
        if resolved == "gpu":
            self._configure_gpu(config, precision, tensorrt, gpu_id, gpu_memory_mb, trt_max_batch)
        else:
            config.disable_gpu()
            if use_mkldnn:
                config.enable_mkldnn()
                config.set_mkldnn_cache_capacity(MKLDNN_SHAPE_CACHE)
                if precision == "bf16":
                    config.enable_mkldnn_bfloat16()
                elif precision == "int8":
                    # Turns the graph's quantize/dequantize pairs into oneDNN int8 kernels; without it they
                    # would be simulated in fp32, slower than the fp32 graph.
                    config.enable_mkldnn_int8(int8_op_types(self.metadata))
            else:
                config.disable_mkldnn()
        try:
            with quiet_pass_statistics():  # oneDNN's int8/bf16 passes print ~30 lines of statistics each
                self._predictor = inference.create_predictor(config)
        except Exception as exc:  # Paddle raises bare RuntimeError/ValueError for unreadable graphs
            raise UserError(f"Paddle Inference cannot load {graph}: {exc}") from exc
        self._input = self._predictor.get_input_handle(self._predictor.get_input_names()[0])
        self._output = self._predictor.get_output_handle(self._predictor.get_output_names()[0])
        self.runtime = _Runtime(resolved, precision, threads, bool(use_mkldnn and resolved == "cpu"), tensorrt,
                                memory_optim=memory_optim)
        self._check_outputs()

    def _configure_gpu(self, config: Any, precision: str, tensorrt: bool, gpu_id: int, memory_mb: int,
                       trt_max_batch: int) -> None:
        from paddle import inference  # on use: importing this module must not load Paddle

        half = precision == "fp16"
        paddle_precision = inference.PrecisionType.Half if half else inference.PrecisionType.Float32
        config.enable_use_gpu(memory_mb, gpu_id, paddle_precision)
        if not tensorrt:
            return
        try:
            compiled = inference.get_trt_compile_version()
        except Exception:  # pragma: no cover - the call itself is missing in builds without TensorRT
            compiled = (0, 0, 0)
        if not any(compiled):
            raise UserError("tensorrt=true but this Paddle build has no TensorRT support; use tensorrt=false")
        config.enable_tensorrt_engine(workspace_size=1 << 30, max_batch_size=trt_max_batch, min_subgraph_size=3,
                                      precision_mode=paddle_precision, use_static=False, use_calib_mode=False)
        name = self.metadata.get("input_name", "x")  # TensorRT needs shapes by name before the predictor exists
        c, h, w = self.input_size
        config.set_trt_dynamic_shape_info({name: [1, c, h, w]}, {name: [trt_max_batch, c, h, w]},
                                          {name: [min(32, trt_max_batch), c, h, w]})

    def _run(self, batch: np.ndarray) -> np.ndarray:
        self._input.reshape(list(batch.shape))
        self._input.copy_from_cpu(batch)
        try:
            self._predictor.run()
        except (RuntimeError, ValueError) as exc:  # Paddle reports kernel/shape failures with these
            hint = (" (oneDNN cannot run NHWC convolutions: export the model with data_format=NCHW, or pass "
                    "use_mkldnn=False)" if self.runtime.mkldnn and "NHWC" in str(exc) else "")
            lines = [line.strip() for line in str(exc).splitlines() if line.strip()]
            reason = next((line for line in lines if "Error" in line), lines[-1] if lines else type(exc).__name__)
            raise UserError(f"Paddle Inference failed to run {self.model_dir}{hint}: {reason}") from exc
        return self._output.copy_to_cpu().astype(np.float32, copy=False)

    def __repr__(self) -> str:
        r = self.runtime
        return (f"Predictor({str(self.model_dir)!r}, device={r.device}, precision={r.precision}, "
                f"cpu_threads={r.cpu_threads}, mkldnn={r.mkldnn}, tensorrt={r.tensorrt})")


class OnnxPredictor(ExportedModel):
    """An export's ``model.onnx`` in onnxruntime, with the export's ``preprocess.json`` and labels.

    Fed and read exactly like :class:`Predictor` (same preprocessing, any batch size, same labels check), so
    ``paddletrain.predict`` gives the same output format whichever runtime it uses.

    Args:
        model: an export directory holding ``model.onnx``, or the ``.onnx`` file itself (``preprocess.json``
            is read from its folder).
        device: ``auto``/``cpu`` (onnxruntime's CPU provider), or ``gpu`` (its CUDA provider, when installed).
        cpu_threads: onnxruntime's intra-op threads; ``None`` = every core this process may use.
        precision: ``None``, or the export's own (``fp32``, or ``int8`` for an int8 export): the ONNX graph
            runs as exported.
        labels: a text file of class names replacing the export's.
    """

    def __init__(self, model: str | Path, device: str = "auto", cpu_threads: int | None = None,
                 precision: str | None = None, labels: None | str | Path = None) -> None:
        from paddletrain.devices import usable_cores

        onnxruntime = require_onnxruntime()
        path = Path(model)
        onnx_file = path / ONNX_FILE if path.is_dir() else path
        if not onnx_file.is_file() or onnx_file.suffix != ".onnx":
            raise UserError(f"{onnx_file} is not an ONNX model; export one with `python -m paddletrain.export "
                            f"checkpoint=<dir> format=onnx`")
        self._read_export(onnx_file.parent, labels)
        exported = self.metadata.get("precision", "fp32")
        # An int8 export's model.onnx is quantized; any other export's is fp32 (bf16/fp16 are runtime settings).
        graph_precision = "int8" if exported == "int8" else "fp32"
        if precision not in (None, graph_precision):
            raise UserError(f"precision={precision}: the ONNX backend runs the graph as exported "
                            f"({graph_precision}); use the Paddle backend (backend=paddle) for fp16/bf16")
        if device not in DEVICES:
            raise UserError(f"device={device!r} is not one of {', '.join(DEVICES)}")
        available = onnxruntime.get_available_providers()
        if device == "gpu" and "CUDAExecutionProvider" not in available:
            raise UserError(f"device=gpu but this onnxruntime has no CUDA provider (it has {', '.join(available)}); "
                            "use device=cpu, or install onnxruntime-gpu")
        use_gpu = device == "gpu" or (device == "auto" and "CUDAExecutionProvider" in available)
        threads = cpu_threads or usable_cores()
        options = onnxruntime.SessionOptions()
        options.intra_op_num_threads = threads
        options.inter_op_num_threads = 1
        options.log_severity_level = 3  # errors only: onnxruntime's warnings would break the progress bar
        providers = ["CUDAExecutionProvider", "CPUExecutionProvider"] if use_gpu else ["CPUExecutionProvider"]
        try:
            self._session = onnxruntime.InferenceSession(str(onnx_file), options, providers=providers)
        except Exception as exc:  # onnxruntime raises its own Fail/InvalidGraph types
            raise UserError(f"onnxruntime cannot load {onnx_file}: {exc}") from exc
        self.onnx_file = onnx_file
        self._input_name = self._session.get_inputs()[0].name
        self.runtime = _Runtime("gpu" if use_gpu else "cpu", graph_precision, threads, False, False, backend="onnx")
        self._check_outputs()

    def _run(self, batch: np.ndarray) -> np.ndarray:
        try:
            return np.asarray(self._session.run(None, {self._input_name: batch})[0], np.float32)
        except Exception as exc:  # onnxruntime's own error types
            raise UserError(f"onnxruntime failed to run {self.onnx_file}: {str(exc).splitlines()[0]}") from exc

    def __repr__(self) -> str:
        return (f"OnnxPredictor({str(self.onnx_file)!r}, device={self.runtime.device}, "
                f"cpu_threads={self.runtime.cpu_threads})")


def require_onnxruntime() -> Any:
    """The onnxruntime module, or a UserError naming the extra that installs it."""
    try:
        import onnxruntime  # optional dependency (the onnx extra)
    except ImportError:
        raise UserError("running an ONNX model needs onnxruntime, which is not installed: "
                        "pip install paddletrain[onnx]  (or: pip install onnxruntime)") from None
    return onnxruntime


def choose_backend(model: str | Path, backend: str = "auto", precision: str | None = None, device: str = "auto",
                   **paddle_options: Any) -> str:
    """``paddle`` or ``onnx`` for ``model`` (an export directory or a ``.onnx`` file); see :func:`backend_choice`."""
    return backend_choice(model, backend, precision, device, **paddle_options)[0]


def backend_choice(model: str | Path, backend: str = "auto", precision: str | None = None, device: str = "auto",
                   **paddle_options: Any) -> tuple[str, str]:
    """The runtime for ``model`` and why: ``(backend, reason)``, backend ``paddle`` or ``onnx``.

    ``auto``: a ``.onnx`` file runs in onnxruntime, a directory with only one of the two models runs that one.
    A directory with both runs in the runtime :data:`FASTEST_CPU_RUNTIME` names for its precision (``precision``,
    else the one ``preprocess.json`` records) when it runs on the CPU, onnxruntime is installed and no Paddle-only
    setting (``use_mkldnn=False``, ``tensorrt=True``) was asked for; otherwise in Paddle Inference.
    """
    if backend not in BACKENDS:
        raise UserError(f"backend={backend!r} is not one of {', '.join(BACKENDS)}")
    if backend != "auto":
        return backend, f"backend={backend}"
    path = Path(model)
    if path.is_file() and path.suffix == ".onnx":
        return "onnx", "backend=auto: an ONNX model file"
    has_graph = path.is_dir() and any((path / name).is_file() for name in GRAPH_FILES)
    if not (path.is_dir() and (path / ONNX_FILE).is_file()):
        return "paddle", "backend=auto: the export has no model.onnx"
    if not has_graph:
        return "onnx", "backend=auto: the export has only model.onnx"
    return preferred_backend(precision or read_metadata(path).get("precision", "fp32"), device, **paddle_options)


def preferred_backend(precision: str, device: str = "auto", **paddle_options: Any) -> tuple[str, str]:
    """The runtime that runs ``precision`` fastest here, of the two an export can have, and why:
    :data:`FASTEST_CPU_RUNTIME` on a CPU, when onnxruntime is installed and no Paddle-only setting
    (``use_mkldnn=False``, ``tensorrt=True``) was asked for; otherwise ``paddle``."""
    faster = FASTEST_CPU_RUNTIME.get(precision, "paddle")
    if faster == "paddle":
        unmeasured = "" if precision in FASTEST_CPU_RUNTIME else " (onnxruntime not yet compared in this precision)"
        return "paddle", f"backend=auto: {precision} runs in Paddle Inference{unmeasured}"
    asked = paddle_only_settings(paddle_options)
    if asked:
        return "paddle", f"backend=auto: {', '.join(f'{k}={v}' for k, v in asked.items())} asks for Paddle Inference"
    if device == "gpu" or (device == "auto" and _resolve_device("auto") == "gpu"):
        return "paddle", "backend=auto: on a GPU, Paddle Inference"  # not measured there: the export's own runtime
    try:
        require_onnxruntime()
    except UserError:
        return "paddle", (f"backend=auto: onnxruntime runs {precision} faster on a CPU but is not installed "
                          "(pip install paddletrain[onnx])")
    return "onnx", f"backend=auto: onnxruntime runs {precision} faster than Paddle Inference on a CPU"


# Predictor settings at their defaults say nothing about the runtime; any other value is a Paddle-only request.
PADDLE_DEFAULTS = {"use_mkldnn": True, "tensorrt": False}


def paddle_only_settings(paddle_options: dict[str, Any]) -> dict[str, Any]:
    """The Predictor settings in ``paddle_options`` that only Paddle Inference can honour (not at their defaults)."""
    return {k: v for k, v in paddle_options.items() if v is not None and v != PADDLE_DEFAULTS.get(k)}


def load_predictor(model: str | Path, backend: str = "auto", device: str = "auto",
                   cpu_threads: int | None = None, precision: str | None = None,
                   labels: None | str | Path = None, **paddle_options: Any) -> ExportedModel:
    """The export ``model`` in the runtime :func:`backend_choice` picks: a :class:`Predictor` (Paddle Inference;
    ``paddle_options`` such as ``use_mkldnn``, ``tensorrt`` go to it) or an :class:`OnnxPredictor`. Both take the
    same batches and give the same logits layout; ``predictor.runtime.describe()`` names the one chosen and why."""
    chosen, reason = backend_choice(model, backend, precision, device, **paddle_options)
    if chosen == "onnx":
        ignored = paddle_only_settings(paddle_options)
        if ignored:
            raise UserError(f"{', '.join(f'{k}={v}' for k, v in ignored.items())} apply to the Paddle backend only, "
                            f"not to the ONNX model {model}")
        predictor: ExportedModel = OnnxPredictor(model, device=device, cpu_threads=cpu_threads,
                                                 precision=precision, labels=labels)
    else:
        if Path(model).is_file():
            raise UserError(f"{model} is a file; backend=paddle needs the export directory")
        predictor = Predictor(model, device=device, cpu_threads=cpu_threads, precision=precision, labels=labels,
                              **paddle_options)
    predictor.runtime.reason = reason
    return predictor


def softmax(logits: np.ndarray) -> np.ndarray:
    """Row-wise softmax, stable for large logits."""
    shifted = logits - logits.max(axis=-1, keepdims=True)
    exp = np.exp(shifted)
    return exp / exp.sum(axis=-1, keepdims=True)


def label_names(labels: Sequence[str] | None, indices: Sequence[int]) -> list[str]:
    """Display names of class indices; the index itself when the export has no labels."""
    return [labels[i] if labels and i < len(labels) else str(i) for i in indices]
