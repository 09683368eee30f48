"""The one exception type every checkpoint failure is reported with."""
from __future__ import annotations

from paddletrain.errors import UserError


class CheckpointError(UserError):
    """A checkpoint is missing, incomplete, corrupt, untrusted or cannot be written.

    The message always names the directory or file and says what is wrong, so a user can act on it
    without reading a traceback.
    """
