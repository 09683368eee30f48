"""`python -m paddletrain.evaluate checkpoint=<dir> [overrides]`: loss, top-1 and top-5 of a checkpoint.

The configuration saved in the checkpoint is used, so the model and data match training; any override given on
the command line (e.g. ``data.root=/other/val``, ``data.eval_batch_size=256``) is applied on top of it.
"""
from __future__ import annotations

import json
import logging
import sys
from typing import TYPE_CHECKING, Dict, List

import hydra
from omegaconf import DictConfig, OmegaConf

from paddletrain.config import register_configs, validate_config
from paddletrain.errors import ExitCode, UserError
from paddletrain.registry import prepare

if TYPE_CHECKING:  # pragma: no cover
    from paddletrain.checkpoint import Checkpoint

log = logging.getLogger("paddletrain")


def checkpoint_config(cfg: DictConfig, saved: dict, overrides: List[str]) -> DictConfig:
    """The training config stored in the checkpoint, with the command-line overrides applied on top."""
    if not saved:
        raise UserError(f"checkpoint={cfg.checkpoint} holds no config; it was not written by paddletrain.fit")
    merged = OmegaConf.merge(cfg, {k: v for k, v in saved.items() if k in cfg})
    user = [o.lstrip("+~") for o in overrides if not o.lstrip("+~").startswith(("checkpoint=", "hydra"))]
    return OmegaConf.merge(merged, OmegaConf.from_dotlist(user))


def evaluate(cfg: DictConfig, checkpoint: "Checkpoint") -> Dict[str, float]:
    """Rebuild the model from ``cfg`` (the checkpoint's config), load the checkpoint's weights and validate."""
    import paddle

    from paddletrain.fit import build_data, build_model, resolve_preprocessing
    from paddletrain.runtime import seed_everything, setup_runtime
    from paddletrain.trainer import Trainer, check_state_matches

    validate_config(cfg, use="evaluate")
    cfg = resolve_preprocessing(cfg)
    setup_runtime(cfg.trainer.device, cfg.trainer.cpu_threads)
    seed_everything(cfg.trainer.seed)
    data = build_data(cfg, seed=cfg.trainer.seed)
    cfg.model.pretrained = None  # the checkpoint's weights replace any pretrained ones: don't fetch them
    model = build_model(cfg, data.classes, data.in_chans)
    check_state_matches(model, checkpoint.state["model"])
    model.set_state_dict(checkpoint.state["model"])
    trainer = Trainer(model, paddle.optimizer.SGD(parameters=model.parameters()), num_classes=len(data.classes),
                      limit_val_batches=cfg.trainer.limit_val_batches)
    metrics = trainer.validate(data.val_loader)
    line = " ".join(f"{k}={v:.4f}" for k, v in sorted(metrics.items()))
    log.info("Evaluation of %s: %s", cfg.checkpoint, line)
    print(json.dumps({"checkpoint": str(cfg.checkpoint), **metrics}))
    return metrics


register_configs()


@hydra.main(version_base="1.3", config_path="conf", config_name="evaluate")
def main(cfg: DictConfig) -> None:
    from hydra.core.hydra_config import HydraConfig

    from paddletrain.checkpoint import load_checkpoint

    try:
        if OmegaConf.is_missing(cfg, "checkpoint"):
            raise UserError("missing required value for checkpoint (e.g. checkpoint=outputs/<run>/checkpoints/<dir>)")
        checkpoint = load_checkpoint(cfg.checkpoint)
        prepare(cfg, checkpoint)  # the checkpoint's `imports` and the command line's
        overrides = list(HydraConfig.get().overrides.task)
        evaluate(checkpoint_config(cfg, checkpoint.state.get("config", {}), overrides), checkpoint)
    except UserError as exc:
        log.error("%s", exc)
        sys.exit(ExitCode.USER_ERROR)


if __name__ == "__main__":
    main()
