"""bench recipes / bench augment: command building, aggregation and reading the runs' summaries.

The long runs themselves are not part of the suite; one tiny real ``fit`` process checks the whole path.
"""
from __future__ import annotations

import json
import shlex
import statistics
from pathlib import Path

import pytest

from comparisons.recipes import (
    RecipesBenchConfig,
    aggregate,
    format_mean_std,
    row_command,
    row_runs,
    run_recipes,
    table_row,
)
from paddletrain.bench.augment import (
    AugmentBenchConfig,
    augment_row,
    augment_run,
    run_augment,
)
from paddletrain.bench.fitrun import merge_overrides, read_summary, shell_command
from paddletrain.errors import ConfigError

from .conftest import compose_fit


def _cfg(tmp_path: Path, **kw) -> RecipesBenchConfig:
    return RecipesBenchConfig(runs_dir=str(tmp_path / "runs"), hymenoptera_root="/data/ants bees",
                              weights_dir="/weights", **kw)


def _key(override: str) -> str:
    return override.split("=", 1)[0].lstrip("+~")


def _write_summary(run_dir: Path, top1: float, **extra) -> None:
    run_dir.mkdir(parents=True, exist_ok=True)
    (run_dir / "summary.json").write_text(json.dumps({"val/top1": top1, "wall_seconds": 90.0, **extra}))


def test_aggregate_is_mean_and_sample_std():
    stats = aggregate([0.80, 0.82, 0.84])
    assert stats["mean"] == pytest.approx(0.82)
    assert stats["std"] == pytest.approx(0.02)  # n - 1: sqrt((0.02^2 + 0 + 0.02^2) / 2)
    assert aggregate([0.5]) == {"mean": 0.5, "std": 0.0}
    assert format_mean_std([0.80, 0.82, 0.84]) == "82.0 ± 2.0"
    with pytest.raises(ValueError):
        aggregate([])


def test_merge_overrides_keeps_the_last_value_in_the_first_place():
    merged = merge_overrides(["a=1", "b=2"], ["+c.d=3", "a=9"], ["c.d=4"])
    assert merged == ["a=9", "b=2", "c.d=4"]


@pytest.mark.parametrize("dataset", ["fashion_mnist", "hymenoptera"])
def test_runs_of_an_arm_differ_only_in_seed_and_directory(tmp_path, dataset):
    cfg = _cfg(tmp_path, seeds=[3, 5], extra=["trainer.max_epochs=1"])
    runs = row_runs(cfg, dataset, "regularised")
    assert [r.run_dir for r in runs] == [tmp_path / "runs" / dataset / "regularised" / f"seed{s}" for s in (3, 5)]
    for run, seed in zip(runs, (3, 5), strict=True):
        keys = [_key(o) for o in run.overrides]
        assert len(keys) == len(set(keys)), "a key given twice"
        assert run.overrides[-2:] == [f"trainer.seed={seed}", f"hydra.run.dir={run.run_dir}"]
        assert "trainer.max_epochs=1" in run.overrides  # extra wins over the recipe's value
        assert run.argv()[1:3] == ["-m", "paddletrain.fit"]
    assert runs[0].overrides[:-2] == runs[1].overrides[:-2]
    plain = row_runs(cfg, dataset, "plain")[0].overrides
    assert "loss.label_smoothing=0.1" in runs[0].overrides and "loss.label_smoothing=0.1" not in plain
    assert any(o.startswith("data.mixup.cutmix_alpha=") for o in runs[0].overrides)


@pytest.mark.parametrize("dataset", ["fashion_mnist", "hymenoptera"])
def test_every_run_composes_against_the_schema(tmp_path, dataset):
    """Each command is one Hydra would accept (keys exist, values are allowed), without running it."""
    cfg = _cfg(tmp_path, seeds=[0])
    runs = [*row_runs(cfg, dataset, "teacher"), *row_runs(cfg, dataset, "plain"),
            *row_runs(cfg, dataset, "regularised"), *row_runs(cfg, dataset, "distill", Path("/ckpt"))]
    for run in runs:
        composed = compose_fit([o for o in run.overrides if not o.startswith("hydra.")])
        assert composed.trainer.seed == 0
    distill = compose_fit([o for o in runs[-1].overrides if not o.startswith("hydra.")]).trainer.distill
    assert distill.pretrained == "/ckpt" and distill.kind == "kd" and distill.alpha == 0.5
    regularised = compose_fit([o for o in runs[2].overrides if not o.startswith("hydra.")])
    assert [a["name"] for a in regularised.data.augment] == ["rand_augment", "random_erasing"]
    assert regularised.callbacks.ema.decay == 0.9 and regularised.loss.label_smoothing == 0.1


def test_distill_arm_needs_and_names_the_teacher_checkpoint(tmp_path):
    cfg = _cfg(tmp_path)
    with pytest.raises(ConfigError, match="teacher"):
        row_runs(cfg, "fashion_mnist", "distill")
    (teacher,) = row_runs(cfg, "fashion_mnist", "teacher")
    assert teacher.run_dir == tmp_path / "runs" / "fashion_mnist" / "teacher"
    assert "trainer.seed=0" in teacher.overrides
    runs = row_runs(cfg, "fashion_mnist", "distill", Path("/ckpt/epoch5"))
    assert "trainer.distill.pretrained=/ckpt/epoch5" in runs[0].overrides
    assert "trainer.distill.teacher=resnet32" in runs[0].overrides and "model=resnet32" in teacher.overrides


def test_row_command_reproduces_every_run_of_the_row(tmp_path):
    cfg = _cfg(tmp_path)
    runs = row_runs(cfg, "hymenoptera", "regularised")  # a root with a space, a list with braces
    command = row_command(runs)
    assert "trainer.seed=$SEED" in command and "seed$SEED" in command
    for run in runs:
        seed = run.overrides[-2].split("=")[1]
        # What the shell runs once $SEED is set (it expands inside double quotes and bare words alike).
        assert shlex.split(command.replace("$SEED", seed)) == ["python", "-m", "paddletrain.fit", *run.overrides]
    (teacher,) = row_runs(cfg, "hymenoptera", "teacher")
    assert shlex.split(row_command([teacher])) == ["python", "-m", "paddletrain.fit", *teacher.overrides]


def test_shell_command_quotes_what_the_shell_would_split():
    command = shell_command(["data.root=/a b/$SEED", "x=$(rm -rf)", "y=$SEED"], variables=["SEED"])
    assert command.endswith('"data.root=/a b/$SEED" \'x=$(rm -rf)\' y=$SEED')


def test_table_row_aggregates_the_finished_seeds_and_names_the_missing(tmp_path):
    runs = row_runs(_cfg(tmp_path), "fashion_mnist", "plain")
    row = table_row("fashion_mnist", "plain", runs, [{"val/top1": 0.7, "wall_seconds": 60.0}, None,
                                                     {"val/top1": 0.8, "wall_seconds": 120.0}])
    assert row["seeds"] == "0,2"
    assert row["val top-1 % (mean ± std)"] == f"75.0 ± {100 * statistics.stdev([0.7, 0.8]):.1f} (seeds [1] missing)"
    assert row["per seed"] == "70.0, 80.0" and row["min per run"] == 1.5
    assert row["command"].startswith("`python -m paddletrain.fit data=fashion_mnist")
    empty = table_row("fashion_mnist", "plain", runs, [None, None, None])
    assert empty["val top-1 % (mean ± std)"] == "not run" and empty["min per run"] is None


def test_run_recipes_reads_finished_runs_and_feeds_the_teacher_to_distill(tmp_path, capsys):
    cfg = _cfg(tmp_path, datasets=["fashion_mnist"], seeds=[0, 1])
    root = tmp_path / "runs" / "fashion_mnist"
    _write_summary(root / "teacher", 0.9, last_checkpoint=str(root / "teacher" / "checkpoints" / "last"))
    for arm, values in {"plain": (0.70, 0.72), "regularised": (0.60, 0.64), "distill": (0.74, 0.74)}.items():
        for seed, value in enumerate(values):
            _write_summary(root / arm / f"seed{seed}", value)
    result = run_recipes(cfg)  # every summary exists: nothing is run
    rows = {row["arm"]: row for row in result["rows"]}
    assert list(rows) == ["teacher (for distill)", "plain", "regularised", "distill"]
    assert rows["teacher (for distill)"]["val top-1 % (mean ± std)"] == "90.0 ± 0.0"
    assert rows["plain"]["val top-1 % (mean ± std)"] == "71.0 ± 1.4"
    assert rows["regularised"]["top1"] == [0.60, 0.64]
    assert f"trainer.distill.pretrained={root}/teacher/checkpoints/last" in rows["distill"]["command"]
    json.dumps(result)
    assert capsys.readouterr().err == ""  # nothing was started


def test_run_recipes_dry_run_lists_commands_without_running(tmp_path):
    result = run_recipes(_cfg(tmp_path, dry_run=True, datasets=["hymenoptera"], arms=["plain", "distill"]))
    assert [row["arm"] for row in result["rows"]] == ["teacher (for distill)", "plain", "distill"]
    assert all(row["val top-1 % (mean ± std)"] == "not run" for row in result["rows"])
    assert not (tmp_path / "runs").exists()


def test_a_failing_run_is_reported_with_its_output_and_the_rest_goes_on(tmp_path):
    """A real ``fit`` process that stops at its config check (max_epochs=0 is not allowed)."""
    cfg = _cfg(tmp_path, datasets=["fashion_mnist"], arms=["plain", "regularised"], seeds=[0],
               extra=["trainer.max_epochs=0"])
    _write_summary(tmp_path / "runs" / "fashion_mnist" / "regularised" / "seed0", 0.5)
    result = run_recipes(cfg)
    plain, regularised = result["rows"]
    assert plain["val top-1 % (mean ± std)"] == "not run" and regularised["top1"] == [0.5]
    output = tmp_path / "runs" / "fashion_mnist" / "plain" / "seed0.out"
    assert [n for n in result["notes"] if n.startswith("FAILED")] == [
        f"FAILED: fashion_mnist plain seed 0, no summary.json (its output: {output})"]
    assert "trainer.max_epochs" in output.read_text()


def test_read_summary_refuses_what_is_not_a_summary(tmp_path):
    assert read_summary(tmp_path) is None
    (tmp_path / "summary.json").write_text("[1, 2]")
    with pytest.raises(ConfigError, match="no JSON object"):
        read_summary(tmp_path)
    (tmp_path / "summary.json").write_text("{not json")
    with pytest.raises(ConfigError, match="cannot read"):
        read_summary(tmp_path)


def test_augment_runs_the_default_job_with_each_arm(tmp_path):
    cfg = AugmentBenchConfig(runs_dir=str(tmp_path), extra=["data.batch_size=32"])
    every = augment_run(cfg, "every", 1)
    assert every.run_dir == tmp_path / "every" / "run1"
    assert {"data.image_size=32", "data.num_workers=2", "data.batch_size=32", "data.num_repeats=3",
            "data.mixup.cutmix_alpha=1.0"} <= set(every.overrides)
    augment = next(o for o in every.overrides if o.startswith("data.augment="))
    for name in ("auto_augment", "rand_augment", "trivial_augment", "random_erasing"):
        assert name in augment
    assert not any(o.startswith("data.augment=") for o in augment_run(cfg, "default", 0).overrides)
    row = augment_row("every", [every], [{"train/data_time_share": s, "train/throughput": t}
                                         for s, t in ((0.02, 50.0), (0.30, 10.0), (0.04, 40.0))])
    assert (row["data_wait_share"], row["train_images_per_s"], row["runs"]) == (0.04, 40.0, 3)


def test_augment_end_to_end_through_the_fit_command(tmp_path):
    """One tiny real run: the command composes, runs, and its summary is read back."""
    cfg = AugmentBenchConfig(arms=["every"], image_size=16, num_workers=1, batches=2, epochs=1,
                             runs_dir=str(tmp_path), timeout_minutes=3, bare_images=8,
                             extra=["data.batch_size=8", "data.shapes.num_train=64", "trainer.cpu_threads=1"])
    result = run_augment(cfg)
    (row,) = result["rows"]
    assert row["runs"] == 1, (tmp_path / "every" / "run0.out").read_text()[-2000:]
    assert 0 <= row["data_wait_share"] < 1 and row["train_images_per_s"] > 0 and row["bare_images_per_s"] > 0
    (goal,) = result["goals"]
    assert goal["met"] == (row["data_wait_share"] < 0.10)
    summary = read_summary(tmp_path / "every" / "run0")
    assert summary["train/images"] == 16 and summary["train/data_time_share"] == row["data_wait_share"]
