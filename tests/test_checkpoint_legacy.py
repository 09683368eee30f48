"""Pickled paddle.save files: refused without trust, loaded without running code by safe_unpickle."""
from __future__ import annotations

import os
import pickle
import subprocess

import numpy as np
import paddle
import pytest

from paddletrain.checkpoint import CheckpointError, load_legacy, safe_unpickle


class _RunsShell:
    def __init__(self, command):
        self.command = command

    def __reduce__(self):
        return os.system, (self.command,)


class _RunsEval:
    def __init__(self, code):
        self.code = code

    def __reduce__(self):
        return eval, (self.code,)


class _RunsSubprocess:
    def __init__(self, marker):
        self.marker = marker

    def __reduce__(self):
        return subprocess.call, (["touch", self.marker],)


def _malicious(tmp_path, payload_type, protocol):
    marker = tmp_path / "pwned"
    payload = {
        "shell": _RunsShell(f"touch {marker}"),
        "eval": _RunsEval(f"open({str(marker)!r}, 'w')"),
        "subprocess": _RunsSubprocess(str(marker)),
    }[payload_type]
    path = tmp_path / "model.pdparams"
    # Hidden inside an ordinary-looking state dict, next to a real array.
    path.write_bytes(pickle.dumps({"fc.weight": np.ones(2, np.float32), "fc.bias": payload}, protocol=protocol))
    return path, marker


@pytest.mark.parametrize("payload_type", ["shell", "eval", "subprocess"])
@pytest.mark.parametrize("protocol", [2, 4])
def test_malicious_pickle_never_runs(tmp_path, payload_type, protocol):
    path, marker = _malicious(tmp_path, payload_type, protocol)
    with pytest.raises(CheckpointError, match=r"refusing to unpickle .*model.pdparams.*not a numpy array"):
        safe_unpickle(path)
    with pytest.raises(CheckpointError, match="trainer.trust_pickle=true"):
        load_legacy(path)
    with pytest.raises(CheckpointError, match="trust_pickle"):
        load_legacy(tmp_path)  # the directory form refuses too
    assert not marker.exists()


def _small_layer():
    paddle.seed(0)
    return paddle.nn.Sequential(paddle.nn.Conv2D(3, 4, 3), paddle.nn.BatchNorm2D(4), paddle.nn.Flatten(),
                                paddle.nn.Linear(4, 2))


def test_real_paddle_save_loads_through_safe_unpickle(tmp_path):
    layer = _small_layer()
    optimizer = paddle.optimizer.Momentum(parameters=layer.parameters())
    layer(paddle.randn([1, 3, 3, 3])).sum().backward()
    optimizer.step()
    paddle.save(layer.state_dict(), str(tmp_path / "m.pdparams"))
    paddle.save(optimizer.state_dict(), str(tmp_path / "m.pdopt"))

    weights = safe_unpickle(tmp_path / "m.pdparams")
    assert set(weights) == set(layer.state_dict())  # paddle's name table is dropped, like paddle.load does
    for name, tensor in layer.state_dict().items():
        np.testing.assert_array_equal(weights[name], tensor.numpy())
    fresh = _small_layer()
    fresh.set_state_dict(weights)
    np.testing.assert_array_equal(fresh[3].weight.numpy(), layer[3].weight.numpy())

    opt_state = safe_unpickle(tmp_path / "m.pdopt")
    assert all(isinstance(v, np.ndarray) for v in opt_state.values()) and opt_state


def test_nested_tensors_saved_as_name_array_pairs_come_back_as_arrays(tmp_path):
    tensor = paddle.to_tensor([1.0, 2.0])
    paddle.save({"nested": {"t": tensor, "items": [tensor]}, "step": 3, "pair": (1, 2)}, str(tmp_path / "s.pdparams"))
    loaded = safe_unpickle(tmp_path / "s.pdparams")
    np.testing.assert_array_equal(loaded["nested"]["t"], [1.0, 2.0])
    np.testing.assert_array_equal(loaded["nested"]["items"][0], [1.0, 2.0])
    assert loaded["step"] == 3 and loaded["pair"] == (1, 2)


def test_load_legacy_with_trust_uses_paddle_load(tmp_path):
    layer = _small_layer()
    paddle.save(layer.state_dict(), str(tmp_path / "m.pdparams"))
    single = load_legacy(tmp_path / "m.pdparams", trust_pickle=True)
    np.testing.assert_array_equal(single["3.weight"].numpy(), layer[3].weight.numpy())
    assert set(load_legacy(tmp_path, trust_pickle=True)) == {"m.pdparams"}


def test_truncated_and_missing_legacy_files(tmp_path):
    paddle.save(_small_layer().state_dict(), str(tmp_path / "m.pdparams"))
    data = (tmp_path / "m.pdparams").read_bytes()
    (tmp_path / "m.pdparams").write_bytes(data[: len(data) // 2])
    with pytest.raises(CheckpointError, match="m.pdparams is truncated or not a pickle"):
        safe_unpickle(tmp_path / "m.pdparams")
    with pytest.raises(CheckpointError, match="cannot load .*m.pdparams"):
        load_legacy(tmp_path / "m.pdparams", trust_pickle=True)
    with pytest.raises(CheckpointError, match="does not exist"):
        load_legacy(tmp_path / "nope.pdparams", trust_pickle=True)
    (tmp_path / "empty").mkdir()
    with pytest.raises(CheckpointError, match="holds no .pdparams"):
        load_legacy(tmp_path / "empty")
