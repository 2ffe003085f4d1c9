"""The cuda platform: availability without touching CUDA in the parent, and (on a GPU) devices,
memory stats and NCCL groups. The GPU tests run in scripts/device_check_cuda.sh."""

from __future__ import annotations

import subprocess
import sys

import pytest
import torch
from areal_platform_cuda.platform import CudaPlatform, probe_in_child

from areal_core.api.errors import ConfigError
from areal_core.active_platform import resolve_platform
from areal_core.plugins import load_plugins
from areal_core.api.scheduler import free_port

on_gpu = pytest.mark.skipif(not CudaPlatform.is_available(), reason="no usable CUDA GPU here")


def test_class_attributes() -> None:
    p = CudaPlatform
    assert (p.name, p.device_type, p.dist_backend) == ("cuda", "cuda", "nccl")
    assert (p.visible_devices_env, p.ray_resource) == ("CUDA_VISIBLE_DEVICES", "GPU")


@pytest.mark.parametrize(
    ("code", "available", "reason"),
    [
        ("print(True)", True, ""),
        ("print(False)", False, "torch.cuda.is_available() is False"),
        ("import sys; sys.exit('libcuda.so.1: cannot open shared object file')", False, "libcuda.so.1"),
        ("import time; time.sleep(30)", False, "did not answer within 2s"),
    ],
)
def test_the_probe_reads_a_child_process(code: str, available: bool, reason: str) -> None:
    ok, why = probe_in_child(code, timeout=2.0 if "sleep" in code else 60.0)
    assert ok is available and reason in why and "\n" not in why


@pytest.mark.slow
def test_is_available_never_initialises_cuda_in_the_calling_process() -> None:
    code = (
        "from areal_platform_cuda.platform import CudaPlatform; a = CudaPlatform.is_available(); "
        "import torch; print(a, torch.cuda.is_initialized())"
    )
    run = subprocess.run([sys.executable, "-c", code], check=False, capture_output=True, text=True, timeout=180)
    assert run.returncode == 0, run.stderr
    available, initialised = run.stdout.split()
    assert available == str(CudaPlatform.is_available()) and initialised == "False"


@pytest.mark.skipif(torch.backends.cuda.is_built(), reason="a CUDA build of torch")
def test_a_cpu_build_is_not_cuda_and_explicit_cuda_fails_in_one_line() -> None:
    assert not CudaPlatform.is_available()
    assert "CPU build" in CudaPlatform.unavailable_reason()
    with pytest.raises(ConfigError) as err:
        resolve_platform("cuda", load_plugins(autoload=True))
    assert "'cuda' is installed but not available" in str(err.value) and "CPU build" in str(err.value)
    assert "\n" not in str(err.value)


def test_engine_env_overrides_from_config() -> None:
    platform = CudaPlatform({"engine_env": {"NCCL_DEBUG": "WARN", "NCCL_P2P_DISABLE": 1}})
    assert platform.engine_env("vllm") == {"NCCL_DEBUG": "WARN", "NCCL_P2P_DISABLE": "1"}
    assert CudaPlatform().engine_env("sglang") == {}


# ---------------------------------------------------------------- on a GPU only
@on_gpu
def test_auto_resolves_to_cuda_on_a_gpu_machine() -> None:
    assert resolve_platform("auto", load_plugins(autoload=True)).name in ("cuda", "npu")


@on_gpu
def test_device_calls_and_memory_stats() -> None:
    platform = CudaPlatform()
    platform.init_process()
    assert platform.device_count() >= 1
    platform.set_device(0)
    before = platform.memory_stats()
    block = torch.empty(64 * 2**20, dtype=torch.uint8, device=platform.device(0))
    platform.synchronize()
    after = platform.memory_stats()
    assert after["allocated_bytes"] - before["allocated_bytes"] >= 64 * 2**20
    assert after["peak_bytes"] >= after["allocated_bytes"] and after["reserved_bytes"] >= after["allocated_bytes"]
    del block
    platform.empty_cache()
    assert platform.memory_stats()["allocated_bytes"] == before["allocated_bytes"]


@on_gpu
def test_nccl_train_group(monkeypatch: pytest.MonkeyPatch) -> None:
    """One rank: the training group on ``dist_backend`` (weight channels are the engines' own:
    vLLM's and SGLang's, checked by scripts/device_check_cuda.sh)."""
    import torch.distributed as dist

    platform = CudaPlatform()
    platform.set_device(0)
    device = platform.device(0)
    for var, value in {"RANK": "0", "WORLD_SIZE": "1", "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(free_port())}.items():
        monkeypatch.setenv(var, value)
    dist.init_process_group(backend=platform.dist_backend, init_method="env://")
    try:
        assert dist.get_backend() == "nccl"
        t = torch.ones(4, device=device)
        dist.all_reduce(t)
        assert t.tolist() == [1.0] * 4
    finally:
        dist.destroy_process_group()
