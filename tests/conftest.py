"""Shared fixtures: compose paddletrain's configs the way the CLI does, shrunk to run in seconds on a CPU."""
from __future__ import annotations

import os
import subprocess
import sys
from typing import Dict, List, Optional

import pytest
from hydra import compose, initialize_config_module

import paddletrain.fit  # noqa: F401  (registers the schemas)

# A run that exercises the whole pipeline in a few seconds: tiny shapes split, 16px images, one epoch.
TINY = [
    "data.shapes.num_train=64",
    "data.shapes.num_val=32",
    "data.image_size=16",
    "data.batch_size=16",
    "trainer.max_epochs=1",
    "callbacks.progress_bar.enabled=false",
    "trainer.cpu_threads=1",
]


def compose_fit(overrides: List[str] = (), name: str = "fit"):
    """The config `python -m paddletrain.fit <overrides>` would run with."""
    with initialize_config_module("paddletrain.conf", version_base="1.3"):
        return compose(name, overrides=list(overrides))


@pytest.fixture
def tiny_overrides() -> List[str]:
    return list(TINY)


def run_module(module: str, args: List[str], cwd, timeout: float = 300,
               env: Optional[Dict[str, str]] = None) -> subprocess.CompletedProcess:
    """Run ``python -m module args`` in a fresh process, as a user would (``env``: extra variables)."""
    env = {**os.environ, "PYTHONWARNINGS": "ignore", "HYDRA_FULL_ERROR": "0", **(env or {})}
    return subprocess.run([sys.executable, "-m", module, *args], cwd=cwd, env=env, capture_output=True,
                          text=True, timeout=timeout)
