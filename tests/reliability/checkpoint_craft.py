"""What an attacker (or a damaged disk) can do to a run directory, and how a CLI failure must look."""
from __future__ import annotations

import json
import re
import subprocess
from collections.abc import Callable
from pathlib import Path
from typing import Any

from paddletrain.checkpoint import find_latest
from paddletrain.checkpoint.manifest import MANIFEST, build_manifest
from paddletrain.checkpoint.storage import STATE, TENSORS
from tests.conftest import TINY, run_module


def fit_cli(run_dir: Path, *extra: str, timeout: float = 300) -> subprocess.CompletedProcess:
    """``python -m paddletrain.fit`` on the tiny shapes data, in a fresh process, into ``run_dir``."""
    return run_module("paddletrain.fit", [*TINY, f"hydra.run.dir={run_dir}", *extra], cwd=run_dir.parent,
                      timeout=timeout)


def output(result: subprocess.CompletedProcess) -> str:
    return result.stdout + result.stderr


def latest(run_dir: Path) -> Path:
    path = find_latest(run_dir / "checkpoints")
    assert path is not None, f"no checkpoint in {run_dir}"
    return path


def reseal(checkpoint: Path) -> None:
    """Rewrite the manifest so it vouches for the files as they are now: what a forger does."""
    manifest = json.loads((checkpoint / MANIFEST).read_text())
    (checkpoint / MANIFEST).write_text(json.dumps(build_manifest(checkpoint, [TENSORS, STATE],
                                                                 manifest["metadata"])))


def rewrite_state(checkpoint: Path, mutate: Callable[[dict], Any]) -> None:
    """Edit ``state.json`` of ``checkpoint`` in place (``mutate`` changes the parsed JSON) and reseal it."""
    tree = json.loads((checkpoint / STATE).read_text())
    mutate(tree)
    (checkpoint / STATE).write_text(json.dumps(tree))
    reseal(checkpoint)


def assert_one_error_line(result: subprocess.CompletedProcess, *fragments: str) -> str:
    """Exit code 2, no traceback, exactly one error line (it holds every fragment); returns that line.

    ``fit`` logs through Hydra's console handler (stdout); stderr may carry that one line at most.
    """
    text = output(result)
    assert result.returncode == 2, text[-3000:]
    assert "Traceback" not in text, text[-3000:]
    errors = [line for line in text.splitlines() if re.search(r"\]\[ERROR\]|^Error", line)]
    assert len(errors) == 1, errors or text[-3000:]
    assert len([line for line in result.stderr.splitlines() if line.strip()]) <= 1, result.stderr[-2000:]
    for fragment in fragments:
        assert fragment in errors[0], (fragment, errors[0])
    return errors[0]


def _safetensors(header: bytes, data: bytes = b"") -> bytes:
    return len(header).to_bytes(8, "little") + header + data


# Safetensors files whose header is wrong in each way a reader must survive.
BAD_TENSOR_FILES = {
    "malformed header": _safetensors(b"{not json"),
    "huge header length": (2**62).to_bytes(8, "little") + b"{}",
    "offsets out of range": _safetensors(b'{"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8000]}}', b"\0" * 8),
    "unknown dtype": _safetensors(b'{"a":{"dtype":"Q99","shape":[2],"data_offsets":[0,8]}}', b"\0" * 8),
    "dtype numpy lacks": _safetensors(b'{"a":{"dtype":"BF16","shape":[2],"data_offsets":[0,4]}}', b"\0" * 4),
    "too short": b"\x05\x00",
}
