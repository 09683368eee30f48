"""`python -m paddletrain.evaluate checkpoint=<dir>[:best|:last] [overrides]`: loss, top-1, top-5 and balanced
accuracy of a checkpoint, with per-class precision, recall and F1 (a table in the log) and the confusion matrix.

``checkpoint`` is one checkpoint directory, or a run directory with ``:best`` or ``:last`` (see
:mod:`paddletrain.checkpoint.locate`), e.g. ``checkpoint=outputs/fit/2026-11-23_10-00-00:best``.

The configuration saved in the checkpoint is used, so the model and data match training; any override given on
the command line (e.g. ``data.root=/other/val``, ``data.eval_batch_size=256``) is applied on top of it.
``tta.flip=true`` / ``tta.crops=5`` average the predictions over flipped / cropped views (paddletrain.models.tta).
A run that validated with averaged weights (``callbacks=[default,ema]``) is evaluated with them, as its best
checkpoint was chosen; ``weights=raw`` takes the trained ones.

The whole split is scored unless ``trainer.limit_val_batches`` is given here (a training run's own limit is not
inherited). The last line on stdout is one JSON object: ``checkpoint``, ``split``, ``weights`` (and the average's
``average`` and ``decay``), ``tta``, ``images`` (the number scored; ``limit_val_batches`` when limited), the
metrics (``val/loss``, ``val/top1``, ...), and ``val/per_class`` / ``val/confusion_matrix`` as in
``summary.json``. ``split=test`` evaluates the test split of a run that held its validation split out of the
training split (``data.holdout``); the keys are then ``test/top1``, ...
(:meth:`paddletrain.metrics.ClassReport.to_dict`). Nothing is written into the working directory.

The work is :func:`paddletrain.rebuild.evaluated_checkpoint` and :func:`paddletrain.rebuild.build_evaluation`.
"""
from __future__ import annotations

import json
import logging

import hydra
from hydra.core.hydra_config import HydraConfig
from omegaconf import DictConfig

from paddletrain.checkpoint import Checkpoint
from paddletrain.cli import command_task, run_command
from paddletrain.config import register_configs
from paddletrain.rebuild import build_evaluation, evaluated_checkpoint

log = logging.getLogger("paddletrain")


def evaluate(cfg: DictConfig, checkpoint: Checkpoint) -> dict[str, float]:
    """Rebuild the model from ``cfg`` (the checkpoint's config), load the checkpoint's weights and validate;
    print the JSON line and return the metrics."""
    evaluation = build_evaluation(cfg, checkpoint)
    metrics = evaluation.run()
    line = " ".join(f"{k}={v:.4f}" for k, v in sorted(metrics.items()))
    log.info("Evaluation of %s on the %s split (%d images, %s weights): %s", checkpoint.path, evaluation.split,
             evaluation.scored_with["images"], evaluation.scored_with.get("weights"), line)
    print(json.dumps({"checkpoint": str(checkpoint.path), "split": evaluation.split, **evaluation.scored_with,
                      **metrics, **evaluation.per_class()}))
    return metrics


register_configs()


@hydra.main(version_base="1.3", config_path="conf", config_name="evaluate")
@command_task()
def main(cfg: DictConfig) -> None:
    # The command line's own overrides go on top of the config saved in the checkpoint.
    overrides = [o.lstrip("+~") for o in HydraConfig.get().overrides.task
                 if not o.lstrip("+~").startswith(("checkpoint=", "hydra"))]
    evaluate(*evaluated_checkpoint(cfg, overrides))


if __name__ == "__main__":
    run_command(main)
