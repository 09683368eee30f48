"""What goes wrong with data, as user errors that name the path, key or sample at fault (no framework needed)."""
from __future__ import annotations

from paddletrain.errors import FaultAfterWhichRunContinues, UserError
from paddletrain.registry import UnknownNameError


class DatasetError(UserError):
    """The data on disk or the data config is wrong; the message names the path or key at fault."""


class UnknownDatasetError(DatasetError, UnknownNameError):
    """No builder is registered under ``data.name`` (a :class:`~paddletrain.errors.ConfigError` too)."""


class SourceUnavailableError(DatasetError, FaultAfterWhichRunContinues):
    """The data's source cannot be read at all (a server that stays away): not a bad sample, so no
    ``data.bad_sample_policy`` skips it; the run stops, naming the source, after saving what it trained."""


class BadSampleError(DatasetError):
    """One sample could not be read or decoded; ``describe`` names it (loaders may skip it by policy)."""

    def __init__(self, message: str, index: int, describe: str) -> None:
        super().__init__(message)
        self.index = index
        self.describe = describe
