"""The shipped examples run as documented (shrunk to seconds)."""
from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

EXAMPLES = Path(__file__).resolve().parents[1] / "examples"


def test_python_api_example(tmp_path):
    result = subprocess.run([sys.executable, str(EXAMPLES / "python_api.py"), "--epochs", "1", "--train-images", "256",
                             "--out", str(tmp_path / "run")], capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr[-3000:]
    assert "val/top1=" in result.stdout
    assert any((tmp_path / "run" / "checkpoints").iterdir())


def test_downstream_hydra_app_composes_paddletrain_configs(tmp_path):
    run_dir = tmp_path / "run"
    result = subprocess.run([sys.executable, "app.py", "model=tiny_resnet", "+experiment=quick",
                             "data.shapes.num_train=128", "data.shapes.num_val=32", "data.batch_size=32",
                             "trainer.max_epochs=1", f"hydra.run.dir={run_dir}"],
                            cwd=EXAMPLES / "downstream_app", capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, (result.stdout + result.stderr)[-3000:]
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["epochs"] == 1
    config = (run_dir / ".hydra" / "config.yaml").read_text()
    assert "name: tiny_resnet" in config and "name: downstream-${model.name}" in config  # its own primary config
