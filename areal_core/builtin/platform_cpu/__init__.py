"""Built-in platform: CPU (gloo)."""

from areal_core import hookimpl
from areal_core.api.platform import CpuPlatform


@hookimpl
def areal_register_platforms(register):
    register(CpuPlatform)
