"""Benchmarks that run the real ``python -m paddletrain.fit`` command line and read its ``summary.json``.

A run is measured as a user would start it: a fresh process, the overrides on its command line, its own run
directory (``hydra.run.dir``). Its console output goes to ``<run_dir>.out`` beside the run directory.
"""
from __future__ import annotations

import json
import os
import shlex
import shutil
import subprocess
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from paddletrain.errors import ConfigError

SUMMARY = "summary.json"


@dataclass
class FitRun:
    """One ``fit`` process: its overrides (the run directory last) and where it writes."""

    label: str
    run_dir: Path
    overrides: list[str]

    def argv(self) -> list[str]:
        return [sys.executable, "-m", "paddletrain.fit", *self.overrides]

    @property
    def output(self) -> Path:
        """Where the process's console output is kept."""
        return self.run_dir.parent / f"{self.run_dir.name}.out"


def merge_overrides(*groups: Sequence[str]) -> list[str]:
    """The overrides of ``groups`` in order, a later value of a key replacing the earlier one in its place.

    Keeps each command free of repeated keys, which a reader would misread.
    """
    merged: dict[str, str] = {}
    for group in groups:
        for override in group:
            merged[override.split("=", 1)[0].lstrip("+~")] = override
    return list(merged.values())


def shell_command(overrides: Sequence[str], variables: Sequence[str] = ()) -> str:
    """``python -m paddletrain.fit <overrides>`` quoted for a POSIX shell; ``$NAME`` of ``variables`` expand."""
    return " ".join(_shell_word(word, variables) for word in ["python", "-m", "paddletrain.fit", *overrides])


def _shell_word(word: str, variables: Sequence[str]) -> str:
    names = [f"${name}" for name in variables if f"${name}" in word]
    if not names:
        return shlex.quote(word)
    rest = word
    for name in names:
        rest = rest.replace(name, "")
    if shlex.quote(rest) == rest:
        return word
    if any(c in rest for c in '"\\`$'):  # cannot be double-quoted safely: expand nothing
        return shlex.quote(word)
    return f'"{word}"'


def read_summary(run_dir: Path) -> dict[str, Any] | None:
    """The run's ``summary.json``, or None when there is none (not run yet, or failed before the end)."""
    path = Path(run_dir) / SUMMARY
    if not path.is_file():
        return None
    if path.stat().st_size > 10 * 2**20:
        raise ConfigError(f"bench: {path} is over 10 MiB; not a summary.json")
    try:
        summary = json.loads(path.read_text())
    except (OSError, ValueError) as exc:
        raise ConfigError(f"bench: cannot read {path}: {exc}") from None
    if not isinstance(summary, dict):
        raise ConfigError(f"bench: {path} holds no JSON object")
    return summary


def execute(run: FitRun, timeout_minutes: float, rerun: bool = False, dry_run: bool = False) -> dict[str, Any] | None:
    """Run ``fit`` unless its summary exists (or ``rerun``); its summary, or None if it failed or timed out.

    A failure is reported on stderr with the file holding the run's output; the benchmark goes on.
    """
    summary = None if rerun else read_summary(run.run_dir)
    if summary is not None or dry_run:
        return summary
    if run.run_dir.exists():
        shutil.rmtree(run.run_dir)
    run.run_dir.parent.mkdir(parents=True, exist_ok=True)
    print(f"[{time.strftime('%H:%M:%S')}] {run.label}: {shlex.join(run.argv()[1:])}", file=sys.stderr, flush=True)
    # Offline: a run that would download weights fails with the path to put them at instead.
    env = dict(os.environ, PADDLETRAIN_OFFLINE="1")
    with open(run.output, "w") as out:
        try:
            done = subprocess.run(run.argv(), stdout=out, stderr=subprocess.STDOUT, env=env, check=False,
                                  timeout=timeout_minutes * 60)
        except subprocess.TimeoutExpired:
            print(f"  timed out after {timeout_minutes} min (output: {run.output})", file=sys.stderr)
            return None
    if done.returncode != 0:
        print(f"  failed with exit code {done.returncode} (output: {run.output})", file=sys.stderr)
        return None
    return read_summary(run.run_dir)
