"""The recipes of configs/experiment: each composes, validates, names its source and published figure, and
trains a few steps on generated images and on the real ants/bees images."""
from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import paddle
import pytest
from hydra import compose, initialize_config_module
from PIL import Image

from paddletrain.checkpoint import save_checkpoint
from paddletrain.models import create_model
from paddletrain.validation import validate_config
from tests.conftest import run_module

CONFIGS = Path(__file__).resolve().parents[1] / "configs"
HYMENOPTERA = Path("/work/shared/data/hymenoptera_data")
# Recipe -> (words its comment must name as the source, the published ImageNet-1k top-1).
RECIPES = {
    "resnet50_vd_paddleclas": (("PaddleClas", "ResNet50_vd"), "79.1%"),
    "resnet50_rsb_a2": (("ResNet strikes back", "Table 1"), "79.8%"),
    "resnet50_rsb_a3": (("ResNet strikes back", "Table 1"), "78.1%"),
    "distill_ssld": (("PaddleClas SSLD", "ResNet50_vd_ssld"), "83.0%"),
}
# CPU-sized: 32 px, batches of 4, two training batches and one validation batch.
SMALL = ["data.image_size=32", "data.eval_resize=36", "data.batch_size=4", "data.num_workers=0",
         "data.persistent_workers=false", "trainer.max_epochs=1", "trainer.limit_train_batches=2",
         "trainer.limit_val_batches=1", "sched.warmup_epochs=0", "trainer.cpu_threads=1",
         "callbacks.progress_bar.enabled=false"]


def compose_recipe(name: str, *overrides: str):
    with initialize_config_module("paddletrain.conf", version_base="1.3"):
        return compose("fit", overrides=[f"hydra.searchpath=[file://{CONFIGS}]", f"+experiment={name}",
                                         *overrides])


@pytest.mark.parametrize("name", RECIPES)
def test_recipe_composes_validates_and_names_its_source(name, tmp_path):
    cfg = compose_recipe(name, f"data.root={tmp_path}")
    validate_config(cfg)
    assert cfg.name == name
    header = "".join(line for line in (CONFIGS / "experiment" / f"{name}.yaml").read_text().splitlines(True)
                     if line.startswith("#")).replace("\n#", "")
    words, figure = RECIPES[name]
    assert all(word in header for word in words) and f"top-1 {figure}" in header.replace("\n", " ")


def test_recipes_hold_their_published_ingredients(tmp_path):
    vd = compose_recipe("resnet50_vd_paddleclas", f"data.root={tmp_path}")
    assert (vd.model.name, vd.optim.name, vd.optim.lr, vd.optim.weight_decay, vd.trainer.max_epochs) == \
        ("resnet50_vd", "sgd", 0.1, 7e-5, 200)
    assert vd.data.mixup.mixup_alpha == 0.2 and vd.loss.label_smoothing == 0.1
    a2, a3 = (compose_recipe(n, f"data.root={tmp_path}") for n in ("resnet50_rsb_a2", "resnet50_rsb_a3"))
    for cfg, epochs, lr, magnitude, size in ((a2, 300, 5e-3, 7, 224), (a3, 100, 8e-3, 6, 160)):
        assert (cfg.optim.name, cfg.loss.name, cfg.loss.target_threshold) == ("lamb", "binary_cross_entropy", 0.2)
        assert (cfg.trainer.max_epochs, cfg.optim.lr, cfg.data.image_size) == (epochs, lr, size)
        assert [dict(a) for a in cfg.data.augment][0]["magnitude"] == magnitude
        assert (cfg.data.mixup.mixup_alpha, cfg.data.mixup.cutmix_alpha) == (0.1, 1.0)
    assert (a2.model.drop_path_rate, a3.model.drop_path_rate) == (0.05, 0.0)
    ssld = compose_recipe("distill_ssld", f"data.root={tmp_path}")
    assert (ssld.trainer.distill.kind, ssld.trainer.distill.alpha, ssld.model.name) == ("ssld", 1.0, "resnet50_vd")


def _image_folder(root: Path, per_class: int = 6, size: int = 40) -> Path:
    rng = np.random.default_rng(0)
    for split, count in (("train", per_class), ("val", 2)):
        for label, name in enumerate(("ants", "bees")):
            folder = root / split / name
            folder.mkdir(parents=True)
            for i in range(count):
                pixels = rng.integers(0, 256, (size, size + 8, 3), dtype=np.uint8)
                pixels[..., label] = 255  # a colour cue per class
                Image.fromarray(pixels).save(folder / f"{i}.jpg")
    return root


def _teacher_checkpoint(tmp_path: Path) -> Path:
    """A small teacher saved as a paddletrain checkpoint directory (the recipe's ImageNet teacher would be
    downloaded)."""
    paddle.seed(0)
    return save_checkpoint(tmp_path / "teacher", {"model": create_model("resnet18_vd", num_classes=2).state_dict()})


def _fit_recipe(name: str, root: Path, tmp_path: Path) -> dict:
    extra = []
    if name == "distill_ssld":
        unlabeled = _image_folder(tmp_path / "unlabeled_images") / "train"  # any folder of images
        extra = ["trainer.distill.teacher=resnet18_vd", f"trainer.distill.pretrained={_teacher_checkpoint(tmp_path)}",
                 f"trainer.distill.unlabeled_root={unlabeled}"]
    run_dir = tmp_path / "run"
    result = run_module("paddletrain.fit", ["--config-dir", str(CONFIGS), f"+experiment={name}", f"data.root={root}",
                                            *SMALL, *extra, f"hydra.run.dir={run_dir}"], cwd=tmp_path)
    output = result.stdout + result.stderr
    assert result.returncode == 0, output[-3000:]
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["global_step"] == 2 and np.isfinite(summary["train/loss"]), summary
    if name == "distill_ssld":
        assert "Added 12 unlabeled images" in output
    return summary


@pytest.mark.parametrize("name", RECIPES)
def test_recipe_trains_a_few_steps_on_generated_images(name, tmp_path):
    _fit_recipe(name, _image_folder(tmp_path / "images"), tmp_path)


@pytest.mark.skipif(not HYMENOPTERA.is_dir(), reason=f"the ants/bees images are not at {HYMENOPTERA}")
@pytest.mark.parametrize("name", RECIPES)
def test_recipe_trains_a_few_steps_on_the_ants_and_bees_images(name, tmp_path):
    _fit_recipe(name, HYMENOPTERA, tmp_path)
