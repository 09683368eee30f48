"""Weight files are untrusted input: hostile pickles and malformed safetensors end in one clear line, fast.

Each crafted file is tiny and real (bytes on disk), loaded through the Python API (``read_state_dict``,
``load_pretrained``, ``safe_unpickle``) and through ``python -m paddletrain.fit model.pretrained=<file>``.
Every in-process load runs under an alarm, so a regression that hangs fails the test instead of the suite.
"""
from __future__ import annotations

import contextlib
import json
import pickle
import re
import signal
import struct
import time
from pathlib import Path

import numpy as np
import paddle
import pytest
from safetensors.numpy import save_file

from paddletrain.checkpoint import CheckpointError, PickleRefused, load_legacy, safe_pickle, safe_unpickle
from paddletrain.models import PretrainedLoadError, create_model, load_pretrained
from paddletrain.models.weights import describe, read_state_dict
from tests.reliability.checkpoint_craft import BAD_TENSOR_FILES, assert_one_error_line, fit_cli


@contextlib.contextmanager
def deadline(seconds: int = 20):
    """Fail (instead of hanging the suite) if the block runs longer than ``seconds``."""
    def expire(signum, frame):
        raise TimeoutError(f"still running after {seconds} s: loading is not linear in the file's size")

    previous = signal.signal(signal.SIGALRM, expire)
    signal.alarm(seconds)
    try:
        yield
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, previous)


def billion_laughs(levels: int = 43) -> bytes:
    """{"weight": L43} where L[i] = [L[i-1], L[i-1]]: 449 bytes, 2**43 lists when walked as a tree."""
    out = bytearray(b"\x80\x02}")                                  # PROTO 2, EMPTY_DICT
    out += b"X" + struct.pack("<I", 6) + b"weight"                  # BINUNICODE "weight"
    out += b"]q\x000"                                               # L0 = []: EMPTY_LIST, BINPUT 0, POP
    for i in range(1, levels + 1):                                  # L[i]: EMPTY_LIST, MARK, BINGET x2, APPENDS
        out += b"](" + (b"h" + bytes([i - 1])) * 2 + b"eq" + bytes([i]) + (b"0" if i < levels else b"")
    return bytes(out + b"s.")                                       # SETITEM, STOP


def deep_nesting(depth: int = 100_000) -> bytes:
    """{"weight": [[[...]]]} nested ``depth`` lists deep (a recursion bomb for any recursive walk)."""
    return b"\x80\x02}X" + struct.pack("<I", 6) + b"weight" + b"]" * depth + b"a" * (depth - 1) + b"s."


class _Reduce:
    """Pickles as whatever ``__reduce__`` returns: how a forger writes opcodes paddle.save never would."""

    def __init__(self, reduce):
        self._reduce = reduce

    def __reduce__(self):
        return self._reduce


def _write(tmp_path: Path, name: str, data: bytes) -> Path:
    path = tmp_path / name
    path.write_bytes(data)
    return path


def test_the_crafted_billion_laughs_file_is_449_bytes_and_expands_as_a_dag():
    data = billion_laughs()
    assert len(data) == 449
    top = pickle.loads(data)["weight"]  # the C unpickler builds the DAG in linear time...
    assert top[0] is top[1]             # ...but every level shares one list twice: 2**43 nodes as a tree


@pytest.mark.parametrize("trust", [False, True])
def test_billion_laughs_pdparams_is_refused_at_once(tmp_path, trust):
    path = _write(tmp_path, "laughs.pdparams", billion_laughs())
    model = create_model("resnet20", num_classes=4)
    start = time.perf_counter()
    with deadline(), pytest.raises(PretrainedLoadError) as raised:
        load_pretrained(model, str(path), trust_pickle=trust)  # trust lets code run, never a non-tree through
    assert time.perf_counter() - start < 1.0
    assert str(raised.value) == (f"Cannot read pickled weights: refusing to unpickle {path}: it refers to the same "
                                 "list more than once (shared references are not a plain tree of tensors)")


def test_trusted_legacy_checkpoints_are_screened_for_structure_too(tmp_path):
    path = _write(tmp_path, "laughs.pdparams", billion_laughs())
    # trainer.resume=<legacy> with trust_pickle uses paddle.load, which would walk the 2**43 lists.
    with deadline(), pytest.raises(PickleRefused, match="same list more than once"):
        load_legacy(path, trust_pickle=True)


def test_deeply_nested_pdparams_is_refused(tmp_path):
    path = _write(tmp_path, "deep.pdparams", deep_nesting())
    with deadline(), pytest.raises(PretrainedLoadError, match=f"refusing to unpickle {path}: it nests containers "
                                                              "more than 32 levels deep"):
        read_state_dict(str(path))


def _np_reconstruct():
    return np.ndarray.__reduce__(np.zeros(1))[0]  # numpy._core.multiarray._reconstruct (numpy.core on numpy 1)


HOSTILE = {
    "array larger than its data": (_Reduce((_np_reconstruct(), (np.ndarray, (0,), b"b"),
                                            (1, (10**9,), np.dtype("f4"), False, b"\0" * 8))),
                                   "a numpy array of shape [1000000000] and dtype float32 needs 4000000000 bytes of "
                                   "data, the file holds 8"),
    "ndarray called directly": (_Reduce((np.ndarray, ((2**40,),))), "it calls ndarray"),
    "_reconstruct of another shape": (_Reduce((_np_reconstruct(), (np.ndarray, (2**40,), b"b"))),
                                      "numpy's _reconstruct is called with other arguments"),
    "object array": (np.array([1, "x"], dtype=object), "only plain numeric dtypes"),
    "structured array": (np.zeros(2, dtype=[("a", "f4"), ("b", "i4")]), "dtype('V8'); only plain numeric dtypes"),
    "nested tuple as dict key": ({(1, (2, (3,))): np.zeros(1)}, "a dict key is a tuple"),
    "forbidden callable": (_Reduce((eval, ("1+1",))), "it references builtins.eval"),
}


@pytest.mark.parametrize("kind", list(HOSTILE))
def test_pickles_that_are_not_plain_trees_of_arrays_are_refused(tmp_path, kind):
    payload, problem = HOSTILE[kind]
    path = _write(tmp_path, "w.pdparams", pickle.dumps({"w": payload}, protocol=4))
    with deadline(), pytest.raises(PickleRefused, match=re.escape(problem)) as raised:
        safe_unpickle(path)
    assert str(raised.value).startswith(f"refusing to unpickle {path}: ")
    assert raised.value.needs_trust == (kind == "forbidden callable")


def test_opcode_cap(tmp_path, monkeypatch):
    path = tmp_path / "m.pdparams"
    paddle.save(create_model("resnet20", num_classes=4).state_dict(), str(path))
    assert set(safe_unpickle(path)) >= {"conv1.weight", "fc.weight"}  # an ordinary file loads under the caps
    monkeypatch.setattr(safe_pickle, "MAX_OPCODES", 100)
    with pytest.raises(PickleRefused, match="more than 100 pickle opcodes"):
        safe_unpickle(path)


def test_loading_time_is_linear_in_the_file_size(tmp_path):
    def seconds(n: int) -> float:
        path = tmp_path / f"{n}.pdparams"
        path.write_bytes(pickle.dumps({f"layer{i}.weight": np.full(4, i, np.float32) for i in range(n)}, protocol=4))
        best = float("inf")
        for _ in range(3):
            start = time.perf_counter()
            assert len(safe_unpickle(path)) == n
            best = min(best, time.perf_counter() - start)
        return best

    with deadline(60):
        small, large = seconds(5_000), seconds(20_000)
    assert large < 12 * small, (small, large)  # 4x the data: ~4x the time (12x leaves room for a busy machine)


@pytest.mark.parametrize("kind", list(BAD_TENSOR_FILES))
def test_malformed_safetensors_weights_are_one_clear_error(tmp_path, kind):
    path = _write(tmp_path, "w.safetensors", BAD_TENSOR_FILES[kind])
    with deadline(), pytest.raises(PretrainedLoadError) as raised:
        load_pretrained(create_model("resnet20", num_classes=4), str(path))
    message = str(raised.value)
    assert message.startswith(f"Cannot read safetensors weights: {path} is corrupt or unreadable (")
    assert "\n" not in message


@pytest.mark.parametrize("metadata, problem", [
    ({"paddletrain.preprocessing": json.dumps({"mean": "abc"})}, "paddletrain.preprocessing.mean is 'abc'"),
    ({"paddletrain.preprocessing": json.dumps({"input_size": [3, -1, 9]})}, "input_size[1] is -1"),
    ({"paddletrain.preprocessing": json.dumps({"std": [0.5, 0, 0.5]})}, "a standard deviation cannot be 0"),
    ({"paddletrain.preprocessing": "[" * 100_000}, "corrupt paddletrain metadata"),
    ({"paddletrain.label_names": json.dumps([1, 2])}, "paddletrain.label_names[0] is 1"),
])
def test_bad_paddletrain_metadata_in_safetensors_is_refused(tmp_path, metadata, problem):
    path = tmp_path / "w.safetensors"
    save_file({"fc.weight": np.zeros((4, 64), np.float32)}, str(path), metadata=metadata)
    with pytest.raises(PretrainedLoadError, match=re.escape(problem)) as raised:
        describe(str(path))
    assert str(path) in str(raised.value)


CLI_FILES = {
    "billion laughs": ("laughs.pdparams", billion_laughs(), "it refers to the same list more than once"),
    "deep nesting": ("deep.pdparams", deep_nesting(), "it nests containers more than 32 levels deep"),
    "safetensors offsets": ("w.safetensors", BAD_TENSOR_FILES["offsets out of range"], "is corrupt or unreadable"),
}


@pytest.mark.parametrize("kind", list(CLI_FILES))
def test_hostile_weight_files_through_the_cli(tmp_path, kind):
    name, data, problem = CLI_FILES[kind]
    path = _write(tmp_path, name, data)
    result = fit_cli(tmp_path / "run", f"model.pretrained={path}", timeout=120)
    assert_one_error_line(result, str(path), problem)


def test_a_safetensors_checkpoint_with_a_bad_header_is_caught_by_the_checkpoint_reader(tmp_path):
    # One reader serves weights and checkpoints (paddletrain.checkpoint.tensors): the same words for both.
    path = _write(tmp_path, "w.safetensors", BAD_TENSOR_FILES["huge header length"])
    with pytest.raises(CheckpointError, match="header too large"):
        from paddletrain.checkpoint.tensors import read_tensors

        read_tensors(path)
