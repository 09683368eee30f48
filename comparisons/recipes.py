"""Recipe comparison: plain vs regularised vs distilled, each arm several seeds, through the real ``fit`` CLI.

Every run is ``python -m paddletrain.fit <overrides> trainer.seed=<seed> hydra.run.dir=<runs_dir>/...`` in its
own process, exactly as a user would type it; the figures are read back from each run's ``summary.json``
(``val/top1`` of the last validation). Each table row holds the arm's mean ± sample standard deviation over the
seeds and the command that reproduces it (``$SEED`` standing for each seed).

The recipes are sized for a shared 2-core CPU (minutes per run, not hours): they compare the arms at equal
budget, they do not reach published accuracy. A run directory that already holds a ``summary.json`` is read,
not run again (``rerun=true`` to redo), so an interrupted table continues where it stopped.
"""
from __future__ import annotations

import statistics
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from paddletrain.bench.common import check_options, environment, finished
from paddletrain.bench.fitrun import FitRun, execute, merge_overrides, shell_command
from paddletrain.config import allowed
from paddletrain.errors import ConfigError

ARMS = ("plain", "regularised", "distill")
# Where the teacher's checkpoint goes in a distill arm's overrides.
TEACHER = "{teacher}"
# The regularised arms' shared parts (timm's ResNet-strikes-back A3 style, at a strength a short run can take):
# label smoothing, RandAugment and RandomErasing on the images, Mixup/CutMix on the batches.
REGULARISE = ("loss.label_smoothing=0.1",
              "data.augment=[{name:rand_augment,num_ops:2,magnitude:6},{name:random_erasing,probability:0.25}]",
              "data.mixup.mixup_alpha=0.2", "data.mixup.cutmix_alpha=1.0")
# Hinton's KD: half the loss from the teacher's temperature-2 soft targets, half from the labels.
DISTILL = ("trainer.distill.kind=kd", "trainer.distill.alpha=0.5", "trainer.distill.temperature=2")
METRIC = "val/top1"


@dataclass(frozen=True)
class Recipe:
    """One dataset's runs: overrides shared by every run, each arm's own, and the teacher the distill arm uses."""

    base: tuple[str, ...]
    arms: dict[str, tuple[str, ...]]
    teacher: tuple[str, ...]


def _recipes(cfg: RecipesBenchConfig) -> dict[str, Recipe]:
    """The measured recipes, with the data roots of ``cfg`` filled in."""
    quiet = ("callbacks.visualdl=null",)
    fashion = Recipe(
        # resnet20 at Fashion-MNIST's 28 px on 16 batches of 64 per epoch (3,072 images in 3 epochs, 5% of the
        # training set), validated once at the end on the first 2,000 test images: about two minutes on one
        # core of a loaded machine.
        base=("data=fashion_mnist", f"data.root={cfg.fashion_mnist_root}", "data.batch_size=64",
              "data.eval_batch_size=250", "data.num_workers=1", "optim=sgd", "optim.lr=0.05",
              "optim.weight_decay=5e-4", "sched=cosine", "sched.warmup_epochs=0.2", "trainer.max_epochs=3",
              "trainer.val_every_n_epochs=3", "trainer.limit_train_batches=16", "trainer.limit_val_batches=8",
              *quiet),
        arms={
            "plain": ("model=resnet20",),
            "regularised": ("model=resnet20", *REGULARISE, "model.drop_path_rate=0.05", "+callbacks.ema.decay=0.9"),
            "distill": ("model=resnet20", "trainer.distill.teacher=resnet32", f"trainer.distill.pretrained={TEACHER}",
                        *DISTILL),
        },
        # A deeper ResNet trained for twice the epochs.
        teacher=("model=resnet32", "trainer.max_epochs=6", "trainer.val_every_n_epochs=6"),
    )
    ants_bees = Recipe(
        # paddle.vision's ImageNet shufflenet_v2_x0_25 fine-tuned at 96 px on the 245 ants/bees photos for 5
        # epochs (batch 16), validated once at the end on all 153 validation photos.
        base=("data=imagefolder", f"data.root={cfg.hymenoptera_root}", "data.image_size=96",
              "data.batch_size=16", "data.num_workers=2", "model=vision", "optim=adamw", "optim.lr=1e-3",
              "optim.weight_decay=0.01", "optim.head_lr_mult=10", "sched=cosine", "sched.warmup_epochs=0",
              "trainer.max_epochs=5", "trainer.val_every_n_epochs=5", *quiet),
        arms={
            "plain": _vision("shufflenet_v2_x0_25", cfg),
            # ShuffleNetV2 has no residual branches to drop: no drop path here.
            "regularised": (*_vision("shufflenet_v2_x0_25", cfg), *REGULARISE, "+callbacks.ema.decay=0.9"),
            "distill": (*_vision("shufflenet_v2_x0_25", cfg), "trainer.distill.teacher=vision",
                        "+trainer.distill.teacher_options.arch=shufflenet_v2_x0_33",
                        f"trainer.distill.pretrained={TEACHER}", *DISTILL),
        },
        # The wider ImageNet shufflenet_v2_x0_33, fine-tuned twice as long.
        teacher=(*_vision("shufflenet_v2_x0_33", cfg), "trainer.max_epochs=10", "trainer.val_every_n_epochs=10"),
    )
    return {"fashion_mnist": fashion, "hymenoptera": ants_bees}


def _vision(arch: str, cfg: RecipesBenchConfig) -> tuple[str, ...]:
    return (f"model.arch={arch}", f"model.pretrained={Path(cfg.weights_dir) / (arch + '.pdparams')}")


@dataclass
class RecipesBenchConfig:
    datasets: list[str] = allowed(factory=lambda: ["hymenoptera", "fashion_mnist"],
                                  choices=("fashion_mnist", "hymenoptera"))
    arms: list[str] = allowed(factory=lambda: list(ARMS), choices=ARMS)
    seeds: list[int] = allowed(factory=lambda: [0, 1, 2], ge=0)
    # Every run's directory: <runs_dir>/<dataset>/<arm>/seed<seed> (the teacher: <dataset>/teacher).
    runs_dir: str = "bench-runs/recipes"
    fashion_mnist_root: str = "/usr/share/datasets/fashion-mnist"
    hymenoptera_root: str = "../shared/data/hymenoptera_data"
    # Holds shufflenet_v2_x0_25.pdparams and shufflenet_v2_x0_33.pdparams (paddle.vision's ImageNet weights).
    weights_dir: str = "../shared/data/pretrained"
    teacher_seed: int = allowed(0, ge=0)
    # A run that takes longer is stopped and reported as failed.
    timeout_minutes: float = allowed(30.0, gt=0)
    # Print the commands without running anything.
    dry_run: bool = False
    # Run again even where a summary.json exists.
    rerun: bool = False
    # Extra overrides appended to every run (e.g. [trainer.cpu_threads=1]).
    extra: list[str] = field(default_factory=list)


def row_runs(cfg: RecipesBenchConfig, dataset: str, arm: str, teacher_dir: Path | None = None) -> list[FitRun]:
    """The runs of one row (one per seed); ``arm="teacher"`` gives the single teacher run."""
    recipe = _recipes(cfg)[dataset]
    root = Path(cfg.runs_dir) / dataset
    if arm == "teacher":
        overrides, seeds, dirs = recipe.teacher, [cfg.teacher_seed], [root / "teacher"]
    else:
        overrides, seeds = recipe.arms[arm], list(cfg.seeds)
        dirs = [root / arm / f"seed{seed}" for seed in seeds]
    if any(TEACHER in o for o in overrides):
        if teacher_dir is None:
            raise ConfigError(f"bench recipes: the {dataset} {arm} arm needs the teacher's checkpoint")
        overrides = tuple(o.replace(TEACHER, str(teacher_dir)) for o in overrides)
    return [FitRun(f"{dataset} {arm} seed {seed}", run_dir,
                   merge_overrides(recipe.base, overrides, cfg.extra,
                                   [f"trainer.seed={seed}", f"hydra.run.dir={run_dir}"]))
            for seed, run_dir in zip(seeds, dirs, strict=True)]


def row_command(runs: list[FitRun]) -> str:
    """The shell command of a row: its first run's, with ``$SEED`` for the seed where the row has several."""
    first = runs[0]
    if len(runs) == 1:
        return shell_command(first.overrides)
    overrides = ["trainer.seed=$SEED" if o.startswith("trainer.seed=") else
                 f"hydra.run.dir={first.run_dir.parent}/seed$SEED" if o.startswith("hydra.run.dir=") else o
                 for o in first.overrides]
    return shell_command(overrides, variables=["SEED"])


def aggregate(values: list[float]) -> dict[str, float]:
    """Mean and sample standard deviation (n - 1; 0 for a single value) of the seeds' figures."""
    if not values:
        raise ValueError("aggregate: no values")
    return {"mean": statistics.fmean(values), "std": statistics.stdev(values) if len(values) > 1 else 0.0}


def format_mean_std(values: list[float]) -> str:
    """``mean ± std`` in percent with one decimal, e.g. ``84.3 ± 0.6``."""
    stats = aggregate(values)
    return f"{100 * stats['mean']:.1f} ± {100 * stats['std']:.1f}"


def table_row(dataset: str, arm: str, runs: list[FitRun], summaries: list[dict[str, Any] | None]) -> dict[str, Any]:
    """One table row from the runs of an arm and their summaries (None for a run without one)."""
    done = [(_seed(run), s) for run, s in zip(runs, summaries, strict=True) if s is not None and METRIC in s]
    values = [s[METRIC] for _, s in done]
    row: dict[str, Any] = {"dataset": dataset, "arm": arm, "seeds": ",".join(str(seed) for seed, _ in done) or "-",
                           "val top-1 % (mean ± std)": format_mean_std(values) if values else "not run",
                           "per seed": ", ".join(f"{100 * v:.1f}" for v in values) or "-",
                           "min per run": (round(statistics.fmean(s["wall_seconds"] for _, s in done) / 60, 1)
                                           if done else None)}
    missing = [_seed(run) for run, s in zip(runs, summaries, strict=True) if s is None or METRIC not in s]
    if missing and done:
        row["val top-1 % (mean ± std)"] += f" (seeds {missing} missing)"
    row["command"] = f"`{row_command(runs)}`"
    row["top1"] = values  # raw figures for the JSON (lists stay out of the markdown table)
    return row


def _seed(run: FitRun) -> int:
    return int(next(o for o in run.overrides if o.startswith("trainer.seed=")).split("=", 1)[1])


def run_recipes(cfg: RecipesBenchConfig) -> dict[str, Any]:
    """Every (dataset, arm) row over the seeds; the distill arms train their teacher first."""
    check_options(cfg, "recipes")
    if not cfg.seeds:
        raise ConfigError("bench recipes: seeds=[] names no seed; e.g. seeds=[0,1,2]")
    env = environment()
    rows: list[dict[str, Any]] = []
    failed: list[FitRun] = []

    def measure(run: FitRun) -> dict[str, Any] | None:
        summary = execute(run, cfg.timeout_minutes, cfg.rerun, cfg.dry_run)
        if summary is None and not cfg.dry_run:
            failed.append(run)
        return summary

    for dataset in cfg.datasets:
        teacher_dir: Path | None = None
        if "distill" in cfg.arms:
            (teacher,) = row_runs(cfg, dataset, "teacher")
            summary = measure(teacher)
            rows.append(table_row(dataset, "teacher (for distill)", [teacher], [summary]))
            teacher_dir = _teacher_checkpoint(teacher, summary)
        for arm in cfg.arms:
            if arm == "distill" and teacher_dir is None and not cfg.dry_run:
                rows.append({"dataset": dataset, "arm": arm, "val top-1 % (mean ± std)": "no teacher checkpoint"})
                continue
            runs = row_runs(cfg, dataset, arm, teacher_dir or Path("<teacher checkpoint>"))
            summaries = [measure(run) for run in runs]
            rows.append(table_row(dataset, arm, runs, summaries))
    notes = [(f"{METRIC} of each run's last validation (summary.json), in percent; std is the sample standard "
              "deviation over the seeds (n - 1)"), "`$SEED` in a command stands for each seed of its row"]
    notes += [f"FAILED: {run.label}, no summary.json (its output: {run.output})" for run in failed]
    return {"benchmark": "recipes", "config": vars(cfg), "environment": finished(env), "rows": rows,
            "notes": notes}


def _teacher_checkpoint(teacher: FitRun, summary: dict[str, Any] | None) -> Path | None:
    """The teacher's final checkpoint (its last validation is the figure reported for it)."""
    if summary is None:
        return None
    last = summary.get("last_checkpoint") or (summary.get("best") or {}).get("checkpoint")
    return Path(last) if last else None
