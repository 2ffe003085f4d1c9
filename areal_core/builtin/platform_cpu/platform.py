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
