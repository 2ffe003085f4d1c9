"""The ``cuda`` platform: NVIDIA GPUs, NCCL collectives, ``CUDA_VISIBLE_DEVICES``, Ray ``GPU``.

``is_available`` must not initialise CUDA in the controller: ``torch.cuda.is_available()`` calls
``cudaGetDeviceCount``, which runs ``cuInit`` in the calling process (and even the NVML-based
check, ``PYTORCH_NVML_BASED_CUDA_CHECK=1``, falls back to it when NVML fails). An initialised
driver makes later forks unusable for CUDA and pins the parent to the driver it saw. So a CPU
build of torch answers False at once, and a CUDA build asks ``torch.cuda.is_available()`` in a
short child process (about a second, once per process: the answer is cached).
"""

from __future__ import annotations

import subprocess
import sys
from importlib.util import find_spec
from typing import Any, ClassVar

from areal_core.api.platform import Platform

#: What the child process runs; prints True/False.
PROBE_CODE = "import torch; print(torch.cuda.is_available())"
PROBE_TIMEOUT_S = 120.0


def probe_in_child(code: str = PROBE_CODE, timeout: float = PROBE_TIMEOUT_S) -> tuple[bool, str]:
    """Run ``code`` in a fresh interpreter; (its last stdout line == "True", why not if False)."""
    try:
        run = subprocess.run(
            [sys.executable, "-c", code], check=False, capture_output=True, text=True, timeout=timeout,
            stdin=subprocess.DEVNULL,
        )
    except subprocess.TimeoutExpired:
        return False, f"the CUDA probe did not answer within {timeout:.0f}s"
    lines = run.stdout.strip().splitlines()
    if run.returncode == 0 and lines and lines[-1] == "True":
        return True, ""
    if run.returncode != 0:
        last = (run.stderr.strip().splitlines() or ["no output"])[-1]
        return False, f"the CUDA probe failed: {last}"
    return False, "torch.cuda.is_available() is False (no GPU visible, or no usable driver)"


class CudaPlatform(Platform):
    """NVIDIA GPUs: device type ``cuda``, NCCL, ``CUDA_VISIBLE_DEVICES``, Ray resource ``GPU``."""

    name = "cuda"
    device_type = "cuda"
    dispatch_key = "CUDA"
    dist_backend = "nccl"
    visible_devices_env = "CUDA_VISIBLE_DEVICES"
    ray_resource = "GPU"
    priority = 10

    _probe: ClassVar[tuple[bool, str] | None] = None  # (available, why not), once per process

    @classmethod
    def _probe_result(cls) -> tuple[bool, str]:
        if cls._probe is None:
            if find_spec("torch") is None:
                cls._probe = (False, "torch is not installed")
            else:
                import torch

                if not torch.backends.cuda.is_built():
                    cls._probe = (False, f"torch {torch.__version__} is a CPU build")
                else:
                    cls._probe = probe_in_child()
        return cls._probe

    @classmethod
    def is_available(cls) -> bool:
        return cls._probe_result()[0]

    @classmethod
    def unavailable_reason(cls) -> str:
        return cls._probe_result()[1]

    @staticmethod
    def _cuda() -> Any:
        import torch

        return torch.cuda

    def device_count(self) -> int:
        return int(self._cuda().device_count())

    def set_device(self, index: int) -> None:
        self._cuda().set_device(index)

    def synchronize(self) -> None:
        self._cuda().synchronize()

    def empty_cache(self) -> None:
        self._cuda().empty_cache()

    def memory_stats(self) -> dict[str, int]:
        cuda = self._cuda()
        return {
            "allocated_bytes": int(cuda.memory_allocated()),
            "peak_bytes": int(cuda.max_memory_allocated()),
            "reserved_bytes": int(cuda.memory_reserved()),
        }
