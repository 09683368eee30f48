"""Read and write ``.safetensors`` files as dicts of numpy arrays, with one clear error for a bad file.

The safetensors library checks the header (length, JSON, offsets inside the file, known dtypes) before it
reads a byte of data and runs no code; what it reports is turned into one line naming the file. A dtype numpy
cannot hold (``BF16``, the ``F8_*`` kinds) is refused naming the tensor.
"""
from __future__ import annotations

import os
from pathlib import Path

import numpy as np
import safetensors.numpy
from safetensors import SafetensorError, safe_open

from ._fs import fsync_file
from .errors import CheckpointError
from .untrusted import show


def read_tensors(path: str | os.PathLike) -> dict[str, np.ndarray]:
    """Every tensor of the safetensors file ``path``, as numpy arrays.

    Raises:
        CheckpointError: ``"<path> is corrupt or unreadable (<what is wrong>)"``: a short or malformed header,
            a header length past the file's end, offsets out of range, an unknown or unsupported dtype.
    """
    path = Path(path)
    arrays: dict[str, np.ndarray] = {}
    key = None
    try:
        with safe_open(str(path), framework="numpy") as handle:
            for key in handle.keys():
                arrays[key] = handle.get_tensor(key)
    except (SafetensorError, OSError, ValueError) as error:
        raise CheckpointError(f"{path} is corrupt or unreadable ({error})") from error
    except TypeError as error:  # numpy has no such dtype (bfloat16, float8): named by the key that has it
        raise CheckpointError(f"{path} is corrupt or unreadable (tensor {show(key)}: {error})") from error
    return arrays


def read_metadata(path: str | os.PathLike) -> dict[str, str]:
    """The ``__metadata__`` table of a safetensors file (string to string), without reading tensors."""
    try:
        with safe_open(str(path), framework="numpy") as handle:
            return dict(handle.metadata() or {})
    except (SafetensorError, OSError, ValueError) as error:
        raise CheckpointError(f"{path} is corrupt or unreadable ({error})") from error


def write_tensors(arrays: dict[str, np.ndarray], path: Path) -> None:
    """Write ``arrays`` to ``path`` and flush it to disk. Errors propagate (the caller knows the context)."""
    safetensors.numpy.save_file(arrays, str(path))
    fsync_file(path)
