"""`comparisons overhead experiment=<recipe>`: the Trainer and plain loops on a recipe's own model, loader and
augmentation (here the Fashion-MNIST recipe on generated IDX files). Speed is measured, never asserted."""
from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from comparisons.overhead import OverheadBenchConfig, run_overhead
from comparisons.overhead_recipe import LoaderWindows
from paddletrain.bench.report import to_markdown
from paddletrain.errors import ConfigError

ROOT = Path(__file__).resolve().parents[1]
CONFIGS = ROOT / "configs"
WINDOWS, STEPS, WARMUP = 2, 2, 1


@pytest.fixture(scope="module")
def fashion_root(tmp_path_factory) -> Path:
    from tests.test_data_mnist import write_idx_split

    root = tmp_path_factory.mktemp("fashion")
    rng = np.random.default_rng(0)
    for split, count in (("train", 60), ("val", 10)):
        write_idx_split(root, split, rng.integers(0, 256, (count, 28, 28)), np.arange(count) % 10)
    return root


def _config(root: Path, **changes) -> OverheadBenchConfig:
    # 54 training images (a tenth held out) in batches of 16: the arms run over the loader's epoch end.
    options = dict(experiment="fashion_mnist_949", config_dir=str(CONFIGS), windows=WINDOWS, steps=STEPS,
                   warmup=WARMUP, cpu_threads=1, overrides=[f"data.root={root}", "data.batch_size=16"])
    return OverheadBenchConfig(**{**options, **changes})


def test_every_arm_trains_the_recipes_own_steps_window_by_window(fashion_root):
    result = run_overhead(_config(fashion_root))
    assert [row["arm"] for row in result["rows"]] == ["trainer", "hand", "bare"]
    for row in result["rows"]:
        assert len(row["windows_ms"]) == WINDOWS and row["ms_per_step"] > 0 and row["batch_size"] == 16
        assert row["model"] == "resnet20"
    recipe = result["recipe"]
    # The recipe's model options, augmentation and callbacks came along, and the trainer ran one fit of
    # warm-up + windows x steps optimizer steps (across the loader's epoch end: 3 batches an epoch).
    assert (recipe["width"], recipe["conv_input_grad"], recipe["augment"]) == (2, True, ["random_erasing"])
    assert {"checkpoint", "visualdl", "history"} <= set(recipe["callbacks"])
    assert recipe["trainer_steps"] == WARMUP + WINDOWS * STEPS
    summary = result["summary"]
    by_arm = {row["arm"]: row for row in result["rows"]}
    ratios = [h / t for h, t in zip(by_arm["hand"]["windows_ms"], by_arm["trainer"]["windows_ms"], strict=True)]
    assert min(ratios) - 1e-2 <= summary["trainer_vs_hand"] <= max(ratios) + 1e-2
    assert 0 <= summary["trainer_data_wait_share"] < 1
    assert [g["goal"] for g in result["goals"]] == ["trainer_vs_hand >= 0.98"]


def test_the_goal_carries_the_interval_of_its_window_ratios(fashion_root):
    result = run_overhead(_config(fashion_root, windows=6, steps=1, arms=["trainer", "hand"]))
    (goal,) = result["goals"]
    by_arm = {row["arm"]: row["windows_ms"] for row in result["rows"]}
    ratios = [h / t for h, t in zip(by_arm["hand"], by_arm["trainer"], strict=True)]
    # Six windows: the interval is the smallest and largest ratio (the report rounds the windows to 3 places).
    assert goal["interval"] == pytest.approx([min(ratios), max(ratios)], rel=1e-3)
    assert goal["interval"][0] <= goal["measured"] <= goal["interval"][1]
    assert "95% interval" in to_markdown(result)
    assert any(note.startswith("hand: plain loop") for note in result["notes"])


def test_loader_windows_continue_across_epochs_and_reshuffle():
    import paddle

    from paddletrain.data.sampling.sampler import ResumableBatchSampler

    class Numbers(paddle.io.Dataset):
        def __len__(self):
            return 6

        def __getitem__(self, key):  # the sampler hands out SampleKey(index, epoch, ...)
            return np.array(key.index)

    sampler = ResumableBatchSampler(Numbers(), batch_size=3, shuffle=True, seed=0)
    loader = paddle.io.DataLoader(Numbers(), batch_sampler=sampler)
    windows = LoaderWindows(loader)
    first = [batch.numpy().tolist() for batch in windows.take(3)]
    second = [batch.numpy().tolist() for batch in windows.take(2)]
    assert len(first) == 3 and len(second) == 2 and windows.epoch == 2
    assert sorted(sum(first[:2], [])) == list(range(6)) and sorted(first[2] + second[0]) == list(range(6))
    assert first[:2] != [first[2], second[0]]  # epoch 1 was reshuffled, not replayed


@pytest.mark.parametrize(("changes", "named"), [
    ({"experiment": "fashion_mnist_95"}, r"experiment=fashion_mnist_95: no .*fashion_mnist_949"),
    ({"arms": ["trainer", "model_fit"]}, r"\['model_fit'\] do not run on an experiment"),
    ({"arms": ["hand"]}, "add it to arms"),
    ({"warmup": 0}, "warmup must be >= 1"),
    ({"batch_size": 32}, r"\['batch_size'\] come from experiment=fashion_mnist_949"),
    ({"overrides": ["data.batch_sise=16"]}, "batch_sise"),
    ({"overrides": ["data.mixup.mixup_alpha=0.2"]}, "data.mixup"),
])
def test_mistakes_are_named(fashion_root, changes, named):
    cfg = _config(fashion_root)
    changes = {**changes, "overrides": [*cfg.overrides, *changes.get("overrides", [])]}
    with pytest.raises(ConfigError, match=named):
        run_overhead(_config(fashion_root, **changes))


def test_the_documented_ratio_is_the_kept_runs():
    """docs/performance.md's goal row and section give the figures of the kept run's record."""
    import json

    record = json.loads((ROOT / "docs/results/fashion_mnist_949/overhead.json").read_text())
    (goal,) = record["goals"]
    assert record["config"]["experiment"] == "fashion_mnist_949" and record["recipe"]["trainer_steps"] >= 200 + 5
    assert all(len(row["windows_ms"]) * record["config"]["steps"] >= 200 for row in record["rows"])  # the 200
    figures = f"{goal['measured']:.3f}, 95% interval {goal['interval'][0]:.3f}-{goal['interval'][1]:.3f}"
    text = (ROOT / "docs/performance.md").read_text()
    assert figures in text and goal["met"] and goal["interval"][0] >= 0.98
    for arm, label in (("trainer", "`Trainer.fit`"), ("hand", "plain loop")):
        (row,) = [row for row in record["rows"] if row["arm"] == arm]
        assert f"| {label} | {row['ms_per_step']:.0f} | {row['images_per_s']:.0f} |" in text
