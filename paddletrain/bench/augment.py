"""The Trainer's data-wait share with the augmentations on: does the loader keep up with training?

Runs the default job (``python -m paddletrain.fit``: resnet20 on the embedded shapes dataset) at
``image_size`` px with ``num_workers`` loader workers, once per arm, through the real command line, and reads
``train/data_time_share`` and ``train/throughput`` from each run's ``summary.json``:

- ``default``: the job's own transform (pad-crop + flip);
- ``recipe``: RandAugment (2 ops, magnitude 9) + RandomErasing (p 0.25) + Mixup/CutMix, timm's A3-style set;
- ``every``: every augmentation at once: colour jitter, AutoAugment, RandAugment, TrivialAugment,
  RandomErasing, Mixup/CutMix and repeated augmentation (3 repeats).

The share covers the whole fit, worker start-up included (the figure ``summary.json`` and the end table
report). ``bare_images_per_s`` is the arm's per-sample work (render + augment) in a plain loop on one core,
what one worker can supply. Goal (issue 14): under 10% for ``every`` at 2 workers on 32 px. Arms are repeated
``repeats`` times, interleaved (A B C A B C), and the median is reported, so a neighbour's load hits every arm alike.
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

MIX = ("data.mixup.mixup_alpha=0.2", "data.mixup.cutmix_alpha=1.0")
AUGMENT_ARMS: dict[str, tuple[str, ...]] = {
    "default": (),
    "recipe": ("data.augment=[{name:rand_augment,num_ops:2,magnitude:9},{name:random_erasing,probability:0.25}]",
               *MIX),
    "every": ("data.color_jitter=0.4",
              ("data.augment=[{name:auto_augment},{name:rand_augment,num_ops:2,magnitude:9},{name:trivial_augment},"
               "{name:random_erasing,probability:0.25}]"), *MIX, "data.num_repeats=3"),
}
GOAL_ARM, GOAL_SHARE = "every", 0.10
NOTE = ("data_wait_share: train/data_time_share of the whole fit (summary.json), worker start-up included; "
        "median over the repeats")


@dataclass
class AugmentBenchConfig:
    arms: list[str] = allowed(factory=lambda: list(AUGMENT_ARMS), choices=tuple(AUGMENT_ARMS))
    image_size: int = allowed(32, ge=1)
    num_workers: int = allowed(2, ge=0)
    # Training batches per epoch (trainer.limit_train_batches) and epochs; no validation, no checkpoints.
    batches: int = allowed(30, ge=2)
    epochs: int = allowed(2, ge=1)
    repeats: int = allowed(1, ge=1)
    # Samples timed in a plain loop per arm (bare_images_per_s); 0 skips it.
    bare_images: int = allowed(512, ge=0)
    runs_dir: str = "bench-runs/augment"
    timeout_minutes: float = allowed(20.0, gt=0)
    # Extra overrides for every run (e.g. [data.batch_size=64]).
    extra: list[str] = field(default_factory=list)


def augment_run(cfg: AugmentBenchConfig, arm: str, repeat: int) -> FitRun:
    """The ``fit`` run of ``arm`` (its ``repeat``-th)."""
    base = (f"data.image_size={cfg.image_size}", f"data.num_workers={cfg.num_workers}",
            f"trainer.max_epochs={cfg.epochs}", f"trainer.limit_train_batches={cfg.batches}",
            "trainer.val_every_n_epochs=0", "callbacks.visualdl=null", "callbacks.checkpoint=null")
    run_dir = Path(cfg.runs_dir) / arm / f"run{repeat}"
    return FitRun(f"augment {arm} run {repeat}", run_dir,
                  merge_overrides(base, AUGMENT_ARMS[arm], cfg.extra, [f"hydra.run.dir={run_dir}"]))


def run_augment(cfg: AugmentBenchConfig) -> dict[str, Any]:
    """Data-wait share and images/s of each arm (median over the repeats) and the issue's goal."""
    check_options(cfg, "augment")
    if not cfg.arms:
        raise ConfigError(f"bench augment: arms=[] names no arm; choose from {', '.join(AUGMENT_ARMS)}")
    env = environment()
    runs = {arm: [augment_run(cfg, arm, r) for r in range(cfg.repeats)] for arm in cfg.arms}
    summaries: dict[str, list[dict[str, Any]]] = {arm: [] for arm in cfg.arms}
    for repeat in range(cfg.repeats):
        for arm in cfg.arms:
            # A benchmark always measures afresh: an old run directory is replaced.
            summary = execute(runs[arm][repeat], cfg.timeout_minutes, rerun=True)
            if summary is not None and "train/data_time_share" in summary:
                summaries[arm].append(summary)
    rates = {arm: bare_rate(runs[arm][0], cfg.bare_images) if cfg.bare_images else None for arm in cfg.arms}
    rows = [augment_row(arm, runs[arm], summaries[arm], rates[arm]) for arm in cfg.arms]
    goals = [{"goal": f"{GOAL_ARM}: data wait < {GOAL_SHARE:.0%} at {cfg.num_workers} workers, {cfg.image_size} px",
              "measured": row["data_wait_share"], "met": row["data_wait_share"] < GOAL_SHARE}
             for row in rows if row["arm"] == GOAL_ARM and row["data_wait_share"] is not None]
    return {"benchmark": "augment", "config": vars(cfg), "environment": finished(env), "rows": rows,
            "goals": goals, "notes": [NOTE]}


def augment_row(arm: str, runs: list[FitRun], summaries: list[dict[str, Any]],
                bare_rate: float | None = None) -> dict[str, Any]:
    """One arm's row: median share and images/s of its finished runs, and the command of its first run."""
    shares = [s["train/data_time_share"] for s in summaries]
    return {"arm": arm, "runs": len(summaries),
            "data_wait_share": statistics.median(shares) if shares else None,
            "train_images_per_s": statistics.median(s["train/throughput"] for s in summaries) if summaries else None,
            "bare_images_per_s": bare_rate,
            "command": f"`{shell_command(runs[0].overrides)}`", "shares": shares}


def bare_rate(run: FitRun, images: int) -> float:
    """Images/s of the run's training samples (render or decode + every augmentation) in a plain loop on one
    core: what one loader worker can supply, to set against the Trainer's images/s. Mixup/CutMix is left out:
    it runs on the batch in the training process."""
    from hydra import compose, initialize_config_module

    from paddletrain.bench.data import bare_pass
    from paddletrain.build import build_data
    from paddletrain.config import register_configs

    register_configs()
    overrides = [o for o in run.overrides if not o.startswith("hydra.")] + ["data.num_workers=0"]
    with initialize_config_module("paddletrain.conf", version_base="1.3"):
        cfg = compose("fit", overrides=overrides)
    dataset = build_data(cfg, seed=0).train_loader.dataset

    class _First:  # the first ``count`` samples
        def __init__(self, count: int) -> None:
            self.count = min(count, len(dataset))

        def __len__(self) -> int:
            return self.count

        def __getitem__(self, index: int) -> Any:
            return dataset[index]

    bare_pass(_First(max(1, images // 8)))  # warm-up, untimed: the first arm must not pay for cold caches
    return bare_pass(_First(images))
