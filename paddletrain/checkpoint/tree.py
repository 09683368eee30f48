"""Split a nested training state into a JSON tree plus a flat dict of arrays, and join them back.

Arrays and tensors go to safetensors; everything else becomes JSON. Values JSON cannot express exactly
are written as tagged nodes ``{"__pt__": <kind>, ...}``, so the JSON stays strict (no NaN literals) and
every supported value comes back with its type: tuples stay tuples, numpy scalars stay numpy scalars,
tensors come back as ``paddle.Tensor`` and arrays as ``np.ndarray``.
"""
from __future__ import annotations

import math
from typing import Any

import numpy as np
import paddle

from .rng import GeneratorState, generator_state_from_dict, generator_state_to_dict
from .untrusted import StateValueError, show

TAG = "__pt__"
_NON_FINITE = {"nan": math.nan, "inf": math.inf, "-inf": -math.inf}


def _dtype_name(tensor: paddle.Tensor) -> str:
    return str(tensor.dtype).replace("paddle.", "")


class _Encoder:
    def __init__(self) -> None:
        self.arrays: dict[str, np.ndarray] = {}

    def _add_array(self, path: list[str], array: np.ndarray) -> str:
        key = "/".join(path) or "root"
        unique, n = key, 1
        while unique in self.arrays:
            unique, n = f"{key}#{n}", n + 1
        # Not np.ascontiguousarray: it turns 0-d arrays into 1-d ones.
        self.arrays[unique] = array if array.flags.c_contiguous else array.copy(order="C")
        return unique

    def encode(self, value: Any, path: list[str]) -> Any:
        if isinstance(value, (tuple, list, dict)):
            return self._encode_container(value, path)
        return self._encode_leaf(value, path)

    def _encode_leaf(self, value: Any, path: list[str]) -> Any:
        if isinstance(value, np.generic):  # before float: np.float64 subclasses float
            return {TAG: "numpy_scalar", "key": self._add_array(path, np.asarray(value))}
        if value is None or isinstance(value, (bool, int, str)):
            return value
        if isinstance(value, float):
            if math.isfinite(value):
                return value
            return {TAG: "float", "value": "nan" if math.isnan(value) else ("inf" if value > 0 else "-inf")}
        if isinstance(value, paddle.Tensor):
            # bfloat16 comes out of .numpy() as its raw uint16 bits; the dtype recorded here restores it.
            array = value.detach().cpu().numpy()
            return {TAG: "tensor", "key": self._add_array(path, array), "dtype": _dtype_name(value)}
        if isinstance(value, np.ndarray):
            if value.dtype.hasobject:
                raise TypeError(f"cannot store state[{_show(path)}]: numpy arrays of dtype object are not supported")
            return {TAG: "ndarray", "key": self._add_array(path, value)}
        if isinstance(value, GeneratorState):
            return {TAG: "paddle_generator_state", **generator_state_to_dict(value)}
        raise TypeError(
            f"cannot store state[{_show(path)}] of type {type(value).__qualname__}: supported are dict, list, "
            "tuple, paddle.Tensor, numpy arrays and scalars, int, float, bool, str, None and paddle RNG states"
        )

    def _encode_container(self, value: tuple | list | dict, path: list[str]) -> Any:
        if isinstance(value, tuple):
            return {TAG: "tuple", "items": [self.encode(v, path + [str(i)]) for i, v in enumerate(value)]}
        if isinstance(value, list):
            return [self.encode(v, path + [str(i)]) for i, v in enumerate(value)]
        if all(isinstance(k, str) for k in value) and TAG not in value:
            return {k: self.encode(v, path + [k]) for k, v in value.items()}
        # Non-string keys (ints, tuples, ...) or a key that clashes with the tag: keep them as pairs.
        return {TAG: "dict", "items": [[self.encode(k, path + ["key"]), self.encode(v, path + [str(k)])]
                                      for k, v in value.items()]}


def _show(path: list[str]) -> str:
    return "][".join(repr(p) for p in path)


def encode_state(state: Any) -> tuple[Any, dict[str, np.ndarray]]:
    """Return ``(json_tree, arrays)``; raises ``TypeError`` naming the key of an unsupported value."""
    encoder = _Encoder()
    tree = encoder.encode(state, [])
    return tree, encoder.arrays


# A training state nests a handful of levels (callbacks -> ModelCheckpoint -> records -> ...); anything far
# deeper is not one, and stopping early keeps decoding clear of Python's recursion limit.
MAX_DEPTH = 100


def decode_state(tree: Any, arrays: dict[str, np.ndarray], map_numpy: bool = False) -> Any:
    """Rebuild the state; ``map_numpy=True`` returns tensors as numpy arrays (bfloat16 as uint16 bits).

    Raises:
        StateValueError: a node is malformed, nests deeper than ``MAX_DEPTH``, refers to a tensor the file
            does not hold, or records a dtype that does not match the stored array; the key says where.
    """
    return _Decoder(arrays, map_numpy).decode(tree, [])


class _Decoder:
    """Turns a JSON tree back into values; a tagged node goes to the method named for its kind in ``_KINDS``."""

    _KINDS = {"float": "_float", "tensor": "_tensor", "ndarray": "_array", "numpy_scalar": "_numpy_scalar",
              "paddle_generator_state": "_generator_state", "tuple": "_tuple", "dict": "_dict"}

    def __init__(self, arrays: dict[str, np.ndarray], map_numpy: bool) -> None:
        self.arrays = arrays
        self.map_numpy = map_numpy

    def decode(self, node: Any, path: list[str]) -> Any:
        if len(path) > MAX_DEPTH:
            raise StateValueError(_key(path[:3]), f"nests more than {MAX_DEPTH} levels deep")
        if isinstance(node, list):
            return [self.decode(v, path + [str(i)]) for i, v in enumerate(node)]
        if not isinstance(node, dict):
            return node
        kind = node.get(TAG)
        if kind is None:
            return {k: self.decode(v, path + [k]) for k, v in node.items()}
        method = self._KINDS.get(kind) if isinstance(kind, str) else None
        if method is None:
            raise StateValueError(_key(path), f"holds an unknown node type {show(kind)} "
                                              "(written by a newer paddletrain?)")
        return getattr(self, method)(node, path)

    def _array(self, node: dict, path: list[str]) -> np.ndarray:
        key = node.get("key")
        if not isinstance(key, str) or key not in self.arrays:
            raise StateValueError(_key(path), f"refers to tensor {show(key)}, which tensors.safetensors does not hold")
        return self.arrays[key]

    def _float(self, node: dict, path: list[str]) -> float:
        if node.get("value") not in _NON_FINITE:
            raise StateValueError(_key(path), f"is the non-finite float {show(node.get('value'))}: expected "
                                              f"one of {sorted(_NON_FINITE)}")
        return _NON_FINITE[node["value"]]

    def _tensor(self, node: dict, path: list[str]) -> paddle.Tensor | np.ndarray:
        data = self._array(node, path)
        dtype = node.get("dtype")
        # bfloat16 is stored as its uint16 bits (numpy has no bfloat16); every other dtype as itself.
        if dtype != data.dtype.name and not (dtype == "bfloat16" and data.dtype == np.uint16):
            raise StateValueError(_key(path), f"is a tensor of dtype {show(dtype)}, but tensors.safetensors "
                                              f"holds it as {data.dtype.name}")
        if self.map_numpy:
            return data
        return paddle.to_tensor(data, dtype=dtype, place=paddle.CPUPlace())

    def _numpy_scalar(self, node: dict, path: list[str]) -> np.generic:
        data = self._array(node, path)
        if data.ndim != 0:
            raise StateValueError(_key(path), f"is a numpy scalar stored with shape {list(data.shape)}")
        return data[()]

    def _generator_state(self, node: dict, path: list[str]) -> GeneratorState:
        return generator_state_from_dict(node, _key(path))

    def _tuple(self, node: dict, path: list[str]) -> tuple:
        return tuple(self.decode(v, path + [str(i)]) for i, v in enumerate(_items(node, path)))

    def _dict(self, node: dict, path: list[str]) -> dict:
        pairs = _items(node, path)
        if not all(isinstance(pair, list) and len(pair) == 2 for pair in pairs):
            raise StateValueError(_key(path), "is a dict node whose items are not [key, value] pairs")
        return {_hashable(self.decode(k, path + ["key"]), path): self.decode(v, path + [str(i)])
                for i, (k, v) in enumerate(pairs)}


def _key(path: list[str]) -> str:
    return ".".join(path) or "(the whole state)"


def _items(node: dict, path: list[str]) -> list:
    items = node.get("items")
    if not isinstance(items, list):
        raise StateValueError(_key(path), f"is a {node[TAG]} node without a list of items")
    return items


def _hashable(key: Any, path: list[str]) -> Any:
    if isinstance(key, list):
        return tuple(_hashable(k, path) for k in key)
    if isinstance(key, dict):
        raise StateValueError(_key(path), "has a dict as a key")
    return key
