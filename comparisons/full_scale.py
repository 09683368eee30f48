"""Full-scale runs side by side: validation and test top-1, wall time, throughput, time-to-accuracy, one picture.

Reads finished ``fit`` run directories (a sweep's directory, or a glob pattern, stands for the runs in it), nothing
else: ``history.json`` (every validation with the run's wall time,
:mod:`paddletrain.callbacks.history`), ``summary.json`` (throughput, world size, best checkpoint, training
arithmetic) and ``test.json``
(the last line of ``python -m paddletrain.evaluate checkpoint=<run>:best split=test``, saved in the run
directory). Writes one table row per run and, with ``picture=<file>.png``, validation top-1 against wall-clock
minutes for every run, with each run's test top-1 marked where its best checkpoint was written. With two runs or
more, a last row gives the mean ± standard deviation of each figure over the runs (what airbench and timm report
for a recipe's seeds), and how many runs reached each target.

The time to a target is the wall time of the first validation at or above it (validation once an epoch, so the
figure is an epoch's end); a run continued after an interruption counts the time of its checkpointed work, not
the minutes lost to the interruption (``continued`` says how often it was continued).
"""
from __future__ import annotations

import glob
import json
import os
import shlex
import statistics
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from paddletrain.bench.common import check_options, environment, finished
from paddletrain.callbacks.history import HISTORY_FILE, time_to_reach
from paddletrain.config import allowed
from paddletrain.errors import ConfigError

TEST_FILE = "test.json"


@dataclass
class FullScaleConfig:
    # Run directories of finished fit runs, each with history.json, summary.json and test.json.
    runs: list[str] = field(default_factory=list)
    # Targets of the time-to-accuracy columns (on the validation split).
    targets: list[float] = allowed(factory=lambda: [0.90, 0.93, 0.94, 0.949], gt=0, le=1)
    metric: str = "val/top1"
    # Where to draw validation top-1 against wall-clock minutes (PNG); null: no picture.
    picture: str | None = None
    # The accuracy line drawn across the picture (the published figure the recipe aims at); null: none.
    goal: float | None = allowed(0.949, gt=0, le=1)


def read_json(path: Path, what: str, command: str = "full_scale") -> Any:
    """A run's JSON record; a missing or unreadable one is a ConfigError naming the file (and ``what`` writes it)."""
    try:
        return json.loads(path.read_text())
    except FileNotFoundError:
        raise ConfigError(f"{command}: {path} is missing ({what})") from None
    except (OSError, ValueError) as exc:
        raise ConfigError(f"{command}: cannot read {path}: {exc}") from None


def read_run(run_dir: Path) -> dict[str, Any]:
    """What one run directory holds for the table and the picture."""
    history = read_json(run_dir / HISTORY_FILE, "written by fit's history callback")
    summary = read_json(run_dir / "summary.json", "written at the end of fit")
    test = read_json(run_dir / TEST_FILE, "the last line of `python -m paddletrain.evaluate "
                                          f"checkpoint={run_dir}:best split=test`")
    overrides = run_dir / ".hydra" / "overrides.yaml"
    return {"dir": run_dir, "rows": history.get("rows", []), "resumes": int(history.get("resumes", 0)),
            "summary": summary, "test": test,
            "overrides": overrides.read_text() if overrides.is_file() else "",
            "command": fit_command(run_dir)}


def fit_command(run_dir: Path) -> str:
    """The ``fit`` command line of a run, from its ``.hydra/`` records (config directories relative to here)."""
    hydra_dir = run_dir / ".hydra"
    try:
        overrides = yaml.safe_load((hydra_dir / "overrides.yaml").read_text()) or []
    except (OSError, yaml.YAMLError):
        return ""
    words = ["python", "-m", "paddletrain.fit"]
    try:
        sources = yaml.safe_load((hydra_dir / "hydra.yaml").read_text())["hydra"]["runtime"]["config_sources"]
    except (OSError, yaml.YAMLError, KeyError, TypeError):
        sources = []
    for source in sources:
        if source.get("provider") == "command-line" and source.get("schema") == "file":
            path = os.path.relpath(source["path"]) if Path(source["path"]).resolve().is_relative_to(Path.cwd()) \
                else source["path"]
            words += ["--config-dir", path]
    return shlex.join(words + [str(o) for o in overrides])


def table_row(run: dict[str, Any], cfg: FullScaleConfig) -> dict[str, Any]:
    summary, rows = run["summary"], run["rows"]
    best = summary.get("best") or {}
    best_epoch = best.get("epoch")
    best_row = next((r for r in rows if r.get("epoch") == best_epoch), rows[-1] if rows else {})
    world = int(summary.get("world_size", 1))
    row: dict[str, Any] = {
        "run": str(run["dir"]),
        "seed": _seed(run["overrides"]),
        f"best {cfg.metric}": _fmt(best.get("value", best_row.get(cfg.metric))),
        "at epoch": best_epoch,
        "test/top1": _fmt(run["test"].get("test/top1")),
        "minutes": round(rows[-1]["wall_seconds"] / 60, 1) if rows else None,
        "images/s": round(float(summary.get("train/throughput", 0.0)) * world, 1),
        # The training arithmetic fit recorded (paddletrain.models.flops); runs from before it was recorded: "".
        "PFLOP": round(summary["train/pflop"], 3) if isinstance(summary.get("train/pflop"), (int, float)) else "",
        "continued": run["resumes"],
    }
    for target in cfg.targets:
        seconds = time_to_reach(rows, cfg.metric, target)
        row[f"min to {target:g}"] = round(seconds / 60, 1) if seconds is not None else "not reached"
    row["command"] = f"`{run['command']}`" if run["command"] else ""
    return row


def run_directories(entries: list[str]) -> list[Path]:
    """The run directories ``runs=`` names: each entry a run directory, a sweep's directory (its runs, the
    subdirectories holding ``history.json``) or a glob pattern; in the order given, each sweep's runs sorted."""
    found: list[Path] = []
    for entry in entries:
        paths = [Path(p) for p in sorted(glob.glob(entry))] if glob.has_magic(entry) else [Path(entry)]
        for path in paths:
            inside = sorted((child for child in path.iterdir() if (child / HISTORY_FILE).is_file()),
                            key=lambda child: (not child.name.isdigit(), int(child.name) if child.name.isdigit()
                                               else 0, child.name)) \
                if path.is_dir() and not (path / HISTORY_FILE).exists() else []
            found += inside or [path]
    if not found:
        raise ConfigError(f"full_scale: runs={entries} names no run directory")
    return found


def spread_row(rows: list[dict[str, Any]], cfg: FullScaleConfig) -> dict[str, Any]:
    """Mean ± standard deviation (n - 1) of each figure over ``rows``; for a time to a target, over the runs that
    reached it, with how many did."""
    def spread(key: str, digits: int) -> str:
        values = [float(row[key]) for row in rows if isinstance(row.get(key), (int, float, str))
                  and _number(row[key]) is not None]
        if not values:
            return "not reached"
        mean = statistics.fmean(values)
        sd = statistics.stdev(values) if len(values) > 1 else 0.0
        reached = "" if len(values) == len(rows) else f" ({len(values)} of {len(rows)})"
        return f"{mean:.{digits}f} ± {sd:.{digits}f}{reached}"

    row: dict[str, Any] = {"run": f"mean ± sd of {len(rows)} runs", "seed": ""}
    row[f"best {cfg.metric}"] = spread(f"best {cfg.metric}", 4)
    row["at epoch"] = ""
    row["test/top1"] = spread("test/top1", 4)
    row["minutes"] = spread("minutes", 1)
    row["images/s"] = spread("images/s", 1)
    row["PFLOP"] = spread("PFLOP", 3) if any(r.get("PFLOP") != "" for r in rows) else ""
    row["continued"] = sum(int(r.get("continued") or 0) for r in rows)
    for target in cfg.targets:
        row[f"min to {target:g}"] = spread(f"min to {target:g}", 1)
    row["command"] = ""
    return row


def _number(value: Any) -> float | None:
    try:
        return float(value)
    except (TypeError, ValueError):
        return None


def _fmt(value: Any) -> Any:
    """Four decimals, as text: the table's formatter would keep three significant digits (0.9482 -> 0.948)."""
    return f"{float(value):.4f}" if isinstance(value, (int, float)) else value


def _seed(overrides: str) -> Any:
    for line in overrides.splitlines():
        text = line.strip().lstrip("- ").strip("'\"")
        if text.startswith("trainer.seed="):
            return text.split("=", 1)[1]
    return "default"


def draw(runs: list[dict[str, Any]], cfg: FullScaleConfig, path: Path) -> None:
    """Validation top-1 against wall-clock minutes, one line per run, its test top-1 as a marker."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    figure, axes = plt.subplots(figsize=(7.5, 4.5), dpi=120)
    for run in runs:
        rows = run["rows"]
        minutes = [r["wall_seconds"] / 60 for r in rows]
        # The run directory's last two parts (recipe/seedN): two versions of a recipe may share a seed.
        label = "/".join(Path(run["dir"]).parts[-2:])
        (line,) = axes.plot(minutes, [r.get(cfg.metric) for r in rows], marker=".", label=f"{label}: {cfg.metric}")
        best_epoch = (run["summary"].get("best") or {}).get("epoch")
        at = next((r["wall_seconds"] / 60 for r in rows if r.get("epoch") == best_epoch), minutes[-1])
        test = run["test"].get("test/top1")
        if test is not None:
            axes.plot([at], [test], marker="*", markersize=12, color=line.get_color(), linestyle="none",
                      label=f"{label}: test/top1 {test:.4f} (best checkpoint)")
    if cfg.goal is not None:
        axes.axhline(cfg.goal, color="grey", linestyle="--", linewidth=1, label=f"goal {cfg.goal:g}")
    axes.set_xlabel("wall-clock minutes")
    axes.set_ylabel("top-1")
    # From the first quarter of each run on, so that the early epochs do not flatten the part that matters.
    values = [r[cfg.metric] for run in runs for r in run["rows"][len(run["rows"]) // 4:] if cfg.metric in r]
    goal = [cfg.goal] if cfg.goal is not None else []
    axes.set_ylim(max(0.0, min(values + goal) - 0.01), min(1.0, max(values + goal) + 0.01))
    axes.grid(True, alpha=0.3)
    axes.legend(fontsize=8, loc="lower right")
    figure.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    figure.savefig(path)
    plt.close(figure)


def run_full_scale(cfg: FullScaleConfig) -> dict[str, Any]:
    check_options(cfg, "full_scale")
    env = environment()
    if not cfg.runs:
        raise ConfigError("full_scale: runs=[] names no run directory; e.g. runs=[outputs/fashion_mnist_949/seed0]")
    runs = [read_run(run_dir) for run_dir in run_directories(cfg.runs)]
    rows = [table_row(run, cfg) for run in runs]
    if len(rows) > 1:
        rows.append(spread_row(rows, cfg))
    if cfg.picture:
        draw(runs, cfg, Path(cfg.picture))
    notes = [f"times to a target: wall minutes of the first validation with {cfg.metric} at or above it",
             "test/top1: the best checkpoint (by the validation split) on the test split, evaluated once",
             f"command: python -m comparisons full_scale runs=[{','.join(cfg.runs)}]"
             + (f" picture={shlex.quote(cfg.picture)}" if cfg.picture else "")]
    return {"benchmark": "full_scale", "config": vars(cfg), "environment": finished(env), "rows": rows,
            "notes": notes}
