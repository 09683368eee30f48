"""`python -m paddletrain.ship checkpoint=<run dir>:best [val=<folder|label list>] out_dir=ship/`: what ships.

Examples::

    python -m paddletrain.ship checkpoint=outputs/fit/2026-11-23_10-00-00:best out_dir=ship/
    python -m paddletrain.ship checkpoint=... val=/data/ants_bees/val out_dir=ship/      # another folder
    python -m paddletrain.ship checkpoint=... val=val_list.txt val_root=/data/ out_dir=ship/   # a label list
    python -m paddletrain.ship checkpoint=... tolerance=0.5                            # points of top-1 (or mAP)

Every target this machine can run (:data:`TARGETS`: Paddle Inference fp32, bf16 and int8; ONNX fp32 and int8) is
exported from the checkpoint through :func:`paddletrain.export.export_checkpoint`, the one path to every target,
and evaluated on the whole validation set through its predictor, next to the checkpoint's own dygraph model on
the same preprocessed inputs. Targets this machine cannot run are listed as skipped with the reason. The report
(a table on stdout, ``report.json`` and ``report.md`` in ``out_dir``) gives per target: top-1 (mAP for a
multi-label model), its difference from the checkpoint in points, top-1 (or per-class decision) agreement with
the checkpoint, the relative logit error, latency p50/p95 at batch 1, throughput at batch 8 and 32, and the size
of the model files. A target that disagrees with the checkpoint gets a layer-by-layer comparison naming the
first layer whose output diverges (:mod:`paddletrain.deploy.divergence`).

Exit status: 0 when every exported target is within ``tolerance`` points of the checkpoint, 3
(``ExitCode.BAD_RESULT``) when one drops further or fails to export, 2 for a usage error (one line).
"""
from __future__ import annotations

import logging
import sys
from pathlib import Path

import hydra
from omegaconf import DictConfig

from paddletrain._moved import forward_names
from paddletrain.cli import checked_output_command, command_task, run_command
from paddletrain.deploy.shipping import PREPROCESS_TOLERANCE, REPORT_JSON, REPORT_MD, ShipConfig, compare_targets
from paddletrain.errors import ExitCode, UserError

log = logging.getLogger("paddletrain")


def run(cfg: DictConfig) -> int:
    """The CLI's work for a ``ShipConfig``: the exit status (0 ships, 3 a target dropped).

    A usage error raises :class:`~paddletrain.errors.UserError`, which :func:`~paddletrain.cli.command_task` ends
    with one line and exit status 2, as every command does."""
    out_dir = checked_output_command(cfg, ShipConfig, "ship")
    if cfg.device == "gpu":
        raise UserError("device=gpu: ship compares CPU targets (Paddle Inference on oneDNN, onnxruntime's CPU "
                        "provider); use device=cpu or auto")
    # Every other key of the schema is an argument of compare_targets of the same name.
    options = {key: cfg[key] for key in ShipConfig.__dataclass_fields__
               if key not in ("checkpoint", "out_dir", "device", "imports")}
    report = compare_targets(cfg.checkpoint, out_dir, imports=list(cfg.imports), **options)
    print(report.table())
    print(f"\nreport: {Path(out_dir) / REPORT_JSON}, {Path(out_dir) / REPORT_MD}")
    if not report.preprocessing_matches:
        log.error("preprocess.json's pipeline differs from training's eval transform by up to %.2e on these images "
                  "(allowed %.0e): every target is fed otherwise than the checkpoint was validated",
                  report.preprocess_max_diff, PREPROCESS_TOLERANCE)
    if report.dropped():
        log.error("%s", "; ".join(f"{t.target} " + (f"failed: {t.reason}" if t.status == "failed" else
                                                    f"drops {-t.delta_points:.2f} points (tolerance "
                                                    f"{report.tolerance:g})") for t in report.dropped()))
    return ExitCode.OK if report.passed else ExitCode.BAD_RESULT


@hydra.main(version_base="1.3", config_path="conf", config_name="ship")
@command_task()
def main(cfg: DictConfig) -> None:
    sys.exit(run(cfg))


# Release 0.1 kept the library here too (e.g. `from paddletrain.ship import ...`): handed on for one release.
__getattr__ = forward_names(__name__, "paddletrain.deploy.shipping")

if __name__ == "__main__":
    run_command(main)
