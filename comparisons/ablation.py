"""An ablation table: a recipe's validation top-1 with each of its pieces removed in turn, over seeds.

Reads, nothing else, the records ``evaluate`` leaves under one directory laid out as

    <root>/<variant>/<job>/val.json         the best checkpoint of one run of the variant, scored as that run validates
    <root>/<variant>/<job>/val-<view>.json  the same checkpoint scored another way (e.g. ``weights=raw``, TTA off)

where ``<variant>/`` is one Hydra sweep over the seeds (``hydra.sweep.dir=<root>/<variant>``) and each JSON file
is the last line of ``python -m paddletrain.evaluate checkpoint=<job>:best`` (the validation split), with the
command line's changes for a view. A piece that lives in training (the flip, the translation, label smoothing)
is a variant: its own runs, trained without it. A piece that lives in evaluation (weight averaging, test-time
augmentation) is a view of the recipe's own checkpoints. Each row gives every seed's top-1, their mean ± sd and
the difference of the mean from the baseline's (the full recipe).
"""
from __future__ import annotations

import json
import statistics
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from paddletrain.bench.common import check_options, environment, finished
from paddletrain.errors import ConfigError


@dataclass
class AblationConfig:
    # The directory of variants (one Hydra sweep each), as the module docstring lays it out.
    root: str = ""
    # The variant that is the full recipe: the other rows are compared with it.
    baseline: str = "recipe"


def _top1(path: Path) -> float:
    """The top-1 of one ``evaluate`` record (``val/top1``, or the split it names), or a ConfigError naming it."""
    try:
        record = json.loads(path.read_text())
    except (OSError, ValueError) as exc:
        raise ConfigError(f"ablation: cannot read {path}: {exc} (the last line of `python -m paddletrain.evaluate "
                          "checkpoint=<run>:best`)") from None
    values = [value for key, value in record.items() if key.endswith("/top1") and isinstance(value, (int, float))]
    if len(values) != 1:
        raise ConfigError(f"ablation: {path} holds no single */top1 figure (an evaluate record has one)")
    return float(values[0])


def _seed(job: Path) -> str:
    overrides = job / ".hydra" / "overrides.yaml"
    if overrides.is_file():
        for line in overrides.read_text().splitlines():
            text = line.strip().lstrip("- ").strip("'\"")
            if text.startswith("trainer.seed="):
                return text.split("=", 1)[1]
    return job.name


def read_rows(root: Path) -> dict[str, dict[str, float]]:
    """``{row label: {seed: top-1}}``: each variant's ``val.json`` under its name, each view as "variant, view"."""
    rows: dict[str, dict[str, float]] = {}
    for record in sorted(root.glob("*/*/val*.json")):
        job, variant = record.parent, record.parent.parent.name
        view = record.stem[len("val-"):] if record.stem.startswith("val-") else ""
        label = f"{variant}, {view}" if view else variant
        rows.setdefault(label, {})[_seed(job)] = _top1(record)
    return rows


def run_ablation(cfg: AblationConfig) -> dict[str, Any]:
    check_options(cfg, "ablation")
    env = environment()
    root = Path(cfg.root)
    if not cfg.root or not root.is_dir():
        raise ConfigError(f"ablation: root={cfg.root!r} is not a directory of variants (<root>/<variant>/<job>/)")
    rows = read_rows(root)
    if cfg.baseline not in rows:
        raise ConfigError(f"ablation: no {root / cfg.baseline}/<job>/val.json for baseline={cfg.baseline!r} "
                          f"(rows found: {', '.join(rows) or 'none'})")
    base = statistics.fmean(rows[cfg.baseline].values())
    table = []
    for label in [cfg.baseline, *sorted(label for label in rows if label != cfg.baseline)]:
        values = rows[label]
        mean = statistics.fmean(values.values())
        sd = statistics.stdev(values.values()) if len(values) > 1 else 0.0
        table.append({"variant": label, "runs": len(values),
                      "val/top1 by seed": ", ".join(f"{seed}: {top1:.4f}" for seed, top1 in sorted(values.items())),
                      "mean ± sd": f"{mean:.4f} ± {sd:.4f}",
                      "vs baseline": "" if label == cfg.baseline else f"{mean - base:+.4f}"})
    notes = ["each figure: the best checkpoint of one run on the validation split (`evaluate`), as its file says",
             f"vs baseline: the row's mean less {cfg.baseline}'s",
             f"command: python -m comparisons ablation root={cfg.root}"]
    return {"benchmark": "ablation", "config": vars(cfg), "environment": finished(env), "rows": table,
            "notes": notes}
