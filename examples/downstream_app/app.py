"""A downstream Hydra app that composes paddletrain's config groups and adds its own model and recipe.

    cd examples/downstream_app
    python app.py                                   # paddletrain's defaults, this app's name
    python app.py model=tiny_resnet +experiment=quick
"""
from pathlib import Path

import hydra
from hydra.core.hydra_config import HydraConfig
from omegaconf import DictConfig

from paddletrain.config import register_configs
from paddletrain.build import train
from paddletrain.models import BasicBlock, ResNet, register_model


@register_model
def tiny_resnet(**options) -> ResNet:
    """A 3-stage CIFAR-style ResNet with one BasicBlock per stage (this app's own model)."""
    return ResNet(BasicBlock, (1, 1, 1), stem_type="cifar", stem_width=16, stage_widths=(16, 32, 64), **options)


register_configs()  # paddletrain's schemas: every key of this app's config is validated by them


@hydra.main(version_base="1.3", config_path="conf", config_name="config")
def main(cfg: DictConfig) -> float:
    metrics = train(cfg, Path(HydraConfig.get().runtime.output_dir))
    return metrics["val/top1"]


if __name__ == "__main__":
    main()
