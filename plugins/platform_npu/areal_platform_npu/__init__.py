"""areal-platform-npu: registers the ``npu`` platform (``platform: npu``, or ``auto`` on Ascend).

Discovery imports only :mod:`areal_platform_npu.platform`, which never imports torch_npu.
"""

from areal_core.api import hookimpl

AREAL_API = ">=1.0,<2"  # the areal_core.api versions this plugin supports


@hookimpl
def areal_register_platforms(register):
    from areal_platform_npu.platform import NpuPlatform

    register(NpuPlatform)
