"""comparisons/full_scale.py: the table and the picture of finished full-scale runs, read from their run directories."""
from __future__ import annotations

import json

import pytest
from PIL import Image

from comparisons.full_scale import FullScaleConfig, run_full_scale
from paddletrain.errors import ConfigError


def fake_run(root, name: str, seed: int, top1s: list[float], resumes: int = 0, test: float = 0.95,
             pflop: float | None = None):
    run = root / name
    (run / ".hydra").mkdir(parents=True)
    (run / ".hydra" / "overrides.yaml").write_text(f"- +experiment=fashion_mnist_949\n- trainer.seed={seed}\n")
    (run / ".hydra" / "hydra.yaml").write_text(
        "hydra:\n  runtime:\n    config_sources:\n    - {path: /pkg/conf, schema: file, provider: main}\n"
        f"    - {{path: {root / 'recipes'}, schema: file, provider: command-line}}\n")
    rows = [{"epoch": i + 1, "global_step": 100 * (i + 1), "wall_seconds": 120.0 * (i + 1), "val/top1": top1}
            for i, top1 in enumerate(top1s)]
    (run / "history.json").write_text(json.dumps({"resumes": resumes, "rows": rows}))
    best = max(range(len(top1s)), key=top1s.__getitem__)
    arithmetic = {} if pflop is None else {"train/pflop": pflop}
    (run / "summary.json").write_text(json.dumps({
        "world_size": 2, "train/throughput": 300.0, **arithmetic,
        "best": {"monitor": "val/top1", "value": top1s[best], "epoch": best + 1}}))
    (run / "test.json").write_text(json.dumps({"split": "test", "test/top1": test}))
    return run


def test_rows_give_best_val_test_minutes_throughput_and_time_to_each_target(tmp_path):
    first = fake_run(tmp_path, "seed0", 0, [0.85, 0.91, 0.935, 0.95, 0.948], test=0.9512, pflop=0.27612)
    second = fake_run(tmp_path, "seed1", 1, [0.80, 0.92, 0.93], resumes=1, test=0.93)
    picture = tmp_path / "curves.png"
    result = run_full_scale(FullScaleConfig(runs=[str(first), str(second)], picture=str(picture)))
    one, two, spread = result["rows"]
    assert one["seed"] == "0" and one["best val/top1"] == "0.9500" and one["at epoch"] == 4
    assert one["test/top1"] == "0.9512" and one["minutes"] == 10.0 and one["images/s"] == 600.0
    assert one["command"] == (f"`python -m paddletrain.fit --config-dir {tmp_path / 'recipes'} "
                              "+experiment=fashion_mnist_949 trainer.seed=0`")
    assert [one[f"min to {t}"] for t in ("0.9", "0.93", "0.94", "0.949")] == [4.0, 6.0, 8.0, 8.0]
    assert two["continued"] == 1 and two["min to 0.94"] == "not reached" and two["min to 0.93"] == 6.0
    # The arithmetic fit recorded; a run from before it was recorded has none, and the spread says over how many.
    assert (one["PFLOP"], two["PFLOP"], spread["PFLOP"]) == (0.276, "", "0.276 ± 0.000 (1 of 2)")
    assert spread["run"] == "mean ± sd of 2 runs" and spread["continued"] == 1
    with Image.open(picture) as image:
        assert image.format == "PNG" and image.size[0] >= 600


def test_a_run_without_its_test_evaluation_is_named(tmp_path):
    run = fake_run(tmp_path, "seed0", 0, [0.9])
    (run / "test.json").unlink()
    with pytest.raises(ConfigError, match=r"test.json is missing .*split=test"):
        run_full_scale(FullScaleConfig(runs=[str(run)]))
    with pytest.raises(ConfigError, match="runs=\\[\\] names no run directory"):
        run_full_scale(FullScaleConfig())


def test_a_sweeps_directory_stands_for_its_runs_and_a_last_row_gives_mean_and_sd(tmp_path):
    sweep = tmp_path / "sweep"
    for seed, (top1s, test) in enumerate([([0.94, 0.95], 0.951), ([0.92, 0.94], 0.947), ([0.90, 0.93], 0.949)]):
        fake_run(sweep, str(seed + 10 if seed == 2 else seed), 10 + seed, top1s, test=test)
    (sweep / "multirun.yaml").write_text("hydra: {}\n")  # what Hydra leaves beside a sweep's runs
    result = run_full_scale(FullScaleConfig(runs=[str(sweep)], targets=[0.94]))
    *runs, spread = result["rows"]
    assert [row["seed"] for row in runs] == ["10", "11", "12"]  # numbered subdirectories in number order: 0, 1, 10
    assert spread["run"] == "mean ± sd of 3 runs"
    assert spread["best val/top1"] == "0.9400 ± 0.0100" and spread["test/top1"] == "0.9490 ± 0.0020"
    assert spread["min to 0.94"] == "3.0 ± 1.4 (2 of 3)" and spread["minutes"] == "4.0 ± 0.0"  # 2 and 4 minutes
    globbed = run_full_scale(FullScaleConfig(runs=[str(sweep / "1*")], targets=[0.94]))["rows"]
    assert [row["seed"] for row in globbed[:-1]] == ["11", "12"]
    with pytest.raises(ConfigError, match="names no run directory"):
        run_full_scale(FullScaleConfig(runs=[str(tmp_path / "nothing-*")]))
