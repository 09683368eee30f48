"""`python -m paddletrain.export checkpoint=<dir>[:best|:last]`: a checkpoint -> a verified Paddle Inference (or
ONNX) model.

Examples::

    python -m paddletrain.export checkpoint=outputs/fit/2026-11-23_10-00-00:best out_dir=export/
    python -m paddletrain.export checkpoint=outputs/fit/2026-11-23_10-00-00/checkpoints/epoch0004-step0000200
    python -m paddletrain.export checkpoint=... batch=8            # fixed batch size (default: dynamic)
    python -m paddletrain.export checkpoint=... format=onnx        # needs `pip install paddletrain[onnx]`
    python -m paddletrain.export checkpoint=... precision=int8 calibration=photos/   # int8 (deploy.quantize)

The model is rebuilt from the config saved in the checkpoint, traced with ``paddle.jit.to_static`` and saved
with ``paddle.jit.save`` next to ``preprocess.json`` (input size, mean/std, resize/crop, labels). A parity
check then runs the saved model in Paddle Inference and the dygraph model on a few validation images of the
checkpoint's own dataset; a difference beyond tolerance fails the export (exit status 3).
"""
from __future__ import annotations

import json
import logging
import sys
from dataclasses import asdict
from typing import Any

import hydra
from omegaconf import DictConfig

from paddletrain._moved import forward_names
from paddletrain.cli import checked_output_command, command_task, run_command
from paddletrain.deploy.exporter import EXIT_PARITY_FAILED, ExportConfig, ExportResult, export_checkpoint

log = logging.getLogger("paddletrain")


def _report(result: ExportResult) -> None:
    log.info("Exported %s model to %s: %s", result.format, result.out_dir, ", ".join(p.name for p in result.files))
    if result.parity is not None:
        (log.info if result.parity.passed else log.error)("Export %s", result.parity)
    summary = {"out_dir": str(result.out_dir), "format": result.format, "files": [p.name for p in result.files],
               "parity": asdict(result.parity) if result.parity else None,
               "onnx_parity": asdict(result.onnx_parity) if result.onnx_parity else None,
               "precision": result.precision}
    if result.quant_algo is not None:
        summary.update(quant_algo=result.quant_algo, calibration_images=len(result.calibration),
                       quant_reduce_range=result.quant_reduce_range)
    print(json.dumps(summary))


def _quant_options(cfg: DictConfig) -> dict[str, Any]:
    """The int8 keys of an ``ExportConfig``, as :func:`export_checkpoint` takes them."""
    keys = ("calibration", "calibration_images", "quant_algo", "quant_keep_ends", "quant_reduce_range",
            "quant_bias_correction", "quant_min_agreement", "quant_max_accuracy_drop")
    return {key: cfg[key] for key in keys}


def run(cfg: DictConfig) -> int:
    """The CLI's work for an ``ExportConfig``: the exit status (0 ok, 3 parity failed).

    A usage error raises :class:`~paddletrain.errors.UserError`, which :func:`~paddletrain.cli.command_task` ends
    with one line and exit status 2, as every command does."""
    out_dir = checked_output_command(cfg, ExportConfig, "export")
    result = export_checkpoint(cfg.checkpoint, out_dir, format=cfg.format, batch=cfg.batch,
                               precision=cfg.precision, check=cfg.check, num_check_images=cfg.num_check_images,
                               data_root=cfg.data_root, device=cfg.device, cpu_threads=cfg.cpu_threads,
                               imports=list(cfg.imports), weights=cfg.weights, **_quant_options(cfg))
    _report(result)
    return EXIT_PARITY_FAILED if cfg.check and not result.passed else 0


@hydra.main(version_base="1.3", config_path="conf", config_name="export")
@command_task()
def main(cfg: DictConfig) -> None:
    sys.exit(run(cfg))


# Release 0.1 kept the library here too (e.g. `from paddletrain.export import ...`): handed on for one release.
__getattr__ = forward_names(__name__, "paddletrain.deploy.exporter")

if __name__ == "__main__":
    run_command(main)
