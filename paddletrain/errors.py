"""Exceptions for mistakes a user can fix: entry points print their message as one clear line, no traceback."""


class UserError(ValueError):
    """Bad input (config, data, weights, checkpoint) described in terms the user can act on."""


class ConfigError(UserError):
    """A configuration value is invalid; the message names the key, the value and what is allowed."""


class TrainingInterrupted(Exception):
    """SIGTERM/SIGINT stopped training after the current optimizer step; a checkpoint was written if enabled."""

    def __init__(self, signum: int) -> None:
        import signal

        self.signum = signum
        self.exit_code = 128 + signum  # the shell convention: 143 for SIGTERM, 130 for SIGINT
        super().__init__(f"training interrupted by {signal.Signals(signum).name}")


class NonFiniteLossError(RuntimeError):
    """Raised after too many consecutive optimizer steps with a non-finite loss or gradient."""
