"""Errors that reach users: each carries a one-line message that says what to fix."""

from __future__ import annotations

from typing import ClassVar


class ArealError(Exception):
    """Base of user-facing errors; the CLI prints ``str(err)`` on one line and exits ``exit_code``."""

    exit_code: ClassVar[int] = 2  # fix the input, then run again: the launcher does not restart


class ProcessFailedError(ArealError):
    """A server or training worker of the run died or failed. Exit code 3: with
    ``recover.mode=auto`` the launcher restarts the run from its last recover point."""

    exit_code: ClassVar[int] = 3


class ConfigError(ArealError):
    """A config value is unknown, mistyped, out of range or conflicts with another one."""

    def __init__(self, key: str, message: str) -> None:
        self.key = key
        super().__init__(f"{key}: {message}" if key else message)


class PluginError(ArealError):
    """A plugin is missing, broken, or registers a name that is already taken."""
