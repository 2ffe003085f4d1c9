"""Platform: what differs between CPU, CUDA and NPU, behind one class.

Platform classes are mostly class attributes plus methods that import heavy libraries (torch,
torch_npu) lazily, so registering and listing them stays cheap. ``is_available()`` must answer
without importing a device extension.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, ClassVar

from areal_core.api.errors import ConfigError


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
