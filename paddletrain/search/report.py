"""What a study leaves in its sweep directory: ``best.yaml`` (the best trial as a config ``fit`` runs as it is),
``study.json`` and ``study.md`` (every trial: number, state, parameters, value, duration, pruned step) and the
pictures Optuna draws with matplotlib (optimisation history, parameter importances, intermediate values,
parallel coordinates)."""
from __future__ import annotations

import json
import logging
from pathlib import Path
from typing import Any

import yaml

log = logging.getLogger("paddletrain")

BEST_FILE = "best.yaml"
STUDY_JSON = "study.json"
STUDY_MD = "study.md"
PICTURES = {
    "optimization_history.png": "plot_optimization_history",
    "param_importances.png": "plot_param_importances",
    "intermediate_values.png": "plot_intermediate_values",
    "parallel_coordinate.png": "plot_parallel_coordinate",
}


def trial_rows(study: Any) -> list[dict[str, Any]]:
    """One plain row per trial, in trial order."""
    rows = []
    for trial in study.get_trials(deepcopy=False):
        duration = trial.duration.total_seconds() if trial.duration is not None else None
        pruned_step = max(trial.intermediate_values) if trial.state.name == "PRUNED" and trial.intermediate_values \
            else None
        rows.append({"number": trial.number, "state": trial.state.name, "params": dict(trial.params),
                     "value": trial.value, "duration_seconds": duration, "pruned_step": pruned_step,
                     "run_dir": trial.user_attrs.get("run_dir")})
    return rows


def best_config(study: Any, fixed: list[str]) -> str:
    """``best.yaml``: the fixed overrides and the best trial's parameters as an experiment config
    (``python -m paddletrain.fit --config-dir <sweep dir> +experiment=best``-style: ``# @package _global_``)."""
    best = study.best_trial
    lines = ["# @package _global_",
             f"# The best trial of study {study.study_name}: number {best.number}, value {best.value}.",
             "# Run it as it is: python -m paddletrain.fit " + " ".join(
                 [*fixed, *(f"{k}={v}" for k, v in best.params.items())])]
    values: dict[str, Any] = {}
    for key, value in best.params.items():
        node = values
        *parents, leaf = key.split(".")
        for part in parents:
            node = node.setdefault(part, {})
        node[leaf] = value
    return "\n".join(lines) + "\n" + yaml.safe_dump(values, sort_keys=False)


def write_reports(study: Any, sweep_dir: Path, fixed: list[str]) -> None:
    """Write every report of ``study`` into ``sweep_dir`` (pictures only where Optuna can draw them)."""
    sweep_dir.mkdir(parents=True, exist_ok=True)
    rows = trial_rows(study)
    (sweep_dir / STUDY_JSON).write_text(json.dumps({"study": study.study_name, "direction": study.direction.name,
                                                    "trials": rows}, indent=2) + "\n")
    (sweep_dir / STUDY_MD).write_text(study_markdown(study.study_name, rows))
    if any(row["state"] == "COMPLETE" for row in rows):
        (sweep_dir / BEST_FILE).write_text(best_config(study, fixed))
    _pictures(study, sweep_dir)


def study_markdown(name: str, rows: list[dict[str, Any]]) -> str:
    keys = sorted({key for row in rows for key in row["params"]})
    head = ["trial", "state", *keys, "value", "seconds", "pruned at"]
    lines = [f"# Study {name}", "", "| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for row in rows:
        cells = [str(row["number"]), row["state"], *(_cell(row["params"].get(k)) for k in keys), _cell(row["value"]),
                 _cell(row["duration_seconds"]), "" if row["pruned_step"] is None else str(row["pruned_step"])]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


def _cell(value: Any) -> str:
    if value is None:
        return ""
    return f"{value:.4g}" if isinstance(value, float) else str(value)


def _pictures(study: Any, sweep_dir: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import optuna.visualization.matplotlib as plots

    for file, name in PICTURES.items():
        try:
            axes = getattr(plots, name)(study)
        except (ValueError, RuntimeError, ZeroDivisionError) as exc:  # too few trials or parameters to draw it
            log.info("study picture %s not drawn: %s", file, exc)
            continue
        figure = axes.figure if hasattr(axes, "figure") else axes.flat[0].figure
        figure.savefig(sweep_dir / file, dpi=110, bbox_inches="tight")
        plt.close(figure)
