"""areal-platform-cuda: registers the ``cuda`` platform (``platform: cuda``, or ``auto`` with GPUs).

Discovery imports only :mod:`areal_platform_cuda.platform`, which imports torch lazily.
"""

from areal_core.api import hookimpl

AREAL_API = ">=1.0,<2"  # the areal_core.api versions this plugin supports


@hookimpl
def areal_register_platforms(register):
    from areal_platform_cuda.platform import CudaPlatform

    register(CudaPlatform)
