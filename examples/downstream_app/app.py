"""A downstream Hydra app that composes paddletrain's config groups and adds its own model, dataset and recipe.

    cd examples/downstream_app
    python app.py                                   # paddletrain's defaults, this app's name
    python app.py model=tiny_resnet +experiment=quick
    python app.py model=tiny_resnet data=bars +experiment=quick

The model and the dataset live in the package next to this script (``downstream_app``), which registers them
when imported. Installed (``pip install .``), the package is also a paddletrain plugin: ``python -m
paddletrain.fit model.name=tiny_resnet``, ``paddletrain.evaluate`` and ``paddletrain.export`` find them too.
"""
from __future__ import annotations

from pathlib import Path

import downstream_app  # noqa: F401  (registers "tiny_resnet" and "bars")
import hydra
from hydra.core.hydra_config import HydraConfig
from omegaconf import DictConfig

from paddletrain.build import train
from paddletrain.config import register_configs

register_configs()  # paddletrain's schemas: every key of this app's config is validated by them


@hydra.main(version_base="1.3", config_path="conf", config_name="config")
def main(cfg: DictConfig) -> float:
    metrics = train(cfg, Path(HydraConfig.get().runtime.output_dir))
    return metrics["val/top1"]


if __name__ == "__main__":
    main()
