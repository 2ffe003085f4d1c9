"""Platform: what differs between CPU, CUDA and NPU, behind one class.

Platform classes are mostly class attributes plus methods that import heavy libraries (torch,
torch_npu) lazily, so registering and listing them stays cheap. ``is_available()`` must answer
without importing a device extension.
"""

from __future__ import annotations

import os
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

    @classmethod
    def is_available(cls) -> bool:
        """True when this machine can run the platform (no heavy imports)."""
        raise NotImplementedError

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

    def engine_env(self, engine_name: str) -> dict[str, str]:
        """Extra environment for an inference server of ``engine_name`` on this platform."""
        return {}

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

    def engine_env(self, engine_name: str) -> dict[str, str]:
        return {"VLLM_TARGET_DEVICE": "cpu"} if engine_name == "vllm" else {}


def resolve_platform(name: str, plugins: Any) -> Platform:
    """Instantiate the platform ``name`` ("auto" = highest-priority available one)."""
    if name == "auto":
        classes = [plugins.get("platform", n) for n in plugins.names("platform")]
        available = [cls for cls in classes if cls.is_available()]
        if not available:
            raise PluginError("no platform is available (the built-in cpu platform should be)")
        return max(available, key=lambda cls: cls.priority)()
    try:
        cls = plugins.get("platform", name)
    except PluginError as exc:
        raise ConfigError("platform", str(exc)) from None
    if not cls.is_available():
        others = [n for n in plugins.names("platform") if plugins.get("platform", n).is_available()]
        raise ConfigError(
            "platform",
            f"{name!r} is installed but not available on this machine "
            f"(available: {', '.join(others)}); use platform=auto or one of those",
        )
    return cls()


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
    """The active platform; resolved from ``AREAL_ACTIVE_PLATFORM`` (or auto) on first use."""
    if _ACTIVE is None:
        from areal_core.plugins import load_plugins

        return activate_platform(resolve_platform(os.environ.get(_ACTIVE_ENV, "auto"), load_plugins()))
    return _ACTIVE


def _reset_for_tests() -> None:
    global _ACTIVE
    _ACTIVE = None
    os.environ.pop(_ACTIVE_ENV, None)
