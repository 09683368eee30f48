"""Atomic save, verified load and resume discovery of checkpoint directories."""
from __future__ import annotations

import json
import logging
import math
import os
import random
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import numpy as np
import paddle
import pytest
from safetensors import safe_open

from paddletrain.checkpoint import (
    CheckpointError,
    find_checkpoints,
    find_latest,
    is_complete,
    load_checkpoint,
    rng_state,
    save_checkpoint,
    storage,
)


def _state(seed: int = 0) -> dict:
    rng = np.random.default_rng(seed)
    return {
        "model": {
            "layer1.0.conv1.weight": paddle.to_tensor(rng.standard_normal((2, 3)).astype("float32")),
            "half": paddle.to_tensor(rng.standard_normal(4).astype("float16")),
            "bf16": paddle.to_tensor(rng.standard_normal(5).astype("float32")).astype("bfloat16"),
            "steps": paddle.to_tensor([seed, 7], dtype="int64"),
        },
        "buffers": [np.arange(6, dtype=np.int16).reshape(2, 3), np.zeros((0, 2), np.float64), np.array(2.5)],
        "scalars": {"np_f32": np.float32(1.25), "np_i64": np.int64(-3), "np_bool": np.bool_(True),
                    "np_f64": np.float64(0.1)},
        "progress": {"epoch": 3, "lr": 0.1, "nan": math.nan, "inf": math.inf, "ninf": -math.inf, "name": "x",
                     "none": None, "flag": False, "big": 2**70},
        "tuple": (1, (2.5, "a"), [None]),
        "int_keys": {0: "zero", (1, 2): "pair", "__pt__": "clash"},
        "rng": rng_state(),
    }


def _assert_same(expected, actual, where="state"):
    if isinstance(expected, paddle.Tensor):
        assert isinstance(actual, paddle.Tensor), where
        assert actual.dtype == expected.dtype and actual.shape == expected.shape, where
        np.testing.assert_array_equal(actual.numpy(), expected.numpy(), err_msg=where)
    elif isinstance(expected, np.ndarray):
        assert type(actual) is np.ndarray and actual.dtype == expected.dtype and actual.shape == expected.shape, where
        np.testing.assert_array_equal(actual, expected, err_msg=where)
    elif isinstance(expected, np.generic):
        assert type(actual) is type(expected) and actual == expected, where
    elif isinstance(expected, float) and math.isnan(expected):
        assert isinstance(actual, float) and math.isnan(actual), where
    elif isinstance(expected, (list, tuple)):
        assert type(actual) is type(expected) and len(actual) == len(expected), where
        for i, (e, a) in enumerate(zip(expected, actual, strict=True)):
            _assert_same(e, a, f"{where}[{i}]")
    elif isinstance(expected, dict):
        assert type(actual) is dict and set(actual) == set(expected), where
        for key in expected:
            _assert_same(expected[key], actual[key], f"{where}[{key!r}]")
    elif isinstance(expected, paddle.base.libpaddle.GeneratorState):
        assert actual.__getstate__() == expected.__getstate__(), where
    else:
        assert type(actual) is type(expected) and actual == expected, where


def test_round_trip_preserves_values_types_and_dtypes(tmp_path):
    state = _state()
    path = save_checkpoint(tmp_path / "ckpt", state, {"epoch": 3, "global_step": 120, "val/top1": math.nan})
    loaded = load_checkpoint(path)
    _assert_same(state, loaded.state)
    assert loaded.state["model"]["bf16"].dtype == paddle.bfloat16
    assert loaded.metadata["global_step"] == 120 and loaded.metadata["val/top1"] == "nan"
    assert sorted(p.name for p in path.iterdir()) == ["manifest.json", "state.json", "tensors.safetensors"]
    assert [p.name for p in tmp_path.iterdir()] == ["ckpt"]
    # The files are strict JSON (no NaN literals) and safetensors keys follow the state's nesting.
    json.loads((path / "state.json").read_text(), parse_constant=lambda c: pytest.fail(f"non-strict JSON {c}"))
    with safe_open(str(path / "tensors.safetensors"), framework="numpy") as f:
        assert "model/layer1.0.conv1.weight" in f.keys()


def test_map_numpy_returns_arrays_and_bfloat16_bits(tmp_path):
    state = _state()
    loaded = load_checkpoint(save_checkpoint(tmp_path / "c", state), map_numpy=True).state
    assert isinstance(loaded["model"]["half"], np.ndarray) and loaded["model"]["half"].dtype == np.float16
    np.testing.assert_array_equal(loaded["model"]["bf16"], state["model"]["bf16"].numpy())  # uint16 bits


def test_unsupported_value_names_its_key_and_writes_nothing(tmp_path):
    with pytest.raises(TypeError, match=r"'model'\]\['bad'"):
        save_checkpoint(tmp_path / "c", {"model": {"bad": object()}})
    assert list(tmp_path.iterdir()) == []


def test_saving_over_an_existing_checkpoint_replaces_it(tmp_path):
    save_checkpoint(tmp_path / "c", _state(1), {"global_step": 1})
    save_checkpoint(tmp_path / "c", _state(2), {"global_step": 2})
    loaded = load_checkpoint(tmp_path / "c")
    assert loaded.metadata["global_step"] == 2 and loaded.state["model"]["steps"].numpy()[0] == 2
    assert [p.name for p in tmp_path.iterdir()] == ["c"]


@pytest.mark.parametrize("failing_file", ["state.json", "manifest.json"])
def test_exception_mid_save_keeps_previous_checkpoints(tmp_path, monkeypatch, failing_file):
    save_checkpoint(tmp_path / "step1", _state(1), {"global_step": 1})
    real_write = storage.write_bytes_durably

    def failing_write(path, data):
        if Path(path).name == failing_file:
            raise OSError(28, "No space left on device")
        real_write(path, data)

    monkeypatch.setattr(storage, "write_bytes_durably", failing_write)
    for target in ("step2", "step1"):  # a new name, and overwriting the existing one
        with pytest.raises(CheckpointError, match=f"cannot write checkpoint .*{target}: no space left"):
            save_checkpoint(tmp_path / target, _state(2), {"global_step": 2})
    assert [p.name for p in tmp_path.iterdir()] == ["step1"]
    assert load_checkpoint(tmp_path / "step1").metadata["global_step"] == 1


def test_error_between_renames_puts_the_previous_checkpoint_back(tmp_path, monkeypatch):
    save_checkpoint(tmp_path / "c", _state(1), {"global_step": 1})
    real_replace, calls = os.replace, []

    def fail_on_second_rename(src, dst):
        calls.append(dst)
        if len(calls) == 2:
            raise KeyboardInterrupt  # an exception, not a crash: the save can still undo the first rename
        real_replace(src, dst)

    monkeypatch.setattr(storage.os, "replace", fail_on_second_rename)
    with pytest.raises(KeyboardInterrupt):
        save_checkpoint(tmp_path / "c", _state(2), {"global_step": 2})
    monkeypatch.undo()
    assert load_checkpoint(tmp_path / "c").metadata["global_step"] == 1
    assert [p.name for p in tmp_path.iterdir()] == ["c"]
    # A real crash there (the process dies) is covered in tests/reliability/test_checkpoint_trust.py.


def test_stale_temporary_dirs_are_removed_by_the_next_save(tmp_path):
    stale = tmp_path / ".tmp-c-deadbeef"
    stale.mkdir()
    (stale / "tensors.safetensors").write_bytes(b"partial")
    save_checkpoint(tmp_path / "c", {"x": 1})
    assert [p.name for p in tmp_path.iterdir()] == ["c"]


# --- corrupt checkpoints ------------------------------------------------------------------------------
@pytest.fixture()
def saved(tmp_path) -> Path:
    return save_checkpoint(tmp_path / "ckpt", _state(), {"global_step": 5})


def _truncate(path: Path, size: int) -> int:
    full = path.stat().st_size
    with open(path, "r+b") as handle:
        handle.truncate(size)
    return full


def test_truncated_tensors_file(saved):
    full = _truncate(saved / "tensors.safetensors", 100)
    with pytest.raises(CheckpointError, match=rf"ckpt.*tensors.safetensors is truncated: 100 of {full} bytes"):
        load_checkpoint(saved)
    assert not is_complete(saved)


def test_empty_state_file(saved):
    full = _truncate(saved / "state.json", 0)
    with pytest.raises(CheckpointError, match=f"state.json is truncated: 0 of {full} bytes"):
        load_checkpoint(saved, verify=False)


def test_garbage_of_the_right_size_fails_sha256_or_parsing(saved):
    path = saved / "tensors.safetensors"
    path.write_bytes(os.urandom(path.stat().st_size))
    assert is_complete(saved) and not is_complete(saved, verify=True)
    with pytest.raises(CheckpointError, match="sha256 mismatch for tensors.safetensors"):
        load_checkpoint(saved)
    with pytest.raises(CheckpointError, match="tensors.safetensors is corrupt or unreadable"):
        load_checkpoint(saved, verify=False)


def test_garbage_state_json_without_verification(saved):
    path = saved / "state.json"
    path.write_bytes(b"{" * path.stat().st_size)
    with pytest.raises(CheckpointError, match="state.json is corrupt"):
        load_checkpoint(saved, verify=False)


def test_missing_manifest_means_incomplete_save(saved):
    (saved / "manifest.json").unlink()
    with pytest.raises(CheckpointError, match="missing manifest.json — the save did not complete"):
        load_checkpoint(saved)


def test_corrupt_manifest(saved):
    (saved / "manifest.json").write_bytes(b'{"format": "paddletrain-chec')
    with pytest.raises(CheckpointError, match="manifest.json is corrupt"):
        load_checkpoint(saved)


def test_newer_format_version_asks_for_an_upgrade(saved):
    manifest = json.loads((saved / "manifest.json").read_text())
    manifest["format_version"] = 99
    (saved / "manifest.json").write_text(json.dumps(manifest))
    with pytest.raises(CheckpointError, match="format version 99.*upgrade paddletrain"):
        load_checkpoint(saved)


def test_missing_listed_file(saved):
    (saved / "state.json").unlink()
    with pytest.raises(CheckpointError, match="state.json is missing"):
        load_checkpoint(saved)


def test_not_a_checkpoint(tmp_path):
    (tmp_path / "model.pdparams").write_bytes(b"\x80\x04")
    with pytest.raises(CheckpointError, match="is not a paddletrain checkpoint"):
        load_checkpoint(tmp_path)
    (tmp_path / "manifest.json").write_text('{"hello": 1}')
    with pytest.raises(CheckpointError, match="is not a paddletrain checkpoint"):
        load_checkpoint(tmp_path)
    with pytest.raises(CheckpointError, match="does not exist"):
        load_checkpoint(tmp_path / "nope")


# --- discovery ------------------------------------------------------------------------------------------
def test_find_checkpoints_sorts_by_step_and_find_latest_skips_corrupt_ones(tmp_path, caplog):
    for name, step in [("b", 20), ("a", 10), ("c", 30), ("d", 40)]:
        save_checkpoint(tmp_path / name, {"x": np.arange(3)}, {"global_step": step, "epoch": step // 10})
    (tmp_path / "notes").mkdir()  # unrelated directories are ignored
    broken = tmp_path / "e"
    broken.mkdir()
    (broken / "state.json").write_text("{}")  # looks like a checkpoint, has no manifest
    assert [i.path.name for i in find_checkpoints(tmp_path)] == ["a", "b", "c", "d"]
    assert [i.global_step for i in find_checkpoints(tmp_path)] == [10, 20, 30, 40]

    _truncate(tmp_path / "d" / "tensors.safetensors", 10)
    data = bytearray((tmp_path / "c" / "state.json").read_bytes())
    data[-3] ^= 1  # one flipped bit: same size, different sha256
    (tmp_path / "c" / "state.json").write_bytes(bytes(data))
    with caplog.at_level(logging.WARNING):
        assert find_latest(tmp_path) == tmp_path / "b"
    text = caplog.text
    assert f"{tmp_path / 'd'}" in text and "truncated" in text
    assert f"{tmp_path / 'c'}" in text and "sha256 mismatch" in text
    assert f"{tmp_path / 'e'}" in text and "missing manifest.json" in text
    assert find_latest(tmp_path / "missing") is None


# --- crash safety under SIGKILL ----------------------------------------------------------------------
_SAVER = textwrap.dedent("""
    import os, signal, sys
    import numpy as np
    from paddletrain.checkpoint import save_checkpoint

    root = sys.argv[1]
    signal.signal(signal.SIGCHLD, signal.SIG_IGN)  # children are reaped automatically
    state = {"w": np.random.rand(256, 1024).astype("float32"), "b": [np.arange(50000), {"step": 0}]}
    # Import once, then fork a fresh saver per request: kills are cheap, no 3 s paddle import each time.
    for line in sys.stdin:
        pid = os.fork()
        if pid == 0:
            i = int(line)
            while True:
                state["b"][1]["step"] = i
                save_checkpoint(os.path.join(root, f"ck{i % 3}"), state, {"global_step": i})
                i += 1
        print(pid, flush=True)
""")


@pytest.mark.skipif(not hasattr(os, "fork"), reason="needs fork")
def test_sigkill_mid_save_never_leaves_a_complete_looking_broken_checkpoint(tmp_path):
    script = tmp_path / "saver.py"
    script.write_text(_SAVER)
    root = tmp_path / "run"
    root.mkdir()
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(Path(__file__).parents[1]),
                                                                     os.environ.get("PYTHONPATH")]))}
    proc = subprocess.Popen([sys.executable, str(script), str(root)], stdin=subprocess.PIPE,
                            stdout=subprocess.PIPE, text=True, env=env)
    rng = random.Random(0)
    kills = 0
    try:
        for round_ in range(6):
            proc.stdin.write(f"{round_ * 1000}\n")
            proc.stdin.flush()
            pid = int(proc.stdout.readline())
            time.sleep(rng.uniform(0.05, 0.4))
            os.kill(pid, signal.SIGKILL)
            kills += 1
            deadline = time.time() + 5
            while time.time() < deadline:
                try:
                    os.kill(pid, 0)
                    time.sleep(0.01)
                except ProcessLookupError:
                    break
            visible = [p for p in root.iterdir() if not p.name.startswith(".")]
            for ckpt in visible:  # every directory that looks like a checkpoint verifies
                assert load_checkpoint(ckpt).state["b"][1]["step"] == load_checkpoint(ckpt).metadata["global_step"]
    finally:
        proc.kill()
        proc.wait()
    assert kills == 6
    complete = [p for p in root.iterdir() if not p.name.startswith(".")]
    assert complete, "no checkpoint was completed before the kills"
    save_checkpoint(root / "after", {"x": 1})  # cleans up whatever the kills left behind
    assert not [p for p in root.iterdir() if p.name.startswith(".")]
    for ckpt in root.iterdir():
        load_checkpoint(ckpt)
