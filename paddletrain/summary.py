"""The end of a training run: ``summary.json`` in the run directory and a line in the log."""
from __future__ import annotations

import json
import logging
from pathlib import Path
from typing import Any

log = logging.getLogger("paddletrain")

SUMMARY_FILE = "summary.json"


def write_summary(run_dir: Path, metrics: dict[str, float], trainer: Any) -> None:
    """Write ``summary.json`` (epochs, steps, the final metrics, the run's training throughput) and log it."""
    throughput = trainer.run_throughput
    summary = {"epochs": trainer.epoch, "global_step": trainer.global_step,
               "nonfinite_steps": trainer.nonfinite_steps, **metrics}
    if throughput.images:
        summary["train/throughput"] = throughput.images_per_second
        summary["train/data_time_share"] = throughput.data_share
    (Path(run_dir) / SUMMARY_FILE).write_text(json.dumps(summary, indent=2, sort_keys=True))
    shown = " ".join(f"{k}={v:.4f}" if isinstance(v, float) else f"{k}={v}" for k, v in sorted(summary.items()))
    log.info("Summary: %s (run dir: %s)", shown, run_dir)
