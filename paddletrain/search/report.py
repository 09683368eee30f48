"""What a study leaves in its sweep directory: ``best.yaml`` (the best trial as a config ``fit`` runs as it is),
``study.json`` and ``study.md`` (every trial: number, state, parameters, value, duration, pruned step) and the
pictures Optuna draws with matplotlib (optimisation history, parameter importances, intermediate values,
parallel coordinates)."""
from __future__ import annotations

import json
import logging
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from paddletrain.search.space import SearchSpace

log = logging.getLogger("paddletrain")

BEST_FILE = "best.yaml"
# The trial's user attribute that names its run directory (a trial that continues another keeps it).
RUN_DIR_ATTR = "run_dir"
# A proposal equal to a finished trial's: the number of that trial (its outcome was reused, nothing trained).
DUPLICATE_ATTR = "duplicate_of"
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
        history = trial.system_attrs.get("retry_history") or [None]  # the trials this one continues
        rows.append({"number": trial.number, "state": trial.state.name, "params": dict(trial.params),
                     "value": trial.value, "duration_seconds": duration, "pruned_step": pruned_step,
                     "continues": history[-1], "run_dir": trial.user_attrs.get(RUN_DIR_ATTR),
                     "duplicate_of": trial.user_attrs.get(DUPLICATE_ATTR),
                     "started": _iso(trial.datetime_start), "finished": _iso(trial.datetime_complete)})
    return rows


@dataclass(frozen=True)
class RunConfig:
    """How the sweep's command composed its config: the primary config's name, the config groups it knows (an
    override of one is a choice, not a value) and the config directories it added."""

    primary: str = "fit"
    groups: frozenset[str] = frozenset()
    search_path: tuple[str, ...] = ()


def best_config(study: Any, space: SearchSpace, run: RunConfig) -> str:
    """``best.yaml``: the best trial as a primary config that ``fit`` runs as it is (``python -m paddletrain.fit
    --config-dir <sweep dir> --config-name best``): the sweep's primary config, its group choices and its values,
    the fixed ones and the trial's."""
    from hydra.core.override_parser.overrides_parser import OverridesParser

    best = study.best_trial
    overrides = space.overrides(best.params)
    added: list[Any] = []
    chosen: list[Any] = []
    values: dict[str, Any] = {}
    for override in OverridesParser.create().parse_overrides(overrides):
        key, value = override.key_or_group, override.value()
        if override.is_delete():
            raise ValueError(f"{override.input_line}: a deletion has no place in a config")
        if key in run.groups:
            (added if override.is_add() else chosen).append({(key if override.is_add() else f"override {key}"): value})
            continue
        node = values
        *parents, leaf = key.split(".")
        for part in parents:
            node = node.setdefault(part, {})
        node[leaf] = value
    document: dict[str, Any] = {"defaults": [run.primary, *added, "_self_", *chosen]}
    # one run, even where the search came from a config that makes every run of it a search (hydra.mode)
    document["hydra"] = {"mode": "RUN", **({"searchpath": list(run.search_path)} if run.search_path else {})}
    document.update(values)
    head = [f"# The best trial of study {study.study_name}: number {best.number}, value {best.value}.",
            "# Run it as it is: python -m paddletrain.fit --config-dir <this directory> --config-name best"]
    return "\n".join(head) + "\n" + yaml.safe_dump(document, sort_keys=False)


def write_reports(study: Any, sweep_dir: Path, space: SearchSpace, run: RunConfig) -> None:
    """Write every report of ``study`` into ``sweep_dir`` (pictures only where Optuna can draw them)."""
    sweep_dir.mkdir(parents=True, exist_ok=True)
    rows = trial_rows(study)
    (sweep_dir / STUDY_JSON).write_text(json.dumps({"study": study.study_name, "direction": study.direction.name,
                                                    "trials": rows}, indent=2) + "\n")
    (sweep_dir / STUDY_MD).write_text(study_markdown(study.study_name, rows))
    if any(row["state"] == "COMPLETE" for row in rows):
        (sweep_dir / BEST_FILE).write_text(best_config(study, space, run))
    _pictures(study, sweep_dir)


def study_markdown(name: str, rows: list[dict[str, Any]]) -> str:
    keys = sorted({key for row in rows for key in row["params"]})
    head = ["trial", "state", *keys, "value", "seconds", "pruned after epoch", "continues"]
    lines = [f"# Study {name}", "", "| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for row in rows:
        cells = [str(row["number"]), row["state"], *(_cell(row["params"].get(k)) for k in keys), _cell(row["value"]),
                 _cell(row["duration_seconds"]), _cell(row["pruned_step"]), _cell(row["continues"])]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


def _iso(moment: Any) -> str | None:
    return moment.isoformat() if moment is not None else None


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
        except Exception as exc:  # too few trials or parameters to draw it: the study is reported without it
            log.info("study picture %s not drawn: %s", file, exc)
            continue
        figure = axes.figure if hasattr(axes, "figure") else axes.flat[0].figure
        figure.savefig(sweep_dir / file, dpi=110, bbox_inches="tight")
        plt.close(figure)
