"""Errors that reach users: each carries a one-line message that says what to fix."""

from __future__ import annotations


class ArealError(Exception):
    """Base of user-facing errors; the CLI prints ``str(err)`` on one line and exits 2."""


class ConfigError(ArealError):
    """A config value is unknown, mistyped, out of range or conflicts with another one."""

    def __init__(self, key: str, message: str) -> None:
        self.key = key
        super().__init__(f"{key}: {message}" if key else message)


class PluginError(ArealError):
    """A plugin is missing, broken, or registers a name that is already taken."""
