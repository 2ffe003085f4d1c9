"""Which platform this process runs on: resolve one by name, activate it once, find it again."""

from __future__ import annotations

import os
from collections.abc import Mapping
from typing import Any

from areal_core.api.platform import Platform
from areal_core.api.errors import ConfigError, PluginError


def resolve_platform(
    name: str, plugins: Any, options: Mapping[str, Any] | None = None, *, require_available: bool = True
) -> Platform:
    """Instantiate the platform ``name`` ("auto" = highest-priority available one).

    ``options`` is the config's ``plugins`` dict; the platform gets its ``platform_<name>`` section.
    ``require_available=False`` returns an explicitly named platform even when this machine cannot
    run it (``areal config`` validates such a config; a run must not).
    """
    options = options or {}
    if name == "auto":
        classes = [plugins.get("platform", n) for n in plugins.names("platform")]
        available = [cls for cls in classes if cls.is_available()]
        if not available:
            raise PluginError("no platform is available (the built-in cpu platform should be)")
        cls = max(available, key=lambda cls: cls.priority)
        return cls(options.get(cls.options_key().removeprefix("plugins.")))
    try:
        cls = plugins.get("platform", name)
    except PluginError as exc:
        raise ConfigError("platform", str(exc)) from None
    if require_available and not cls.is_available():
        raise ConfigError("platform", unavailable_message(cls, plugins))
    return cls(options.get(cls.options_key().removeprefix("plugins.")))


def unavailable_message(cls: type[Platform], plugins: Any) -> str:
    """One line: platform ``cls`` cannot run here, why, and which platforms can."""
    others = [n for n in plugins.names("platform") if plugins.get("platform", n).is_available()]
    reason = cls.unavailable_reason()
    return (
        f"{cls.name!r} is installed but not available on this machine ({f'{reason}; ' if reason else ''}"
        f"available: {', '.join(others)}); use platform=auto or one of those"
    )


_ACTIVE: Platform | None = None
_ACTIVE_ENV = "AREAL_ACTIVE_PLATFORM"


def activate_platform(platform: Platform) -> Platform:
    """Make ``platform`` this process's platform; a second, different one is an error."""
    global _ACTIVE
    if _ACTIVE is not None and _ACTIVE.name != platform.name:
        raise PluginError(
            f"platform {_ACTIVE.name!r} is already active in this process; cannot switch to "
            f"{platform.name!r}"
        )
    if _ACTIVE is None:
        platform.init_process()
        _ACTIVE = platform
        os.environ[_ACTIVE_ENV] = platform.name  # child processes inherit the choice
    return _ACTIVE


def current_platform() -> Platform:
    """The active platform; resolved from ``AREAL_ACTIVE_PLATFORM`` (or auto) on first use.

    A name inherited from the controller is not probed again (its ``init_process`` still fails
    clearly): probing can be slow, e.g. CUDA's runs a child process.
    """
    if _ACTIVE is None:
        from areal_core.plugins import load_plugins

        name = os.environ.get(_ACTIVE_ENV, "auto")
        return activate_platform(resolve_platform(name, load_plugins(), require_available=False))
    return _ACTIVE


def _reset_for_tests() -> None:
    global _ACTIVE
    _ACTIVE = None
    os.environ.pop(_ACTIVE_ENV, None)
