"""Pickled ``.pdparams`` / ``.pdopt`` files (``paddle.save``): refused by default, or read safely.

``paddle.load`` is ``pickle.load``: a crafted file runs arbitrary code when loaded, whatever
``return_numpy`` says. Two ways in:

* :func:`safe_unpickle` admits only numpy arrays, numpy scalars and plain containers, which is all a
  ``paddle.save``'d state dict references (``numpy._core.multiarray._reconstruct``, ``numpy.ndarray``,
  ``numpy.dtype``, ``builtins.tuple``), so ordinary weights load and anything else is rejected unrun;
  it also refuses structures that are not plain trees, in linear time (:mod:`.safe_pickle`).
* :func:`load_legacy` calls ``paddle.load`` and so runs whatever the file holds; it refuses unless the
  user opted in with ``trainer.trust_pickle=true``.
"""
from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import numpy as np
import paddle

from . import safe_pickle
from .errors import CheckpointError

LEGACY_SUFFIXES = (".pdparams", ".pdopt", ".pdstates")

# paddle.save adds this bookkeeping entry to state dicts; paddle.load drops it too.
_PADDLE_NAME_TABLE = "StructuredToParameterName@@"


def _unwrap_tensors(obj: Any) -> Any:
    # paddle.save stores a tensor nested below the top level as (tensor_name, ndarray). The tree is plain and
    # at most safe_pickle.MAX_DEPTH deep (checked while loading), so this recursion is linear and bounded.
    if isinstance(obj, tuple) and len(obj) == 2 and isinstance(obj[0], str) and isinstance(obj[1], np.ndarray):
        return obj[1]
    if isinstance(obj, dict):
        return {k: _unwrap_tensors(v) for k, v in obj.items() if k != _PADDLE_NAME_TABLE}
    if isinstance(obj, list):
        return [_unwrap_tensors(v) for v in obj]
    return obj


def safe_unpickle(path: str | os.PathLike) -> Any:
    """Load a ``paddle.save`` pickle without executing code from it; tensors come back as numpy arrays.

    Only numpy arrays/scalars of plain numeric dtypes and plain containers are admitted, each built the way
    ``paddle.save`` builds it, in time linear in the file's size (see :mod:`.safe_pickle`): any other
    global (``os.system``, ``builtins.eval``, ...) is refused before it is called, and so are shared
    references, nesting deeper than ``MAX_DEPTH``, more than ``MAX_OPCODES`` opcodes and arrays whose data
    does not match their shape. bfloat16 tensors come back as their uint16 bits (the pickle does not record
    the dtype).

    Raises:
        PickleRefused: (a :class:`CheckpointError`) naming the file and the rule it breaks; its
            ``needs_trust`` is true when only a callable outside the allow-list stands in the way.
        CheckpointError: the file cannot be read, is truncated or is not a pickle.
    """
    path = Path(path)
    try:
        data = path.read_bytes()
    except OSError as error:
        raise CheckpointError(f"cannot read {path}: {error.strerror or error}") from error
    return _unwrap_tensors(safe_pickle.loads(data, str(path)))


def legacy_files(path: str | os.PathLike) -> list[Path]:
    """The pickled checkpoint files at ``path`` (a file, or a directory holding them)."""
    path = Path(path)
    if path.is_file():
        return [path]
    if path.is_dir():
        files = sorted(p for p in path.iterdir() if p.suffix in LEGACY_SUFFIXES and p.is_file())
        if files:
            return files
        raise CheckpointError(f"{path} holds no {'/'.join(LEGACY_SUFFIXES)} files")
    raise CheckpointError(f"legacy checkpoint {path} does not exist")


def _refuse_unsafe_structure(file: Path) -> None:
    """Trust lets a pickle call more than the allow-list, never describe a structure that takes exponential
    time or memory to walk (``paddle.load`` walks the result recursively): screen it with the safe reader."""
    try:
        safe_pickle.loads(file.read_bytes(), str(file))
    except safe_pickle.PickleRefused as error:
        if not error.needs_trust:
            raise
    except (CheckpointError, OSError):
        pass  # not a plain pickle, or unreadable: paddle.load reports it in its own words


def load_legacy(path: str | os.PathLike, trust_pickle: bool = False) -> Any:
    """Load pickled ``paddle.save`` file(s) with ``paddle.load``; only when ``trust_pickle=True``.

    ``path`` is a ``.pdparams``/``.pdopt`` file (returns its content) or a directory holding such files
    (returns ``{file_name: content}``). Without trust this raises :class:`CheckpointError` and reads
    nothing: unpickling can execute arbitrary code. With trust, a structure :func:`safe_unpickle` refuses for
    its shape (shared references, depth, size) is still refused.
    """
    files = legacy_files(path)
    if not trust_pickle:
        raise CheckpointError(
            f"{path} is a pickled paddle checkpoint: loading it can execute arbitrary code from the file. "
            "If you trust its source, enable it with trainer.trust_pickle=true "
            "(load_legacy(..., trust_pickle=True)); plain weights also load safely with "
            "paddletrain.checkpoint.safe_unpickle()"
        )

    loaded = {}
    for file in files:
        _refuse_unsafe_structure(file)
        try:
            loaded[file.name] = paddle.load(str(file))
        except Exception as error:  # paddle.load surfaces pickle/EOF/format errors of any type
            raise CheckpointError(f"cannot load {file}: {type(error).__name__}: {error}") from error
    return loaded[files[0].name] if Path(path).is_file() else loaded
