"""Where a finished full-scale run's wall time went: its own records, its steps split by a step profile.

The run's records (``history.json`` and ``summary.json``, as :mod:`comparisons.full_scale` reads them) give the
epoch-level split: the training loops (``seconds/train`` of every epoch), the validations (``seconds/validation``)
and what is left of the wall time (checkpoints, epoch-end logs); within the loops, the steps (``train/step_seconds``)
and their data wait (``train/data_time_share`` of them), the rest being the loop's per-step hooks and logging.
The steps' compute (their time less the data wait) is split into forward, backward and optimizer by the shares of
a ``python -m comparisons step_profile ... out=<file>.json`` result for the run's model and batch, measured alone
on one core. The run's figures are rank 0's; every rank runs the same steps.
"""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from comparisons.full_scale import read_json
from paddletrain.bench.common import check_options, environment, finished
from paddletrain.callbacks.history import HISTORY_FILE
from paddletrain.errors import ConfigError

PARTS = ("forward", "backward", "optimizer")


@dataclass
class TimeSplitConfig:
    # A finished fit run (or its kept records): history.json and summary.json.
    run: str = ""
    # A step_profile result (its out=) for the run's model, batch and threads.
    profile: str = ""


def profile_shares(profile: dict[str, Any]) -> dict[str, float]:
    """Forward/backward/optimizer as fractions of a profiled step, from the step profile's ms column."""
    try:
        ms = {row["part of a step"]: float(row["ms"]) for row in profile["rows"]}
        total = sum(ms[part] for part in PARTS)
    except (KeyError, TypeError, ValueError):
        raise ConfigError("time_split: profile= is not a step_profile result (rows of 'part of a step' and "
                          "'ms'); write one with `python -m comparisons step_profile ... out=<file>.json`") from None
    return {part: ms[part] / total for part in PARTS}


def split_run(history: dict[str, Any], summary: dict[str, Any], shares: dict[str, float]) -> list[dict[str, Any]]:
    """The run's wall time, part by part (seconds and share); the parts add up to the wall time."""
    rows = history.get("rows") or []
    try:
        wall = float(rows[-1]["wall_seconds"])
        loops = sum(float(row["seconds/train"]) for row in rows)
        validation = sum(float(row.get("seconds/validation", 0.0)) for row in rows)
        steps = float(summary["train/step_seconds"])
        data_wait = steps * float(summary["train/data_time_share"])
    except (IndexError, KeyError, TypeError, ValueError):
        raise ConfigError("time_split: the run's history.json rows need wall_seconds and seconds/train, its "
                          "summary.json train/step_seconds and train/data_time_share (a finished fit run)") from None
    compute = steps - data_wait
    parts = [("forward (model and loss)", compute * shares["forward"]),
             ("backward", compute * shares["backward"]),
             ("optimizer step and clearing gradients", compute * shares["optimizer"]),
             ("data wait", data_wait),
             ("per-step hooks and logging in the loop", loops - steps),
             ("validation", validation),
             ("checkpoints and epoch-end logs", wall - loops - validation)]
    return [{"part": name, "seconds": round(seconds, 1), "share": f"{seconds / wall:.2%}"} for name, seconds in parts]


def run_time_split(cfg: TimeSplitConfig) -> dict[str, Any]:
    check_options(cfg, "time_split")
    env = environment()
    if not cfg.run or not cfg.profile:
        raise ConfigError("time_split: name both run=<run dir> and profile=<step_profile result .json>")
    run = Path(cfg.run)
    history = read_json(run / HISTORY_FILE, "written by fit's history callback", "time_split")
    summary = read_json(run / "summary.json", "written at the end of fit", "time_split")
    profile = read_json(Path(cfg.profile), "`python -m comparisons step_profile ... out=<file>.json`", "time_split")
    for path, record in ((run / HISTORY_FILE, history), (run / "summary.json", summary), (cfg.profile, profile)):
        if not isinstance(record, dict):
            raise ConfigError(f"time_split: {path} holds a JSON {type(record).__name__}, not the record's object")
    shares = profile_shares(profile)
    rows = split_run(history, summary, shares)
    world = int(summary.get("world_size", 1))
    per_rank = float(summary.get("train/throughput", 0.0))
    batch_size, step_seconds = (profile.get("config") or {}).get("batch_size"), profile.get("step_seconds")
    alone = batch_size / step_seconds if batch_size and step_seconds else None
    minutes = float(history["rows"][-1]["wall_seconds"]) / 60
    notes = [f"{cfg.run}: {minutes:.1f} minutes, {world} rank(s) at "
             f"{per_rank:.1f} images/s each" + (f"; the profiled step alone on its core: {alone:.1f} images/s"
                                                if alone else ""),
             "forward/backward/optimizer: the steps' compute (less the data wait) split by the step profile's shares "
             f"({', '.join(f'{part} {share:.1%}' for part, share in shares.items())})"]
    return {"benchmark": "time_split", "config": vars(cfg), "environment": finished(env), "rows": rows,
            "notes": notes, "shares": shares, "images_per_second_alone": alone}
