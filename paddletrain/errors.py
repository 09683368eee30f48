"""Exceptions for mistakes a user can fix: entry points print their message as one clear line, no traceback."""


class UserError(ValueError):
    """Bad input (config, data, weights, checkpoint) described in terms the user can act on."""


class ConfigError(UserError):
    """A configuration value is invalid; the message names the key, the value and what is allowed."""
