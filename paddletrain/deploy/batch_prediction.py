"""Batched prediction over image files with an exported model, as JSON lines.

:func:`predict_files` decodes and preprocesses in worker processes (:mod:`~paddletrain.deploy.decoding`, with the
export's own ``preprocess.json``) while the main process runs the predictor, with a bounded number of batches in
flight; each image gives one line ``{"path", "labels", "scores", "class_ids"}`` (top-k softmax scores), or for a
multi-label export the classes above its threshold plus the top-k sigmoid scores. An unreadable image is counted
and skipped. :class:`PredictConfig` is the schema of the command, :mod:`paddletrain.predict`.
"""
from __future__ import annotations

import hashlib
import importlib.util
import json
import logging
import os
import shutil
import sys
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import ExitStack
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO

import numpy as np
from omegaconf import MISSING, DictConfig
from tqdm import tqdm

from paddletrain.config import RuntimeConfig, allowed, check_field, cli_schema
from paddletrain.deploy.decoding import decoded_batches
from paddletrain.deploy.predictor import (
    BACKENDS,
    PRECISIONS,
    PREPROCESS_FILE,
    ExportedModel,
    label_names,
    preferred_backend,
    read_metadata,
    read_task,
    sigmoid,
    softmax,
)
from paddletrain.errors import DataWorkerLost, ExitCode, UserError
from paddletrain.job.processes import stop_request

log = logging.getLogger("paddletrain")

EXIT_USER_ERROR = ExitCode.USER_ERROR
EXIT_SOME_FAILED = ExitCode.BAD_RESULT


@cli_schema("predict")
@dataclass
class PredictConfig(RuntimeConfig):
    """Typed schema of `python -m paddletrain.predict` (conf/predict.yaml)."""

    # An export directory or a .onnx file (or give `checkpoint` instead).
    model_dir: str | None = None
    # A training checkpoint, or a run directory with :best/:last: exported (and verified) first, then run.
    checkpoint: str | None = None
    # auto: onnxruntime for a .onnx model or an export with only model.onnx; for an export with both models, the
    # faster runtime for its precision on this device (paddletrain.deploy.predictor.backend_choice); else Paddle
    # Inference.
    backend: str = allowed("auto", choices=BACKENDS)
    # A folder (searched recursively for images), a text file with one path a line, or a glob pattern.
    input: str = MISSING
    # With a label list as input (training's data.train_list/val_list format: '<path><delimiter><class index>'
    # lines, or a .csv with a path,label header): the folder its paths are relative to (training's data.root).
    # The list is checked as training checks it, and each output line gets the list's class index as "target"
    # (a multi-label export reads multi-label lists, '<path><TAB>0,1,0,...', and "target" lists the class indices).
    data_root: str | None = None
    delimiter: str = " "
    batch_size: int = allowed(32, ge=1)
    # Decode/preprocess processes; 0 decodes in the main process; None = half the cores (the predictor
    # needs the rest).
    num_workers: int | None = allowed(None, ge=0)
    # JSON-lines file; None = stdout. Never one of the inputs, nor an image file inside the input folder.
    output: str | None = None
    topk: int = allowed(5, ge=1)
    # Multi-label exports: a class is predicted when its sigmoid score is above this; None = the export's
    # threshold (training's data.multilabel_threshold).
    threshold: float | None = allowed(None, gt=0, lt=1)
    use_mkldnn: bool = True
    # None = what the export recorded.
    precision: str | None = allowed(None, choices=PRECISIONS)
    tensorrt: bool = False
    progress_bar: bool = True
    # A text file with one class name per line (output order); None = the labels the export recorded.
    labels: str | None = None


@dataclass
class PredictSummary:
    """Counts and speed of one :func:`predict_files` run."""

    n_total: int
    n_ok: int
    n_failed: int
    seconds: float
    # Time spent inside the predictor only; the rest is decode wait and writing.
    predict_seconds: float
    failures: list[tuple[str, str]] = field(default_factory=list)
    # The runtime that predicted, its settings and why it was chosen (``ExportedModel.runtime.describe()``).
    runtime: str = ""

    @property
    def images_per_s(self) -> float:
        """End-to-end throughput: decode + preprocess + predict + write."""
        return self.n_ok / self.seconds if self.seconds > 0 else 0.0

    @property
    def predictor_images_per_s(self) -> float:
        return self.n_ok / self.predict_seconds if self.predict_seconds > 0 else 0.0

    def __str__(self) -> str:
        return (f"{self.n_ok}/{self.n_total} images predicted, {self.n_failed} failed, in {self.seconds:.2f} s: "
                f"{self.images_per_s:.1f} images/s end to end ({self.predictor_images_per_s:.1f} images/s in the "
                f"predictor){'; runtime: ' + self.runtime if self.runtime else ''}")


def check_output_location(output: str, input_spec: str) -> None:
    """Refuse an ``output`` that is the ``input`` list file, or an image file inside the ``input`` folder (it
    would be read as an input by the next run over that folder)."""
    from paddletrain.data.formats.images import is_image_file  # on use: importing predict must not load Paddle

    out, spec = Path(output), Path(input_spec)
    if spec.is_file() and out.exists() and os.path.samefile(out, spec):
        raise UserError(f"output={output!r} is the input list file {input_spec!r}: writing predictions there would "
                        "overwrite it; choose another output")
    if spec.is_dir() and is_image_file(out) and out.resolve().is_relative_to(spec.resolve()):
        raise UserError(f"output={output!r} is an image file inside the input folder {input_spec!r}, so it would be "
                        "read as an input; choose an output outside it (e.g. preds.jsonl)")


def check_output_file(output: str | Path, inputs: Sequence[str], protected: Sequence[Path] = ()) -> None:
    """Refuse an ``output`` that is a directory, or that is (also through a symlink or a hard link) one of
    ``inputs`` or a file in one of the ``protected`` directories (the export): opening it would truncate it."""
    out = Path(output)
    if out.is_dir():
        raise UserError(f"output={str(output)!r} is a directory; name a file, e.g. output=preds.jsonl")
    try:
        target = os.stat(out)
    except OSError:
        return  # nothing there yet (or unreachable, which opening it will report): it cannot be an input
    candidates = [*inputs, *(p for folder in protected if Path(folder).is_dir() for p in Path(folder).iterdir())]
    for path in candidates:
        try:
            same = os.path.samestat(target, os.stat(path))
        except OSError:
            continue
        if same:
            raise UserError(f"output={str(output)!r} is the input file {path}: writing predictions would overwrite "
                            "it; choose another output")


def default_num_workers() -> int:
    """Half the usable cores decode (at least one); the predictor's threads get the rest."""
    from paddletrain.devices import usable_cores

    return max(1, usable_cores() // 2)


def default_predictor_threads(num_workers: int) -> int:
    """The cores the decode workers leave free (at least one)."""
    from paddletrain.devices import usable_cores

    return max(1, usable_cores() - num_workers)


def topk_lines(paths: Sequence[str], logits: np.ndarray, labels: list[str] | None, k: int,
               targets: dict[str, int] | None = None) -> Iterator[str]:
    """One JSON line per image: its top-``k`` labels, softmax scores and class ids, best first (and its
    ``target`` class index when ``targets`` maps its path to one)."""
    probs = softmax(logits)
    k = min(k, probs.shape[1])
    top = np.argsort(-probs, axis=1, kind="stable")[:, :k]
    for path, ids, row in zip(paths, top, probs, strict=True):
        line = {"path": path, "labels": label_names(labels, ids.tolist()),
                "scores": [round(float(row[i]), 6) for i in ids], "class_ids": ids.tolist()}
        if targets is not None:
            line["target"] = targets[path]
        yield json.dumps(line)


def multilabel_lines(paths: Sequence[str], logits: np.ndarray, labels: list[str] | None, k: int, threshold: float,
                     targets: dict[str, list[int]] | None = None) -> Iterator[str]:
    """One JSON line per image of a multi-label model: the classes whose sigmoid score is above ``threshold``
    (``labels``, ``scores``, ``class_ids``, best first), the top-``k`` sigmoid scores (``topk_labels``,
    ``topk_scores``, ``topk_class_ids``), and its ``target`` class indices when ``targets`` has its path."""
    probs = sigmoid(logits)
    k = min(k, probs.shape[1])
    ranked = np.argsort(-probs, axis=1, kind="stable")
    for path, order, row in zip(paths, ranked, probs, strict=True):
        chosen = [int(i) for i in order if row[i] > threshold]
        top = order[:k].tolist()
        line = {"path": path, "labels": label_names(labels, chosen),
                "scores": [round(float(row[i]), 6) for i in chosen], "class_ids": chosen,
                "topk_labels": label_names(labels, top),
                "topk_scores": [round(float(row[i]), 6) for i in top], "topk_class_ids": top}
        if targets is not None:
            line["target"] = targets[path]
        yield json.dumps(line)


def read_labelled_inputs(spec: str, data_root: str, delimiter: str = " ",
                         multilabel: bool = False) -> dict[str, int] | dict[str, list[int]]:
    """The images of the label list ``spec`` (paths relative to ``data_root``) and their class indices (a list of
    them per image for a ``multilabel`` list), checked as training checks its lists
    (:func:`paddletrain.data.formats.label_list.read_label_list`)."""
    from paddletrain.data.formats.label_list_file import (
        read_label_list,  # on use: importing predict must not load Paddle
    )

    index = read_label_list(spec, data_root, key="input", delimiter=delimiter, multilabel=multilabel).index
    if multilabel:
        return {index.path(i): np.flatnonzero(row).tolist() for i, row in enumerate(index.labels)}
    return {index.path(i): int(label) for i, label in enumerate(index.labels)}


def exported_multilabel(model: str | Path) -> bool:
    """Whether the export ``model`` (a directory or its ``.onnx`` file) records a multi-label model; False when it
    has no ``preprocess.json`` (loading it reports that)."""
    folder = Path(model) if Path(model).is_dir() else Path(model).parent
    if not (folder / PREPROCESS_FILE).is_file():
        return False
    return read_task(read_metadata(folder), folder / PREPROCESS_FILE)[0]


# The first batch is this fraction of batch_size (at least one image): the predictor waits for it to be decoded,
# and waits less for a small one.
FIRST_BATCH_FRACTION = 8


def batch_chunks(paths: Sequence[str], batch_size: int, small_first: bool = True) -> list[list[str]]:
    """``paths`` in predictor calls of ``batch_size``, the first one smaller with ``small_first``.

    Nothing is predicted until the first batch is decoded, which with workers happens in the predictor's own
    process while they start (:func:`~paddletrain.deploy.decoding.decoded_batches`): 32 images of 224 px take about
    0.04 s to decode there and 4 an eighth of that (docs/performance.md), time the predictor would otherwise sit idle.
    Not worth it without workers (decoding then waits for the predictor anyway), nor for an export with a fixed
    batch size, which would pad a small batch to its size.
    """
    if not paths:
        return []
    first = max(1, batch_size // FIRST_BATCH_FRACTION) if small_first and len(paths) > batch_size else batch_size
    return [list(paths[:first])] + [list(paths[i:i + batch_size]) for i in range(first, len(paths), batch_size)]


def predict_files(predictor: ExportedModel, paths: Sequence[str], batch_size: int = 32,
                  num_workers: int | None = None, topk: int = 5, output: None | str | Path | IO[str] = None,
                  progress: bool = True, targets: dict[str, int] | dict[str, list[int]] | None = None,
                  threshold: float | None = None) -> PredictSummary:
    """Predict every image of ``paths`` with ``predictor`` and write one JSON line per image.

    Args:
        predictor: a :class:`~paddletrain.deploy.predictor.Predictor` or
            :class:`~paddletrain.deploy.predictor.OnnxPredictor`
            (see :func:`~paddletrain.deploy.predictor.load_predictor`) whose export has preprocessing.
        paths: image files; unreadable ones are logged (path and reason) and skipped.
        batch_size: images per predictor call (the first call gets fewer, see :func:`batch_chunks`).
        num_workers: decode processes (0: decode in this process; None: half the cores).
        topk: labels per image.
        output: a file path or an open text stream; None = stdout.
        progress: show a tqdm progress bar (on stderr).
        targets: each path's true class index (from a label list; class indices for a multi-label one), written
            as ``target``.
        threshold: a multi-label export's decision threshold instead of the one it recorded.
    """
    if predictor.preprocessing is None:
        raise UserError(f"{predictor.model_dir} has no preprocessing in preprocess.json, so images cannot be "
                        "decoded for it; export it with paddletrain.export (or export_model(preprocessing=...))")
    for key, value in (("batch_size", batch_size), ("topk", topk), ("num_workers", num_workers),
                       ("threshold", threshold)):
        check_field(PredictConfig, key, value)
    lines = _line_writer(predictor, topk, targets, threshold)
    workers = default_num_workers() if num_workers is None else num_workers
    paths = [str(p) for p in paths]
    if isinstance(output, (str, Path)):
        check_output_file(output, paths, protected=[predictor.model_dir])
    chunks = batch_chunks(paths, batch_size, small_first=workers > 0 and not predictor.fixed_batch)
    failures: list[tuple[str, str]] = []
    n_ok, predict_seconds = 0, 0.0
    start = time.perf_counter()
    with ExitStack() as stack:
        if output is None:
            sink = sys.stdout
        elif isinstance(output, (str, Path)):
            try:
                Path(output).parent.mkdir(parents=True, exist_ok=True)
                sink = stack.enter_context(open(output, "w", encoding="utf-8"))
            except OSError as exc:
                raise UserError(f"cannot write output={str(output)!r}: {exc.strerror}") from exc
        else:
            sink = output
        bar = stack.enter_context(tqdm(total=len(paths), unit="img", disable=not progress, file=sys.stderr))
        try:
            for ok, inputs, failed in decoded_batches(chunks, predictor.preprocessing, workers,
                                                      predictor.input_size):
                # A stop request raises at once, but a raise that lands in a logging call is swallowed by logging:
                # each batch checks again.
                stop_request.raise_if_requested()
                for path, reason in failed:
                    log.warning("Skipped %s: %s", path, reason)
                failures.extend(failed)
                if inputs is not None:
                    t0 = time.perf_counter()
                    logits = predictor.predict(inputs)
                    predict_seconds += time.perf_counter() - t0
                    sink.write("".join(line + "\n" for line in lines(ok, logits)))
                    n_ok += len(ok)
                bar.update(len(ok) + len(failed))
        except DataWorkerLost as exc:
            kept = f" in {output}" if isinstance(output, (str, Path)) else ""
            raise DataWorkerLost(f"{exc}; the {n_ok} predictions written before it are kept{kept}") from None
        sink.flush()
    return PredictSummary(n_total=len(paths), n_ok=n_ok, n_failed=len(failures),
                          seconds=time.perf_counter() - start, predict_seconds=predict_seconds, failures=failures,
                          runtime=predictor.runtime.describe())


def _line_writer(predictor: ExportedModel, topk: int, targets: dict | None,
                 threshold: float | None) -> Callable[[list[str], np.ndarray], Iterator[str]]:
    """The JSON lines of a batch: :func:`multilabel_lines` for a multi-label export, else :func:`topk_lines`."""
    if threshold is not None and not predictor.multilabel:
        raise UserError(f"threshold={threshold} applies to multi-label exports only; {predictor.model_dir} is a "
                        "single-label (softmax) model")
    if predictor.multilabel:
        cut = predictor.threshold if threshold is None else threshold
        return lambda ok, logits: multilabel_lines(ok, logits, predictor.labels, topk, cut, targets)
    return lambda ok, logits: topk_lines(ok, logits, predictor.labels, topk, targets)


def model_source(cfg: DictConfig) -> str:
    """``model_dir`` or ``checkpoint``: exactly one of them, and an export is not a checkpoint nor the reverse."""
    from paddletrain.checkpoint.locate import (  # on use: importing predict must not load Paddle
        CHECKPOINTS_DIR,
        is_checkpoint_dir,
        split_choice,
    )

    if (cfg.model_dir is None) == (cfg.checkpoint is None):
        raise UserError("give model_dir=<export dir or .onnx file> or checkpoint=<checkpoint or run dir[:best|:last]>"
                        f"{' (not both)' if cfg.model_dir is not None else ''}, and input=<folder|list file|glob>")
    if cfg.checkpoint is not None:
        return cfg.checkpoint
    path = Path(split_choice(cfg.model_dir)[0])
    if is_checkpoint_dir(path) or (path / CHECKPOINTS_DIR).is_dir():
        spec = _resolvable_spec(cfg.model_dir)
        raise UserError(f"model_dir={cfg.model_dir} is a training checkpoint or run, not an export: pass "
                        f"checkpoint={spec} instead (predict exports it first), or export it with "
                        f"`python -m paddletrain.export checkpoint={spec}`")
    return cfg.model_dir


def _resolvable_spec(spec: str) -> str:
    """``spec`` as a ``checkpoint=`` value that names one checkpoint: itself, else with ``:best``, else ``:last``
    (a run with several checkpoints needs the choice), so a hint built from it runs as printed."""
    from paddletrain.checkpoint.locate import locate_checkpoint  # on use: importing predict must not load Paddle

    for candidate in (spec, f"{spec}:best", f"{spec}:last"):
        try:
            locate_checkpoint(candidate)
        except UserError:
            continue
        return candidate
    return spec


def export_for_prediction(cfg: DictConfig) -> Path | None:
    """``cfg.checkpoint`` exported with the parity check, or the export an earlier call made of the same checkpoint
    (in paddletrain's cache, keyed by the checkpoint's manifest, the format and the weights); None when the check
    fails."""
    from paddletrain.checkpoint.locate import locate_checkpoint  # on use: importing predict must not load Paddle
    from paddletrain.data.formats.scancache import cache_root
    from paddletrain.deploy.exporter import export_checkpoint

    fmt = cfg.backend
    if fmt == "auto":  # give the export a model.onnx when the runtime predict would then choose is onnxruntime
        options = {"use_mkldnn": cfg.use_mkldnn, "tensorrt": cfg.tensorrt}
        fmt = "onnx" if preferred_backend(cfg.precision or "fp32", cfg.device, **options)[0] == "onnx" else "paddle"
        if fmt == "onnx" and importlib.util.find_spec("paddle2onnx") is None:
            log.info("paddle2onnx is not installed: exporting for Paddle Inference only (pip install paddletrain[onnx] "
                     "to let predict use onnxruntime, faster in fp32 on CPUs)")
            fmt = "paddle"
    checkpoint = locate_checkpoint(cfg.checkpoint)
    key = hashlib.sha256((checkpoint / "manifest.json").read_bytes() + f"|{fmt}|{cfg.weights}".encode()).hexdigest()
    out_dir = cache_root() / "exports" / f"{checkpoint.name}-{fmt}-{cfg.weights}-{key[:16]}"
    if (out_dir / PREPROCESS_FILE).is_file():
        log.info("Using the export of checkpoint=%s made earlier: %s", checkpoint, out_dir)
        return out_dir
    scratch = out_dir.with_name(f".{out_dir.name}.tmp-{os.getpid()}")  # a half-made export is never reused
    shutil.rmtree(scratch, ignore_errors=True)
    try:
        result = export_checkpoint(checkpoint, scratch, format=fmt, cpu_threads=cfg.cpu_threads,
                                   imports=list(cfg.imports), weights=cfg.weights)
        report = result.onnx_parity or result.parity
        if not result.passed:
            log.error("The export of checkpoint=%s for prediction failed its check: %s", checkpoint, report)
            return None
        shutil.rmtree(out_dir, ignore_errors=True)
        os.replace(scratch, out_dir)
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    log.info("Exported checkpoint=%s to %s (%s); later calls with this checkpoint use it, or pass model_dir=%s",
             checkpoint, out_dir, report, out_dir)
    return out_dir
