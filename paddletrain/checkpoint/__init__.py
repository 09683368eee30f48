"""Checkpoint storage: atomic, verifiable, pickle-free; plus retention and resume discovery.

A checkpoint is a directory ``<name>/`` holding ``tensors.safetensors``, ``state.json`` and
``manifest.json`` (see docs/checkpoints.md). This package knows nothing of the trainer: it stores a
nested ``state`` dict and gives it back.
"""
from __future__ import annotations

from ._fs import check_writable
from .discovery import CheckpointInfo, find_checkpoints, find_latest
from .errors import CheckpointError
from .legacy import load_legacy, safe_unpickle
from .manifest import FORMAT_VERSION
from .retention import CheckpointManager, checkpoint_name, read_pointer
from .rng import rng_state, set_rng_state
from .safe_pickle import PickleRefused
from .storage import Checkpoint, is_complete, load_checkpoint, save_checkpoint

__all__ = [
    "checkpoint_name",
    "Checkpoint", "CheckpointError", "CheckpointInfo", "CheckpointManager", "FORMAT_VERSION", "PickleRefused",
    "check_writable", "find_checkpoints", "find_latest", "is_complete", "load_checkpoint", "load_legacy",
    "read_pointer", "rng_state", "safe_unpickle", "save_checkpoint", "set_rng_state",
]
