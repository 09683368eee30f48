"""`python -m paddletrain.predict model_dir=<export> input=<folder|list file|glob>`: batched predictions as JSON lines.

Examples::

    python -m paddletrain.predict model_dir=export/ input=photos/ output=preds.jsonl
    python -m paddletrain.predict model_dir=export/ input='shots/**/*.png' batch_size=64 num_workers=4 topk=3
    python -m paddletrain.predict model_dir=export/ input=list.txt     # one path a line, relative to the list
    python -m paddletrain.predict model_dir=export/ input=val_list.txt data_root=data/   # a label list
    python -m paddletrain.predict model_dir=export/model.onnx input=photos/     # the ONNX model, in onnxruntime
    python -m paddletrain.predict checkpoint=outputs/fit/<time>:best input=photos/  # exports it first, verified

``model_dir`` is an export directory (run in Paddle Inference, or in onnxruntime when it holds only ``model.onnx``,
with ``backend=onnx``, or with ``backend=auto`` when it holds both and onnxruntime is the faster runtime for its
precision: :func:`paddletrain.deploy.predictor.backend_choice`) or a ``.onnx`` file; either way the export's
``preprocess.json`` feeds the model and the output is the same. ``checkpoint`` (instead of ``model_dir``) takes
what ``evaluate`` and ``export`` take, exports it with the parity check into this run's directory and predicts
with that.

Worker processes decode and preprocess (with the export's own ``preprocess.json``) while the main process
runs the predictor, with a bounded number of batches in flight. Each image gives one line
``{"path", "labels", "scores", "class_ids"}`` (top-k, softmax scores) on ``output`` or stdout. A multi-label export
(``"multilabel": true`` in its ``preprocess.json``) gives instead the classes whose sigmoid score is above the
export's threshold (``threshold=`` overrides it) as ``labels``/``scores``/``class_ids``, best first, plus the top-k
sigmoid scores as ``topk_labels``/``topk_scores``/``topk_class_ids``. An unreadable
image is logged with its reason and skipped. Exit status: 0 when every image was predicted, 3 when some
failed (the summary says how many), 2 for a usage error (bad model_dir, no input files, bad option).
"""
from __future__ import annotations

import logging
import sys
from pathlib import Path

import hydra
from omegaconf import DictConfig, OmegaConf

from paddletrain._moved import forward_names
from paddletrain.cli import command_task, run_command
from paddletrain.config import check_values
from paddletrain.deploy.batch_prediction import (
    EXIT_SOME_FAILED,
    PredictConfig,
    check_output_file,
    check_output_location,
    default_num_workers,
    default_predictor_threads,
    export_for_prediction,
    exported_multilabel,
    model_source,
    predict_files,
    read_labelled_inputs,
)
from paddletrain.deploy.inputs import resolve_inputs
from paddletrain.deploy.predictor import load_predictor
from paddletrain.errors import UserError
from paddletrain.job.processes import reclaim_stop_signals
from paddletrain.plugins import prepare

log = logging.getLogger("paddletrain")


def run(cfg: DictConfig) -> int:
    """The CLI's work for a ``PredictConfig``: the exit status (0 all ok, 3 some failed).

    A usage error raises :class:`~paddletrain.errors.UserError`, which :func:`~paddletrain.cli.command_task` ends
    with one line and exit status 2, as every command does.

    ``checkpoint=`` is exported into paddletrain's cache first, once (:func:`export_for_prediction`).
    """
    check_values(cfg, PredictConfig)  # cheapest first: every value given, then what is missing
    if OmegaConf.is_missing(cfg, "input"):
        raise UserError("missing required value for input (e.g. model_dir=<export dir> "
                        "input=<folder|list file|glob>)")
    model = model_source(cfg)
    prepare(cfg)
    if cfg.output is not None:
        check_output_location(cfg.output, cfg.input)
    paths = None if cfg.data_root else resolve_inputs(cfg.input)
    if cfg.checkpoint is not None:
        exported = export_for_prediction(cfg)
        if exported is None:
            return EXIT_SOME_FAILED
        model = str(exported)
    targets = None
    if cfg.data_root:  # the export says whether its lists are multi-label, so it is read first
        targets = read_labelled_inputs(cfg.input, cfg.data_root, cfg.delimiter, exported_multilabel(model))
        paths = list(targets)
    if cfg.output is not None:  # before loading the model; predict_files checks again for API callers
        check_output_file(cfg.output, paths, protected=[Path(model) if Path(model).is_dir()
                                                        else Path(model).parent])
    workers = default_num_workers() if cfg.num_workers is None else cfg.num_workers
    threads = cfg.cpu_threads or default_predictor_threads(workers)
    predictor = load_predictor(model, backend=cfg.backend, device=cfg.device, cpu_threads=threads,
                               precision=cfg.precision, labels=cfg.labels, use_mkldnn=cfg.use_mkldnn,
                               tensorrt=cfg.tensorrt)
    reclaim_stop_signals()  # loading the predictor may have imported Paddle, which took SIGTERM
    log.info("%d input files; %r; runtime: %s", len(paths), predictor, predictor.runtime.describe())
    summary = predict_files(predictor, paths, batch_size=cfg.batch_size, num_workers=workers,
                            topk=cfg.topk, output=cfg.output, progress=cfg.progress_bar, targets=targets,
                            threshold=cfg.threshold)
    log.info("%s%s", summary, f"; predictions in {cfg.output}" if cfg.output else "")
    if summary.n_failed:
        log.error("%d of %d images could not be read (see the warnings above)", summary.n_failed, summary.n_total)
        return EXIT_SOME_FAILED
    return 0


@hydra.main(version_base="1.3", config_path="conf", config_name="predict")
@command_task()
def main(cfg: DictConfig) -> None:
    sys.exit(run(cfg))


# Release 0.1 kept the library here too (e.g. `from paddletrain.predict import ...`): handed on for one release.
__getattr__ = forward_names(__name__, "paddletrain.deploy.batch_prediction")

if __name__ == "__main__":
    run_command(main)
