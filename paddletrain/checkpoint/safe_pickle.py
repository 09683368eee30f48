"""A pickle reader for ``paddle.save`` files that runs no code and takes time linear in the file's size.

``pickle.load`` calls whatever the file names, and even with only harmless callables a few hundred bytes
can describe an object graph that is exponentially large once walked as a tree (a list holding the same list
twice, nested: a "billion laughs"), or an array whose declared size the file could never hold. This reader
is Python's own pure-Python unpickler (``pickle._Unpickler``) with every opcode handler checked:

* only the globals a state dict needs (numpy array and scalar reconstruction, ``numpy.dtype``, plain
  containers, ``_codecs.encode``), and each may only be called the way ``paddle.save`` calls it;
* a memo reference (``GET``) may not fetch a container again (``DUP`` is refused), so the result is a plain
  tree and walking it is linear; only a tuple of scalars and arrays (how ``paddle.save`` stores a tensor as
  ``(name, array)``) may appear twice. Dict keys and set items are scalars or flat tuples (cheap to hash);
* ``BUILD`` only sets the state of a numpy array or dtype; an array's data must be exactly as long as its
  shape and plain numeric dtype say (no object arrays, no structured dtypes);
* persistent ids, extension codes, ``NEWOBJ``/``INST``/``OBJ`` and out-of-band buffers are refused;
* at most ``MAX_OPCODES`` opcodes, and the result may nest at most ``MAX_DEPTH`` levels.

The whole file is read into memory first, so a declared length past its end yields short data (and an
error), never a huge allocation.
"""
from __future__ import annotations

import collections
import io
import math
import pickle
import struct
from collections.abc import Callable
from typing import Any

import numpy as np

from .errors import CheckpointError

# A ResNet-152 state dict takes ~25 thousand opcodes, an optimizer state ~3 times that; a state dict nests
# 2-4 levels (optimizer state -> master_weights -> (name, array)).
MAX_OPCODES = 5_000_000
MAX_DEPTH = 32
_MAX_NDIM = 32

_SCALARS = (str, bytes, int, float, complex, bool, type(None))
_CONTAINERS = (list, tuple, dict, set, frozenset)


class PickleRefused(CheckpointError):
    """A pickle was refused unread. ``needs_trust``: it names a callable outside the allow-list, so only
    ``paddle.load`` (which runs code from the file) could read it; otherwise its structure is refused."""

    def __init__(self, message: str, needs_trust: bool = False) -> None:
        super().__init__(message)
        self.needs_trust = needs_trust


class _Refused(pickle.UnpicklingError):
    def __init__(self, reason: str, needs_trust: bool = False) -> None:
        super().__init__(reason)
        self.needs_trust = needs_trust


def _is_flat(value: Any) -> bool:
    """A scalar, or a tuple of scalars: cheap to hash however it was built."""
    return isinstance(value, _SCALARS) or (type(value) is tuple and all(isinstance(v, _SCALARS) for v in value))


def _is_leaf(value: Any) -> bool:
    """Not a container, or a tuple of scalars and arrays (``paddle.save``'s ``(name, array)`` for a tensor).

    A leaf may appear more than once (the same tensor saved in two places): walking it costs O(1) however
    often it appears, so sharing it cannot blow up.
    """
    if not isinstance(value, _CONTAINERS):
        return True
    return type(value) is tuple and all(isinstance(v, (*_SCALARS, np.ndarray, np.generic)) for v in value)


def _check_keys(items: Any, what: str) -> None:
    for item in items:
        if not _is_flat(item):
            raise _Refused(f"a {what} is a {type(item).__name__}; only numbers, strings and flat tuples are allowed")


def _plain_dtype(dtype: Any) -> np.dtype:
    if not isinstance(dtype, np.dtype) or dtype.kind not in "biufc" or dtype.fields is not None \
            or dtype.subdtype is not None:
        raise _Refused(f"an array has dtype {dtype!r}; only plain numeric dtypes are allowed")
    return dtype


# ------------------------------------------------------------------------------------- the allowed callables
def _reconstruct(cls: Any, shape: Any, typecode: Any) -> np.ndarray:
    # numpy pickles an array as _reconstruct(ndarray, (0,), b"b") followed by BUILD with the real state.
    if cls is not np.ndarray or shape != (0,) or typecode not in (b"b", "b"):
        raise _Refused("numpy's _reconstruct is called with other arguments than numpy itself uses")
    return np.ndarray((0,), np.int8)


def _scalar(dtype: Any, data: Any = None) -> np.generic:
    dtype = _plain_dtype(dtype)
    if not isinstance(data, bytes) or len(data) != dtype.itemsize:
        raise _Refused(f"a numpy scalar of dtype {dtype} has {type(data).__name__} data of the wrong size")
    return np.frombuffer(data, dtype=dtype)[0]


def _frombuffer(buffer: Any, dtype: Any, shape: Any, order: Any) -> np.ndarray:
    # numpy pickles an array with protocol 5 as _frombuffer(<in-band bytes>, dtype, shape, order).
    dtype = _plain_dtype(dtype)
    if not isinstance(buffer, (bytes, bytearray)) or order not in ("C", "F") or not isinstance(shape, tuple) \
            or len(shape) > _MAX_NDIM or not all(isinstance(n, int) and not isinstance(n, bool) and n >= 0
                                                 for n in shape):
        raise _Refused("numpy's _frombuffer is called with other arguments than numpy itself uses")
    if len(buffer) != math.prod(shape) * dtype.itemsize:
        raise _Refused(f"a numpy array of shape {list(shape)} and dtype {dtype} needs "
                       f"{math.prod(shape) * dtype.itemsize} bytes of data, the file holds {len(buffer)}")
    return np.frombuffer(bytes(buffer), dtype=dtype).reshape(shape, order=order)


def _dtype(spec: Any, align: Any = False, copy: Any = False) -> np.dtype:
    if isinstance(spec, bytes) and spec.isascii():  # a Python 2 pickle read with encoding="bytes"
        spec = spec.decode("ascii")
    if not isinstance(spec, str) or len(spec) > 8 or not isinstance(align, bool) or not isinstance(copy, bool):
        raise _Refused(f"numpy.dtype is called with {type(spec).__name__} {str(spec)[:20]!r}; only short type "
                       "codes such as 'f4' are allowed")
    try:
        return _plain_dtype(np.dtype(spec, align, copy))
    except TypeError as error:
        raise _Refused(f"numpy.dtype({spec!r}) is not a dtype ({error})") from None


def _encode(text: Any, encoding: Any = "utf-8") -> bytes:
    # Protocol-2 pickles store bytes as _codecs.encode(<latin-1 str>, "latin1").
    if not isinstance(text, str) or encoding not in ("latin1", "latin-1"):
        raise _Refused("_codecs.encode is called with other arguments than a protocol-2 pickle of bytes uses")
    return text.encode("latin-1")


def _container(kind: type) -> Callable[..., Any]:
    def build(*args: Any) -> Any:
        if len(args) > 1 or (args and not isinstance(args[0], (list, tuple))):
            raise _Refused(f"{kind.__name__}() is called with {len(args)} argument(s) that are not a list")
        items = list(args[0]) if args else []
        if kind in (set, frozenset):
            _check_keys(items, "set item")
        elif kind is dict or issubclass(kind, dict):
            if not all(isinstance(p, (list, tuple)) and len(p) == 2 for p in items):
                raise _Refused("dict() is called with items that are not (key, value) pairs")
            _check_keys((p[0] for p in items), "dict key")
        return kind(items)

    return build


def _flat_call(func: Callable[..., Any], name: str) -> Callable[..., Any]:
    def call(*args: Any) -> Any:
        if not all(isinstance(a, _SCALARS) for a in args):
            raise _Refused(f"{name}() is called with arguments that are not numbers or strings")
        return func(*args)

    return call


_MULTIARRAY = {"_reconstruct": _reconstruct, "scalar": _scalar}
_ALLOWED: dict[tuple[str, str], Any] = {
    **{(module, name): f for module in ("numpy.core.multiarray", "numpy._core.multiarray")
       for name, f in _MULTIARRAY.items()},
    **{(module, "_frombuffer"): _frombuffer for module in ("numpy.core.numeric", "numpy._core.numeric")},
    ("numpy", "ndarray"): np.ndarray,  # only as _reconstruct's first argument: calling it is refused
    ("numpy", "dtype"): _dtype,
    ("_codecs", "encode"): _encode,
    ("builtins", "tuple"): _container(tuple),
    ("builtins", "list"): _container(list),
    ("builtins", "dict"): _container(dict),
    ("builtins", "set"): _container(set),
    ("builtins", "frozenset"): _container(frozenset),
    ("collections", "OrderedDict"): _container(collections.OrderedDict),
    ("builtins", "complex"): _flat_call(complex, "complex"),
    ("builtins", "slice"): _flat_call(slice, "slice"),
}
_CALLABLE = {id(f) for f in _ALLOWED.values() if f is not np.ndarray}


# ------------------------------------------------------------------------------------------- the unpickler
def _refuse_opcode(name: str) -> Callable[[Any], None]:
    def refuse(self: Any) -> None:
        raise _Refused(f"it uses the pickle opcode {name}, which a paddle.save state dict never contains")

    return refuse


_REFUSED_OPCODES = {
    pickle.PERSID: "PERSID", pickle.BINPERSID: "BINPERSID", pickle.EXT1: "EXT1", pickle.EXT2: "EXT2",
    pickle.EXT4: "EXT4", pickle.INST: "INST", pickle.OBJ: "OBJ", pickle.NEWOBJ: "NEWOBJ",
    pickle.NEWOBJ_EX: "NEWOBJ_EX", pickle.NEXT_BUFFER: "NEXT_BUFFER", pickle.READONLY_BUFFER: "READONLY_BUFFER",
    pickle.DUP: "DUP",
}


class _Dispatch(dict):
    def __missing__(self, code: int) -> Callable[[Any], None]:
        return _refuse_opcode(f"0x{code:02x} (unknown)")


class _SafeUnpickler(pickle._Unpickler):  # type: ignore[name-defined]  # the pure-Python one: every opcode hookable
    def __init__(self, data: bytes, encoding: str) -> None:
        super().__init__(io.BytesIO(data), encoding=encoding)
        self.opcodes = 0

    def find_class(self, module: str, name: str) -> Any:
        try:
            return _ALLOWED[(module, name)]
        except KeyError:
            raise _Refused(f"it references {module}.{name}, which is not a numpy array or container",
                           needs_trust=True) from None

    def _fetch(self, index: int) -> None:
        try:
            value = self.memo[index]
        except KeyError:
            raise _Refused(f"it refers to memo entry {index}, which was never stored") from None
        if not _is_leaf(value):
            # The same list/dict/tuple in two places: walking the result as a tree could take exponential time.
            raise _Refused(f"it refers to the same {type(value).__name__} more than once (shared references "
                           "are not a plain tree of tensors)")
        self.append(value)

    def load_get(self) -> None:
        self._fetch(int(self.readline()[:-1]))

    def load_binget(self) -> None:
        self._fetch(self.read(1)[0])

    def load_long_binget(self) -> None:
        self._fetch(int.from_bytes(self.read(4), "little"))

    def load_reduce(self) -> None:
        args = self.stack.pop()
        func = self.stack[-1]
        if id(func) not in _CALLABLE or not isinstance(args, tuple):
            raise _Refused(f"it calls {getattr(func, '__name__', type(func).__name__)}, which only numpy itself "
                           "may pass around")
        self.stack[-1] = func(*args)

    def load_build(self) -> None:
        state = self.stack.pop()
        target = self.stack[-1]
        if type(target) is np.ndarray:
            _check_array_state(state)
        elif isinstance(target, np.dtype):
            if not isinstance(state, tuple) or not all(isinstance(v, _SCALARS) for v in state):
                raise _Refused("a numpy dtype gets a state that is not a flat tuple")
        else:
            raise _Refused(f"it sets the state of a {type(target).__name__}; only numpy arrays and dtypes have one")
        try:
            target.__setstate__(state)
        except (TypeError, ValueError) as error:
            raise _Refused(f"numpy refuses an array or dtype state ({error})") from None

    def load_dict(self) -> None:
        items = self.pop_mark()
        self.append({})
        self._set_items(items)

    def load_setitem(self) -> None:
        self._set_items([self.stack.pop(-2), self.stack.pop()])

    def load_setitems(self) -> None:
        self._set_items(self.pop_mark())

    def _set_items(self, items: list) -> None:
        target = self.stack[-1]
        if not isinstance(target, dict):
            raise _Refused(f"it sets items of a {type(target).__name__}; only dicts have items")
        if len(items) % 2:
            raise _Refused("it sets a dict key without a value")
        keys = items[0::2]
        _check_keys(keys, "dict key")
        for key, value in zip(keys, items[1::2], strict=True):
            target[key] = value

    def load_append(self) -> None:
        value = self.stack.pop()
        self._extend([value])

    def load_appends(self) -> None:
        self._extend(self.pop_mark())

    def _extend(self, items: list) -> None:
        target = self.stack[-1]
        if type(target) is not list:
            raise _Refused(f"it appends to a {type(target).__name__}; only lists can be appended to")
        target.extend(items)

    def load_additems(self) -> None:
        items = self.pop_mark()
        target = self.stack[-1]
        if type(target) is not set:
            raise _Refused(f"it adds items to a {type(target).__name__}; only sets can")
        _check_keys(items, "set item")
        target.update(items)

    def load_frozenset(self) -> None:
        items = self.pop_mark()
        _check_keys(items, "set item")
        self.append(frozenset(items))


def _check_array_state(state: Any) -> None:
    # ndarray.__setstate__((version, shape, dtype, is_fortran, rawdata)).
    if not isinstance(state, tuple) or len(state) != 5:
        raise _Refused("a numpy array gets a state that is not (version, shape, dtype, fortran, data)")
    _, shape, dtype, _, data = state
    if not isinstance(shape, tuple) or len(shape) > _MAX_NDIM or not all(
            isinstance(n, int) and not isinstance(n, bool) and n >= 0 for n in shape):
        raise _Refused(f"a numpy array has the shape {str(shape)[:40]}; expected up to {_MAX_NDIM} sizes >= 0")
    dtype = _plain_dtype(dtype)
    expected = math.prod(shape) * dtype.itemsize
    if not isinstance(data, bytes) or len(data) != expected:
        held = len(data) if isinstance(data, bytes) else type(data).__name__
        raise _Refused(f"a numpy array of shape {list(shape)} and dtype {dtype} needs {expected} bytes of data, "
                       f"the file holds {held}")


def _count_opcodes(dispatch: dict) -> _Dispatch:
    counted = _Dispatch()
    for code, handler in dispatch.items():
        def step(self: _SafeUnpickler, handler: Callable[[Any], None] = handler) -> None:
            self.opcodes += 1
            if self.opcodes > MAX_OPCODES:
                raise _Refused(f"it holds more than {MAX_OPCODES} pickle opcodes")
            handler(self)

        counted[code] = step
    return counted


def _dispatch_table() -> _Dispatch:
    table = dict(pickle._Unpickler.dispatch)  # type: ignore[attr-defined]
    for code, name in _REFUSED_OPCODES.items():
        table[code[0]] = _refuse_opcode(name)
    for code, method in ((pickle.GET, "load_get"), (pickle.BINGET, "load_binget"),
                         (pickle.LONG_BINGET, "load_long_binget"), (pickle.REDUCE, "load_reduce"),
                         (pickle.BUILD, "load_build"), (pickle.SETITEM, "load_setitem"),
                         (pickle.SETITEMS, "load_setitems"), (pickle.APPEND, "load_append"),
                         (pickle.APPENDS, "load_appends"), (pickle.ADDITEMS, "load_additems"),
                         (pickle.FROZENSET, "load_frozenset"), (pickle.DICT, "load_dict")):
        table[code[0]] = getattr(_SafeUnpickler, method)
    return _count_opcodes(table)


_SafeUnpickler.dispatch = _dispatch_table()


def _check_tree(root: Any) -> None:
    """No container twice, at most ``MAX_DEPTH`` levels (iterative: no recursion on crafted input)."""
    seen: set[int] = set()
    stack = [(root, 1)]
    while stack:
        node, depth = stack.pop()
        if _is_leaf(node):
            continue
        if depth > MAX_DEPTH:
            raise _Refused(f"it nests containers more than {MAX_DEPTH} levels deep")
        if id(node) in seen:
            raise _Refused("it holds the same container twice (not a plain tree of tensors)")
        seen.add(id(node))
        children = node.values() if isinstance(node, dict) else node
        stack.extend((child, depth + 1) for child in children)


def loads(data: bytes, source: str, encoding: str = "ASCII") -> Any:
    """Unpickle ``data`` (read from ``source``, named in errors) under the rules above.

    ``encoding="bytes"`` reads a Python 2 pickle (CIFAR's batches) with its ``str`` values as ``bytes``.

    Raises:
        PickleRefused: naming ``source`` and the first rule the pickle breaks (``needs_trust`` tells whether
            only a forbidden callable stands in the way).
        CheckpointError: the data is truncated or not a pickle.
    """
    try:
        result = _SafeUnpickler(data, encoding).load()
        _check_tree(result)
        return result
    except _Refused as error:
        raise PickleRefused(f"refusing to unpickle {source}: {error}", needs_trust=error.needs_trust) from None
    except (pickle.UnpicklingError, EOFError, ValueError, TypeError, AttributeError, IndexError, KeyError,
            struct.error, OverflowError) as error:
        raise CheckpointError(f"{source} is truncated or not a pickle ({type(error).__name__}: {error})") from None
