"""Built-in platform: CPU (gloo)."""

from areal_core.api import hookimpl
from areal_core.builtin.platform_cpu.platform import CpuPlatform


@hookimpl
def areal_register_platforms(register):
    register(CpuPlatform)
