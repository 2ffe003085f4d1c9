"""Fixtures shared across test modules (defined here so a session-scoped one runs once per session)."""

from quickstart_runs import marks, uninterrupted_run  # noqa: F401 - fixtures

