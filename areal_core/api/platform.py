"""Platform: what differs between CPU, CUDA and NPU, behind one class.

Platform classes are mostly class attributes plus methods that import heavy libraries (torch,
torch_npu) lazily, so registering and listing them stays cheap. ``is_available()`` must answer
without importing a device extension.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from typing import Any, ClassVar

from areal_core.errors import ConfigError, PluginError


class Platform:
    """Base class; a plugin subclasses it and registers it via ``areal_register_platforms``."""

    name: ClassVar[str] = ""
    device_type: ClassVar[str] = "cpu"
    dispatch_key: ClassVar[str] = "CPU"
    dist_backend: ClassVar[str] = "gloo"
    visible_devices_env: ClassVar[str | None] = None
    ray_resource: ClassVar[str | None] = None  # Ray resource key ("GPU", "NPU"); None = CPU only
    priority: ClassVar[int] = 0  # `platform: auto` picks the available one with the highest

    def __init__(self, options: Mapping[str, Any] | None = None) -> None:
        """``options``: the config's ``plugins.platform_<name>`` section. Its one key, ``engine_env``,
        overrides :meth:`default_engine_env` per variable (a null value drops the variable)."""
        self.engine_env_overrides = _engine_env_overrides(self.options_key(), options or {})

    @classmethod
    def options_key(cls) -> str:
        """Where this platform's options live in the config: ``plugins.platform_<name>``."""
        return f"plugins.platform_{cls.name}"

    @classmethod
    def is_available(cls) -> bool:
        """True when this machine can run the platform (no heavy imports)."""
        raise NotImplementedError

    @classmethod
    def unavailable_reason(cls) -> str:
        """Why :meth:`is_available` is False, for one-line errors (e.g. "torch_npu is not installed")."""
        return ""

    def init_process(self) -> None:
        """Per-process set-up before torch.distributed (e.g. ``import torch_npu``)."""

    def device_count(self) -> int:
        raise NotImplementedError

    def set_device(self, index: int) -> None:
        raise NotImplementedError

    def synchronize(self) -> None:
        raise NotImplementedError

    def empty_cache(self) -> None:
        raise NotImplementedError

    def memory_stats(self) -> dict[str, int]:
        """Current/peak bytes in use on this process's device."""
        raise NotImplementedError

    def default_engine_env(self, engine_name: str) -> dict[str, str]:
        """The platform's own extra environment for an inference server of ``engine_name``."""
        return {}

    def engine_env(self, engine_name: str) -> dict[str, str]:
        """Extra environment for an inference server of ``engine_name`` on this platform:
        :meth:`default_engine_env` with the config's ``engine_env`` overrides applied."""
        env = self.default_engine_env(engine_name)
        for var, value in self.engine_env_overrides.items():
            if value is None:
                env.pop(var, None)
            else:
                env[var] = value
        return env

    def device(self, index: int = 0) -> Any:
        import torch

        return torch.device(self.device_type, index) if self.device_type != "cpu" else torch.device("cpu")


class CpuPlatform(Platform):
    """Always available; gloo collectives, thread count instead of devices."""

    name = "cpu"
    device_type = "cpu"
    dispatch_key = "CPU"
    dist_backend = "gloo"
    priority = -100

    @classmethod
    def is_available(cls) -> bool:
        return True

    def device_count(self) -> int:
        return 1

    def set_device(self, index: int) -> None:
        if index != 0:
            raise ValueError(f"the CPU platform has one device, got index {index}")

    def synchronize(self) -> None:
        pass

    def empty_cache(self) -> None:
        pass

    def memory_stats(self) -> dict[str, int]:
        import resource

        peak_kib = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
        return {"peak_bytes": peak_kib * 1024}

    def default_engine_env(self, engine_name: str) -> dict[str, str]:
        return {"VLLM_TARGET_DEVICE": "cpu"} if engine_name == "vllm" else {}


def _engine_env_overrides(key: str, options: Mapping[str, Any]) -> dict[str, str | None]:
    """Check a platform's options section; return its ``engine_env`` as strings (None = drop)."""
    if not isinstance(options, Mapping):
        raise ConfigError(key, f"expected a mapping like {{engine_env: {{VAR: value}}}}, got {options!r}")
    for name in options:
        if name != "engine_env":
            raise ConfigError(f"{key}.{name}", "unknown platform option (options: engine_env)")
    env = options.get("engine_env") or {}
    if not isinstance(env, Mapping):
        raise ConfigError(f"{key}.engine_env", f"expected a mapping of VAR: value, got {env!r}")
    overrides: dict[str, str | None] = {}
    for var, value in env.items():
        if value is not None and not isinstance(value, (str, int, float, bool)):
            raise ConfigError(f"{key}.engine_env.{var}", f"expected a string, number or null, got {value!r}")
        overrides[str(var)] = None if value is None else str(value)
    return overrides


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
