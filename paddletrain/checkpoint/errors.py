"""The one exception type every checkpoint failure is reported with."""


class CheckpointError(ValueError):
    """A checkpoint is missing, incomplete, corrupt, untrusted or cannot be written.

    The message always names the directory or file and says what is wrong, so a user can act on it
    without reading a traceback.
    """
