"""areal-core: plugin-based, fully asynchronous RL post-training for LLMs.

Plugins import only :mod:`areal_core.api` (its :data:`~areal_core.api.hookimpl` marks hook
implementations of :mod:`areal_core.hookspecs`).
"""

from __future__ import annotations

from pathlib import Path

__version__ = (Path(__file__).parent / "VERSION").read_text().strip()  # the one version of every distribution

from areal_core.api import hookimpl  # noqa: E402
from areal_core.api.errors import ArealError, ConfigError, PluginError  # noqa: E402
from areal_core.config import load_config  # noqa: E402


def run(config_path: str | None = None, overrides: list[str] | None = None) -> None:
    """Run the built-in GRPO trainer (what ``areal run`` does)."""
    from areal_core.cli import run_training

    run_training(config_path, overrides or [])


__all__ = ["ArealError", "ConfigError", "PluginError", "__version__", "hookimpl", "load_config", "run"]
