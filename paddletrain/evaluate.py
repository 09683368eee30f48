"""`python -m paddletrain.evaluate checkpoint=<dir>[:best|:last] [overrides]`: loss, top-1, top-5 and balanced
accuracy of a checkpoint, with per-class precision, recall and F1 (a table in the log) and the confusion matrix.

``checkpoint`` is one checkpoint directory, or a run directory with ``:best`` or ``:last`` (see
:mod:`paddletrain.checkpoint.locate`), e.g. ``checkpoint=outputs/fit/2026-11-23_10-00-00:best``.

The configuration saved in the checkpoint is used, so the model and data match training; any override given on
the command line (e.g. ``data.root=/other/val``, ``data.eval_batch_size=256``) is applied on top of it.
``tta.flip=true`` / ``tta.crops=5`` average the predictions over flipped / cropped views (paddletrain.models.tta).

The last line on stdout is one JSON object: ``checkpoint``, the metrics (``val/loss``, ``val/top1``, ...), and
``val/per_class`` / ``val/confusion_matrix`` as in ``summary.json``. ``split=test`` evaluates the test split
of a run that held its validation split out of the training split (``data.holdout``); the keys are then
``test/top1``, ... (:meth:`paddletrain.metrics.ClassReport.to_dict`).
"""
from __future__ import annotations

import json
import logging

import hydra
from hydra.core.hydra_config import HydraConfig
from omegaconf import DictConfig, OmegaConf

from paddletrain.build import (
    build_criterion,
    build_data,
    build_limits,
    build_meters,
    checkpoint_config,
    checkpoint_model,
    resolve_preprocessing,
)
from paddletrain.checkpoint import Checkpoint, load_checkpoint
from paddletrain.checkpoint.locate import locate_checkpoint
from paddletrain.cli import command_task, run_command
from paddletrain.config import EvaluateConfig, check_values, register_configs
from paddletrain.data.transforms import eval_image_size
from paddletrain.engine.trainer import Trainer
from paddletrain.errors import UserError
from paddletrain.job.runtime import seed_everything, setup_runtime
from paddletrain.metrics.multilabel import MultiLabelReport
from paddletrain.models.tta import TestTimeAugmentation
from paddletrain.plugins import prepare
from paddletrain.validation import validate_config

log = logging.getLogger("paddletrain")


def evaluate(cfg: DictConfig, checkpoint: Checkpoint) -> dict[str, float]:
    """Rebuild the model from ``cfg`` (the checkpoint's config), load the checkpoint's weights and validate."""
    validate_config(cfg, use="evaluate")
    cfg = resolve_preprocessing(cfg)
    setup_runtime(cfg.trainer.device, cfg.trainer.cpu_threads)
    seed_everything(cfg.trainer.seed)
    tta = cfg.get("tta") or {}
    split = cfg.get("split", "val")
    data = build_data(cfg, seed=cfg.trainer.seed, eval_crop=tta.get("crops", 1) == 1, training=False,
                      eval_split=split)
    model = checkpoint_model(cfg, checkpoint.state, len(data.classes), data.in_chans,
                             source=f"checkpoint={checkpoint.path}")
    if tta.get("flip") or tta.get("crops", 1) > 1:  # test-time augmentation (paddletrain.models.tta)
        model = TestTimeAugmentation(model, flip=tta.flip, crops=tta.crops, crop_size=eval_image_size(cfg.data))
    # The training run's loss (val/loss as fit reports it) and the task's meters; no optimizer: it only validates.
    trainer = Trainer(model, num_classes=len(data.classes), limits=build_limits(cfg),
                      loss_fn=build_criterion(cfg, data), meters=build_meters(cfg, len(data.classes)),
                      class_names=data.classes)
    # The Trainer names what it validates val/...; the split evaluated names it here (test/top1, ...).
    metrics = {f"{split}/{key.removeprefix('val/')}": value for key, value in trainer.validate(data.val_loader).items()}
    line = " ".join(f"{k}={v:.4f}" for k, v in sorted(metrics.items()))
    log.info("Evaluation of %s on the %s split: %s", checkpoint.path, split, line)
    print(json.dumps({"checkpoint": str(checkpoint.path), "split": split, **metrics,
                      **_per_class(trainer, data.classes, split)}))
    return metrics


def _per_class(trainer: Trainer, classes: list[str], split: str) -> dict:
    """Log the last validation's per-class table; its entries for the JSON line (``<split>/per_class``, and for a
    single-label run ``<split>/classes`` and ``<split>/confusion_matrix``, as ``val/...`` in ``summary.json``)."""
    multilabel = getattr(trainer.val_meter, "report", None)
    if isinstance(multilabel, MultiLabelReport):
        log.info("Per class (threshold %g):\n%s", multilabel.threshold, "\n".join(multilabel.table(classes)))
        return {f"{split}/per_class": multilabel.rows(classes)}
    if trainer.val_report is None:
        return {}
    for row in trainer.val_report.table():
        log.info("%s", row)
    return {f"{split}/{key}": value for key, value in trainer.val_report.to_dict().items()}


register_configs()


@hydra.main(version_base="1.3", config_path="conf", config_name="evaluate")
@command_task()
def main(cfg: DictConfig) -> None:
    # The command line's own values first: a typo is refused before a checkpoint is read. The config evaluated
    # is the checkpoint's with these on top; evaluate() checks that one as a whole.
    check_values(cfg, EvaluateConfig)
    if OmegaConf.is_missing(cfg, "checkpoint"):
        raise UserError("missing required value for checkpoint (e.g. checkpoint=outputs/<name>/<time>:best)")
    checkpoint = load_checkpoint(locate_checkpoint(cfg.checkpoint))
    prepare(cfg, checkpoint)  # the checkpoint's `imports` and the command line's
    # The command line's own overrides go on top of the saved config.
    overrides = [o.lstrip("+~") for o in HydraConfig.get().overrides.task
                 if not o.lstrip("+~").startswith(("checkpoint=", "hydra"))]
    evaluate(checkpoint_config(checkpoint.state.get("config"), overrides, base=cfg,
                               source=f"checkpoint={checkpoint.path}"), checkpoint)


if __name__ == "__main__":
    run_command(main)
