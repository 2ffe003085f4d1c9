"""The ``npu`` platform: Ascend NPUs through torch_npu, HCCL collectives, vLLM-Ascend serving.

Availability is answered without importing torch_npu (which, once installed, torch itself loads
on ``import torch``, and which fails without CANN): torch_npu must be findable, the CANN
environment set (``source .../set_env.sh`` exports ``ASCEND_HOME_PATH``/``ASCEND_TOOLKIT_HOME``)
and at least one ``/dev/davinci<N>`` device node present. Only :meth:`NpuPlatform.init_process`
imports torch_npu; the device calls go through ``torch.npu`` after that.
"""

from __future__ import annotations

import glob
import os
from importlib.util import find_spec
from typing import Any

from areal_core.api.errors import ArealError
from areal_core.api.platform import Platform

#: Environment variables the CANN ``set_env.sh`` scripts export; one set means CANN is set up.
ASCEND_ENV_VARS: tuple[str, ...] = ("ASCEND_HOME_PATH", "ASCEND_TOOLKIT_HOME")
#: Device nodes of the Ascend driver, one per NPU (davinci_manager and friends do not match).
DEVICE_GLOB = "/dev/davinci[0-9]*"

#: Environment for inference servers on Ascend (each overridable: plugins.platform_npu.engine_env).
SERVING_ENV: dict[str, str] = {
    "HCCL_CONNECT_TIMEOUT": "1800",  # seconds to set up an HCCL link (CANN default 120: too short at start-up)
    "HCCL_EXEC_TIMEOUT": "3600",  # seconds a collective may wait, e.g. for a trainer busy with a step
    "PYTORCH_NPU_ALLOC_CONF": "expandable_segments:True",  # less fragmentation across weight updates
    "TASK_QUEUE_ENABLE": "1",  # torch_npu's asynchronous operator dispatch queue (level 1)
}


class NpuPlatform(Platform):
    """Ascend NPU: device type ``npu``, dispatch key ``PrivateUse1``, HCCL, Ray resource ``NPU``."""

    name = "npu"
    device_type = "npu"
    dispatch_key = "PrivateUse1"  # torch_npu registers its kernels under torch's out-of-tree key
    dist_backend = "hccl"
    visible_devices_env = "ASCEND_RT_VISIBLE_DEVICES"
    ray_resource = "NPU"
    priority = 10

    # ------------------------------------------------------------------ discovery (no torch_npu)
    @classmethod
    def missing_parts(cls) -> list[str]:
        """What this machine lacks to run on NPUs (empty = available); imports nothing."""
        missing = []
        if find_spec("torch_npu") is None:
            missing.append("torch_npu is not installed")
        if not any(os.environ.get(var) for var in ASCEND_ENV_VARS):
            missing.append(f"CANN is not set up (no {' or '.join(ASCEND_ENV_VARS)}: source set_env.sh)")
        if not glob.glob(DEVICE_GLOB):
            missing.append(f"no NPU device nodes {DEVICE_GLOB}")
        return missing

    @classmethod
    def is_available(cls) -> bool:
        return not cls.missing_parts()

    @classmethod
    def unavailable_reason(cls) -> str:
        return "; ".join(cls.missing_parts())

    # ------------------------------------------------------------------ per process
    def init_process(self) -> None:
        """Import torch_npu, which registers the ``npu`` device and the ``hccl`` c10d backend."""
        try:
            import torch_npu  # noqa: F401
        except Exception as exc:  # noqa: BLE001 - ImportError, or OSError from a missing CANN library
            detail = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
            raise ArealError(
                "platform 'npu' needs torch_npu (the build matching your torch) and CANN "
                f"(source /usr/local/Ascend/ascend-toolkit/set_env.sh): import torch_npu failed: {detail}"
            ) from None

    @staticmethod
    def _npu() -> Any:
        import torch

        npu = getattr(torch, "npu", None)
        if npu is None:
            raise ArealError("torch.npu is missing: activate the npu platform (init_process) before using devices")
        return npu

    def device_count(self) -> int:
        return int(self._npu().device_count())

    def set_device(self, index: int) -> None:
        self._npu().set_device(index)

    def synchronize(self) -> None:
        self._npu().synchronize()

    def empty_cache(self) -> None:
        self._npu().empty_cache()

    def memory_stats(self) -> dict[str, int]:
        npu = self._npu()
        return {
            "allocated_bytes": int(npu.memory_allocated()),
            "peak_bytes": int(npu.max_memory_allocated()),
            "reserved_bytes": int(npu.memory_reserved()),
        }

    def default_engine_env(self, engine_name: str) -> dict[str, str]:
        """The Ascend runtime settings for any server process using torch_npu (vLLM-Ascend, hf)."""
        return dict(SERVING_ENV)
