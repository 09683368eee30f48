"""comparisons/ablation.py: the ablation table from evaluate's records of each variant's runs."""
from __future__ import annotations

import json

import pytest

from comparisons.ablation import AblationConfig, run_ablation
from paddletrain.errors import ConfigError


def record(root, variant: str, job: int, seed: int, top1: float, view: str = "") -> None:
    run = root / variant / str(job)
    (run / ".hydra").mkdir(parents=True, exist_ok=True)
    (run / ".hydra" / "overrides.yaml").write_text(f"- +experiment=x\n- trainer.seed={seed}\n")
    name = f"val-{view}.json" if view else "val.json"
    (run / name).write_text(json.dumps({"split": "val", "val/loss": 0.3, "val/top1": top1, "images": 6000}))


def test_each_variant_and_view_is_a_row_with_its_seeds_mean_and_difference_from_the_recipe(tmp_path):
    for job, (seed, top1, raw) in enumerate([(200, 0.950, 0.946), (201, 0.954, 0.948)]):
        record(tmp_path, "recipe", job, seed, top1)
        record(tmp_path, "recipe", job, seed, raw, view="raw_weights")
    record(tmp_path, "random_flip", 0, 200, 0.947)
    record(tmp_path, "random_flip", 1, 201, 0.949)
    rows = {row["variant"]: row for row in run_ablation(AblationConfig(root=str(tmp_path)))["rows"]}
    assert list(rows) == ["recipe", "random_flip", "recipe, raw_weights"]  # the baseline first
    assert rows["recipe"]["val/top1 by seed"] == "200: 0.9500, 201: 0.9540"
    assert rows["recipe"]["mean ± sd"] == "0.9520 ± 0.0028" and rows["recipe"]["vs baseline"] == ""
    assert rows["random_flip"]["vs baseline"] == "-0.0040" and rows["random_flip"]["runs"] == 2
    assert rows["recipe, raw_weights"]["vs baseline"] == "-0.0050"


def test_missing_or_foreign_records_are_named(tmp_path):
    with pytest.raises(ConfigError, match="not a directory of variants"):
        run_ablation(AblationConfig(root=str(tmp_path / "none")))
    record(tmp_path, "random_flip", 0, 1, 0.9)
    with pytest.raises(ConfigError, match=r"baseline='recipe' \(rows found: random_flip\)"):
        run_ablation(AblationConfig(root=str(tmp_path)))
    (tmp_path / "random_flip" / "0" / "val.json").write_text('{"loss": 1}')
    with pytest.raises(ConfigError, match=r"val.json holds no single \*/top1"):
        run_ablation(AblationConfig(root=str(tmp_path), baseline="random_flip"))
