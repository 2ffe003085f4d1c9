"""Platform resolution: auto picks the highest-priority available platform; one per process."""

from __future__ import annotations

import pytest

from areal_core.api.errors import ConfigError, PluginError
from areal_core.api.platform import Platform
from areal_core.active_platform import current_platform, activate_platform, resolve_platform
from areal_core.builtin.platform_cpu.platform import CpuPlatform


class _Avail(Platform):
    name, device_type, dist_backend, priority = "fastdev", "fastdev", "fakeccl", 10

    @classmethod
    def is_available(cls) -> bool:
        return True


class _Absent(Platform):
    name, priority = "absentdev", 50

    @classmethod
    def is_available(cls) -> bool:
        return False


def test_auto_is_cpu_with_builtins_only(areal_plugins):
    platform = resolve_platform("auto", areal_plugins.load())
    assert isinstance(platform, CpuPlatform) and platform.dist_backend == "gloo"


def test_auto_picks_highest_priority_available(areal_plugins):
    areal_plugins.add_hooks("p", areal_register_platforms=lambda register: (register(_Avail), register(_Absent)))
    assert resolve_platform("auto", areal_plugins.load()).name == "fastdev"


def test_explicit_unavailable_platform_is_a_clear_error(areal_plugins):
    areal_plugins.add_hooks("p", areal_register_platforms=lambda register: register(_Absent))
    with pytest.raises(ConfigError, match=r"platform: 'absentdev' is installed but not available on this machine \(available: cpu\)"):
        resolve_platform("absentdev", areal_plugins.load())


def test_explicit_unknown_platform_suggests_install(areal_plugins):
    with pytest.raises(ConfigError, match="pip install areal-platform-npu"):
        resolve_platform("npu", areal_plugins.load())


def test_exactly_one_platform_per_process(areal_plugins):
    areal_plugins.add_hooks("p", areal_register_platforms=lambda register: register(_Avail))
    plugins = areal_plugins.load()
    cpu = activate_platform(resolve_platform("cpu", plugins))
    assert current_platform() is cpu
    assert activate_platform(CpuPlatform()) is cpu  # same platform again is fine
    with pytest.raises(PluginError, match="platform 'cpu' is already active"):
        activate_platform(resolve_platform("fastdev", plugins))
