"""The npu platform on a CPU machine: discovery, resolution, engine env, devices, HCCL groups.

What cannot run here (torch_npu, CANN, NPUs) is the FAKE torch_npu in ``tests/fake_npu``; the
groups it backs are real gloo groups between real processes.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from areal_platform_npu import platform as npu_platform
from areal_platform_npu.platform import SERVING_ENV, NpuPlatform

from areal_core.config import load_config
from areal_core.api.errors import ArealError, ConfigError
from areal_core.active_platform import resolve_platform
from areal_core.plugins import load_plugins
from areal_core.api.scheduler import ProcessSpec, free_port
from areal_core.api.devices import physical_devices, server_devices, trainer_devices
from areal_core.scheduler.local import LocalScheduler

HERE = Path(__file__).parent
ENV_DUMP = "import json, os; print('ENV=' + json.dumps(dict(os.environ)))"


def _plugins():
    return load_plugins(autoload=True)


# ---------------------------------------------------------------- discovery and resolution
def test_loading_plugins_and_probing_never_import_torch_npu(simulated_ascend_host: Path) -> None:
    plugins = _plugins()
    assert plugins.get("platform", "npu") is NpuPlatform
    assert NpuPlatform.is_available()  # found the FAKE torch_npu through find_spec only
    assert resolve_platform("npu", plugins).name == "npu"
    assert "torch_npu" not in sys.modules


@pytest.mark.slow
def test_areal_plugins_in_a_subprocess_never_imports_torch_npu(fake_npu_env: dict[str, str], tmp_path: Path) -> None:
    run = subprocess.run(["areal", "plugins"], check=False, env=fake_npu_env, capture_output=True, text=True, timeout=120)
    assert run.returncode == 0, run.stderr
    assert "platform: npu" in run.stdout and "platform: cuda" in run.stdout
    code = (
        "import sys; from areal_core.plugins import load_plugins; p = load_plugins(); "
        "p.get('platform', 'npu').is_available(); print('torch_npu' in sys.modules)"
    )
    run = subprocess.run([sys.executable, "-c", code], check=False, env=fake_npu_env, capture_output=True, text=True, timeout=120)
    assert run.stdout.strip() == "False", run.stderr
    assert not Path(fake_npu_env["FAKE_TORCH_NPU_IMPORT_MARKER"]).exists()


@pytest.mark.skipif(NpuPlatform.is_available(), reason="an Ascend host: auto is npu there")
def test_auto_is_cpu_here_with_both_device_plugins_installed() -> None:
    plugins = _plugins()
    assert {"cpu", "cuda", "npu"} <= set(plugins.names("platform"))
    expected = "cuda" if plugins.get("platform", "cuda").is_available() else "cpu"
    assert resolve_platform("auto", plugins).name == expected


def test_simulated_ascend_host_selects_npu_over_cpu(simulated_ascend_host: Path) -> None:
    assert resolve_platform("auto", _plugins()).name == "npu"
    assert "torch_npu" not in sys.modules


@pytest.mark.parametrize("part", ["torch_npu", "CANN", "device nodes"])
def test_a_host_missing_one_part_is_not_npu_and_says_which(
    simulated_ascend_host: Path, monkeypatch: pytest.MonkeyPatch, part: str
) -> None:
    if part == "torch_npu":
        monkeypatch.setattr(npu_platform, "find_spec", lambda name: None)
    elif part == "CANN":
        monkeypatch.delenv("ASCEND_HOME_PATH")
        monkeypatch.delenv("ASCEND_TOOLKIT_HOME", raising=False)
    else:
        for node in simulated_ascend_host.glob("davinci[0-9]*"):
            node.unlink()
    assert not NpuPlatform.is_available()
    assert NpuPlatform.unavailable_reason().count(";") == 0 and part in NpuPlatform.unavailable_reason()
    plugins = _plugins()
    assert resolve_platform("auto", plugins).name != "npu"
    with pytest.raises(ConfigError) as err:
        resolve_platform("npu", plugins)
    assert "\n" not in str(err.value) and part in str(err.value)


@pytest.mark.skipif(NpuPlatform.is_available(), reason="an Ascend host")
def test_explicit_npu_here_is_one_line_naming_what_is_missing() -> None:
    with pytest.raises(ConfigError) as err:
        resolve_platform("npu", _plugins())
    message = str(err.value)
    assert message.startswith("platform: 'npu' is installed but not available on this machine (")
    assert "no NPU device nodes" in message and "\n" not in message


def test_init_process_without_torch_npu_is_one_clear_error(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "torch_npu", None)  # as if not installed: import raises ImportError
    with pytest.raises(ArealError) as err:
        NpuPlatform().init_process()
    assert "needs torch_npu" in str(err.value) and "import torch_npu failed" in str(err.value)
    assert "\n" not in str(err.value)


# ---------------------------------------------------------------- engine env
def test_engine_env_has_the_ascend_serving_vars() -> None:
    env = NpuPlatform().engine_env("vllm")
    assert env == SERVING_ENV
    assert {"HCCL_CONNECT_TIMEOUT", "PYTORCH_NPU_ALLOC_CONF", "TASK_QUEUE_ENABLE"} <= set(env)


def test_engine_env_is_overridable_from_the_config() -> None:
    config = load_config(
        None,
        [
            "platform=npu",
            "plugins.platform_npu.engine_env.TASK_QUEUE_ENABLE=2",
            "plugins.platform_npu.engine_env.HCCL_CONNECT_TIMEOUT=null",
            "plugins.platform_npu.engine_env.HCCL_BUFFSIZE=256",
        ],
    )
    platform = resolve_platform("npu", _plugins(), config.plugins, require_available=False)
    env = platform.engine_env("vllm")
    assert env["TASK_QUEUE_ENABLE"] == "2" and env["HCCL_BUFFSIZE"] == "256"
    assert "HCCL_CONNECT_TIMEOUT" not in env
    assert env["PYTORCH_NPU_ALLOC_CONF"] == SERVING_ENV["PYTORCH_NPU_ALLOC_CONF"]


@pytest.mark.parametrize(
    ("options", "key"),
    [
        ({"engine_envs": {}}, "plugins.platform_npu.engine_envs: unknown platform option"),
        ({"engine_env": ["A=1"]}, "plugins.platform_npu.engine_env: expected a mapping"),
        ({"engine_env": {"A": [1]}}, "plugins.platform_npu.engine_env.A: expected a string, number or null"),
    ],
)
def test_bad_platform_options_are_one_line_errors(options: dict, key: str) -> None:
    with pytest.raises(ConfigError) as err:
        NpuPlatform(options)
    assert str(err.value).startswith(key) and "\n" not in str(err.value)


# ---------------------------------------------------------------- devices per process
def _layout(logs: Path, servers: int, per_server: int, trainers: int) -> dict[str, str]:
    """ASCEND_RT_VISIBLE_DEVICES each process of a run gets, read back from real subprocesses."""
    config = load_config(
        None,
        [
            "platform=npu",
            f"rollout.servers={servers}",
            f"rollout.devices_per_server={per_server}",
            f"actor.world_size={trainers}",
        ],
    )
    platform = NpuPlatform()
    specs = [
        (f"server{i}", server_devices(config, platform, i), platform.engine_env("vllm")) for i in range(servers)
    ] + [(f"trainer{r}", trainer_devices(config, platform, r), {}) for r in range(trainers)]
    seen: dict[str, str] = {}
    with LocalScheduler(platform) as scheduler:
        for name, devices, env in specs:
            log = logs / f"{name}-{servers}x{per_server}+{trainers}.log"
            cmd = [sys.executable, "-c", ENV_DUMP]
            scheduler.start(ProcessSpec(name=name, cmd=cmd, env=env, devices=devices, log_file=str(log)))
        for handle, (name, _, env) in zip(scheduler.handles, specs):
            assert handle.popen.wait(timeout=60) == 0, name
            child = json.loads(Path(handle.log_file).read_text().split("ENV=", 1)[1])
            assert all(child.get(k) == v for k, v in env.items()), name
            seen[name] = child.get("ASCEND_RT_VISIBLE_DEVICES", "")
    return seen


@pytest.mark.slow
def test_visible_devices_for_one_plus_one(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.delenv("ASCEND_RT_VISIBLE_DEVICES", raising=False)
    assert _layout(tmp_path, 1, 1, 1) == {"server0": "0", "trainer0": "1"}


@pytest.mark.slow
def test_visible_devices_for_four_plus_four(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.delenv("ASCEND_RT_VISIBLE_DEVICES", raising=False)
    expected = {f"server{i}": str(i) for i in range(4)} | {f"trainer{r}": str(4 + r) for r in range(4)}
    assert _layout(tmp_path, 4, 1, 4) == expected
    two_by_two = _layout(tmp_path, 2, 2, 4)
    assert two_by_two["server0"] == "0,1" and two_by_two["server1"] == "2,3"
    assert [two_by_two[f"trainer{r}"] for r in range(4)] == ["4", "5", "6", "7"]


@pytest.mark.slow
def test_a_controller_limited_to_some_npus_places_the_run_on_those(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("ASCEND_RT_VISIBLE_DEVICES", "4,5")
    assert _layout(tmp_path, 1, 1, 1) == {"server0": "4", "trainer0": "5"}
    with pytest.raises(ArealError, match=r"needs device index 2, but ASCEND_RT_VISIBLE_DEVICES=4,5 leaves 2 visible"):
        _layout(tmp_path, 1, 1, 2)


@pytest.mark.parametrize(
    ("indices", "visible", "expected"),
    [((0, 1), None, ("0", "1")), ((0, 1), "", ("0", "1")), ((1,), "6, 7", ("7",)), ((), "3", ())],
)
def test_physical_devices(indices: tuple[int, ...], visible: str | None, expected: tuple[str, ...]) -> None:
    assert physical_devices(indices, visible) == expected


# ---------------------------------------------------------------- torch.npu calls and HCCL groups
@pytest.mark.slow
def test_training_group_subgroup_and_fsdp2_run_on_hccl(fake_npu_env: dict[str, str]) -> None:
    """Two real ranks: each activates the platform (imports the FAKE torch_npu, which registers
    ``hccl`` as torch_npu does: extended API), pins its device, joins the training group on
    ``dist_backend``, broadcasts over a subgroup and takes one FSDP2 step, then reports."""
    env = {**fake_npu_env, "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(free_port()), "WORLD_SIZE": "2"}
    procs = [
        subprocess.Popen(
            [sys.executable, str(HERE / "npu_rank.py")],
            env={**env, "RANK": str(rank), "LOCAL_RANK": str(rank), "ASCEND_RT_VISIBLE_DEVICES": str(4 + rank)},
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for rank in range(2)
    ]
    try:
        results = []
        for proc in procs:
            out, err = proc.communicate(timeout=180)
            assert proc.returncode == 0, err[-3000:]
            results.append(json.loads(out.strip().splitlines()[-1]))
    finally:
        for proc in procs:
            proc.kill() if proc.poll() is None else None
    for rank, res in enumerate(results):
        assert res["imported"] == "0.0.0+fake"
        assert res["device"] == "npu:1" and res["device_module"]  # PrivateUse1 renamed to npu
        assert res["train_backend"] == res["subgroup_backend"] == res["mesh_backend"] == "hccl"
        # torch called the creator through the extended API: world group, then the subgroup
        assert [c["options"] for c in res["created"]] == ["_DistributedBackendOptions"] * 2
        assert [(c["group_rank"], c["group_size"]) for c in res["created"]] == [(rank, 2)] * 2
        assert res["created"][1]["global_ranks_in_group"] == [0, 1]
        assert res["all_reduce"] == 3.0  # 1 + 2 over the training group
        assert res["broadcast"] == [0.0, 1.0, 2.0, 3.0]  # rank 0's tensor over the subgroup
        assert res["fsdp_error"] < 1e-5  # the sharded step equals the plain one on both batches
        assert res["device_count"] == 1 and res["current_device"] == 0  # one visible device each
        assert res["calls"] == ["set_device", "manual_seed_all", "synchronize", "empty_cache"]  # seed reaches npu
        assert res["memory"] == {"allocated_bytes": 1024, "peak_bytes": 4096, "reserved_bytes": 4096}
