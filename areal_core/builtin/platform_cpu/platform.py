"""The built-in CPU platform: gloo collectives, threads instead of devices."""

from __future__ import annotations

from areal_core.api.platform import Platform


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

    def init_process(self) -> None:
        """Flush denormal floats to zero: CPU math on them is slow (a train step of the quickstart's
        model took 7% longer); what they would add is below fp32's normal range (~1e-38)."""
        import numpy
        import torch

        for dtype in (numpy.float16, numpy.float32, numpy.float64):
            numpy.finfo(dtype)  # cached now: computed later, numpy would warn its smallest subnormal is 0
        torch.set_flush_denormal(True)

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
