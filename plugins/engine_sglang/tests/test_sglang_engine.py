"""The sglang engine's own checks: launch command, the missing-sglang error, config validation, and
the parts of SGLang's protocol the engine matrix (tests/test_engine_matrix.py) does not reach:
bearer auth, refused requests, the begin/end weight-update session, recovery after a failed update and
after a trainer that fails mid-send.

The server is FakeSGLangServer (a fake of SGLang 0.5.23's native API over transformers, see
fake_sglang_server.py), started once per module; SGLang itself needs a CUDA machine.
"""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import attrs
import pytest
import torch

from areal_core.config import Config, ModelConfig, RolloutConfig, TinyModelSpec
from areal_core.api.engine import GenerationRequest, SamplingParams
from areal_core.api.errors import ArealError, ConfigError
from areal_core.builtin.platform_cpu.platform import CpuPlatform
from areal_core.api.scheduler import ProcessSpec, free_port
from areal_core.scheduler.local import LocalScheduler
from areal_core.testing import generate_all, greedy_request, hf_greedy, perturbed_model
from areal_core.tiny_model import ensure_tiny_model
from areal_core.api.weight_channel import WeightChannel, open_channel
from areal_engine_sglang.client import SGLangEngine
from areal_engine_sglang.launch import SERVER_MODULE, server_command

REPO = Path(__file__).resolve().parents[3]
FAKE_SGLANG = Path(__file__).resolve().parent / "fake_sglang_server.py"
#: runs the fake; one where sglang imports makes it join through SGLang's own code (sglang_weight_group)
SGLANG_PYTHON = os.environ.get("AREAL_SGLANG_PYTHON") or sys.executable
PROMPT = [3, 4, 5]


# --------------------------------------------------------------------------- no server


def test_server_command_passes_engine_args_and_keeps_the_api_key(tmp_path: Path) -> None:
    config = Config(
        model=ModelConfig(path=str(tmp_path)),
        rollout=RolloutConfig(
            engine="sglang",
            engine_args={
                "mem_fraction_static": 0.5,
                "context-length": 2048,
                "tp_size": 2,
                "api_key": "x",
                "enable-x": True,
            },
        ),
    )
    cmd = server_command(config, port=1234, seed=5, token="secret")
    assert cmd[:2] == ["-m", SERVER_MODULE]
    flag = {cmd[i]: cmd[i + 1] for i in range(2, len(cmd) - 1) if cmd[i].startswith("--")}
    assert flag["--mem-fraction-static"] == "0.5" and flag["--context-length"] == "2048" and flag["--tp-size"] == "2"
    assert flag["--api-key"] == "secret"  # engine_args cannot take the client's token away
    assert flag["--model-path"] == str(tmp_path) and flag["--host"] == "127.0.0.1" and flag["--port"] == "1234"
    assert flag["--weight-version"] == "0" and flag["--random-seed"] == "5" and "--enable-x" in cmd


@pytest.mark.skipif(importlib.util.find_spec("sglang") is not None, reason="sglang is installed here: this test covers machines without it")
def test_launch_without_sglang_says_what_to_install(tmp_path: Path) -> None:
    config = Config(
        fileroot=str(tmp_path), model=ModelConfig(path=str(tmp_path)), rollout=RolloutConfig(engine="sglang")
    )
    with LocalScheduler(CpuPlatform()) as scheduler:
        with pytest.raises(ConfigError, match=r"^rollout\.engine: .*pip install 'areal-engine-sglang\[cuda\]'") as info:
            SGLangEngine(config, CpuPlatform()).launch_servers(scheduler)
        assert "\n" not in str(info.value) and not scheduler.handles


@pytest.mark.slow
def test_gsm8k_cuda_config_with_sglang_validates_and_discovery_imports_no_sglang() -> None:
    run = subprocess.run(
        [sys.executable, "-m", "areal_core.cli", "config", "examples/math/gsm8k_grpo_cuda.yaml", "rollout.engine=sglang"],
        cwd=REPO, capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert run.returncode == 0, run.stderr[-2000:]
    assert "engine: sglang" in run.stdout
    probe = (
        "import sys; from areal_core.plugins import load_plugins; p = load_plugins(); "
        "p.registration('engine', 'sglang'); "
        "print(sorted(m for m in sys.modules if m.split('.')[0] in ('sglang', 'torch') or m == 'areal_engine_sglang.client'))"
    )
    out = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=120, check=True).stdout
    assert out.strip() == "[]"


# --------------------------------------------------------------------------- against the fake


@attrs.frozen
class Served:
    engine: SGLangEngine
    model: Any
    base_dir: Path


@pytest.fixture(scope="module")
def served(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Served]:
    base = ensure_tiny_model(TinyModelSpec(), ["abcdefghij0123456789+-= "], tmp_path_factory.mktemp("models"), seed=0)
    root = tmp_path_factory.mktemp("sglang")
    model = perturbed_model(base, seed=0)
    model.save_pretrained(root / "base")
    config = Config(
        fileroot=str(root), model=ModelConfig(path=str(root / "base")), rollout=RolloutConfig(engine="sglang")
    )
    engine = SGLangEngine(config, CpuPlatform())
    with LocalScheduler(CpuPlatform()) as scheduler:
        start_fake(scheduler, engine, root / "fake_sglang.log")
        yield Served(engine, model, root / "base")


def start_fake(scheduler: LocalScheduler, engine: SGLangEngine, log_file: Path) -> None:
    """FakeSGLangServer for ``engine.config``, started through ``scheduler``; ``engine`` attached to it."""
    port = free_port()
    cmd = [SGLANG_PYTHON, str(FAKE_SGLANG), *server_command(engine.config, port, seed=1, token=engine.token)[2:]]
    scheduler.start(ProcessSpec(name="fake_sglang", cmd=cmd, log_file=str(log_file)))
    address = f"127.0.0.1:{port}"
    deadline = time.monotonic() + 180
    while not engine.server_is_up(address):
        assert time.monotonic() < deadline, log_file.read_text()[-2000:]
        time.sleep(0.2)
    engine.attach([address])


def post(address: str, endpoint: str, body: Any, token: str | None) -> tuple[int, Any]:
    headers = {"Content-Type": "application/json"} | ({"Authorization": f"Bearer {token}"} if token else {})
    request = urllib.request.Request(f"http://{address}{endpoint}", json.dumps(body).encode(), headers, method="POST")
    try:
        with urllib.request.urlopen(request, timeout=60) as resp:
            return resp.status, json.loads(resp.read() or b"null")
    except urllib.error.HTTPError as exc:
        return exc.code, json.loads(exc.read() or b"null")


@pytest.mark.slow
def test_every_route_but_health_needs_the_api_key(served: Served) -> None:
    (address,) = served.engine.addresses
    calls = [
        ("/generate", {"input_ids": PROMPT}),
        ("/pause_generation", {}),
        ("/update_weight_version", {"new_version": "9"}),
    ]
    for token in (None, "wrong"):
        for endpoint, body in calls:
            assert post(address, endpoint, body, token) == (401, {"error": "Unauthorized"})
    assert served.engine.health() == [True] and served.engine.served_versions() == [0]


@pytest.mark.slow
def test_refused_requests_carry_sglangs_error_bodies(served: Served) -> None:
    (address,) = served.engine.addresses
    token = served.engine.token
    status, body = post(address, "/generate", {"input_ids": PROMPT, "sampling_params": {"seed": 3}}, token)
    assert status == 400 and body["error"].startswith("unknown field `seed`, expected one of `max_new_tokens`")
    assert post(address, "/generate", {"sampling_params": {}}, token) == (
        400,
        {"error": {"message": "Either text, input_ids or input_embeds should be provided."}},
    )
    status, body = post(address, "/update_weights_from_disk", {"weight_version": "3"}, token)
    assert status == 400 and body["object"] == "error" and "model_path" in body["message"]
    status, body = post(address, "/update_weights_from_distributed", {"names": [], "dtypes": [], "shapes": []}, token)
    assert status == 400 and body == {
        "success": False,
        "message": "update_weights_from_distributed must run between begin_weight_update() and end_weight_update()",
    }
    bad = GenerationRequest(input_ids=PROMPT, sampling=SamplingParams(max_new_tokens=4, top_p=0.0))
    with pytest.raises(ArealError, match=r"/generate failed \(400\): top_p must be in \(0, 1\], got 0.0"):
        generate_all(served.engine, [bad])
    with pytest.raises(ArealError, match="no weight-update session is open; call begin_weight_update"):
        served.engine.commit_weights(4)  # nothing was sent
    assert served.engine.served_versions() == [0]


class _Tensors:
    """A :class:`~areal_core.api.weight_channel.TensorSource` over fixed (name, tensor) pairs."""

    def __init__(self, named: list[tuple[str, torch.Tensor]]) -> None:
        self.named = named

    def specs(self) -> list[tuple[str, str, tuple[int, ...]]]:
        return [(n, str(t.dtype).removeprefix("torch."), tuple(t.shape)) for n, t in self.named]

    def __iter__(self) -> Iterator[tuple[str, torch.Tensor]]:
        return ((n, t.detach()) for n, t in self.named)


def _channel(engine: SGLangEngine, group_name: str) -> WeightChannel:
    """The engine's channel, joined by this process as trainer rank 0 (64 KiB buckets, 120 s deadline)."""
    spec = engine.weight_channel("127.0.0.1", free_port(), group_name)
    channel = open_channel(attrs.evolve(spec, bucket_bytes=1 << 16, timeout_s=120), rank=0, device=torch.device("cpu"))
    channel.join()
    return channel


@pytest.mark.slow
def test_a_failed_collective_update_is_recovered_by_the_next_one(served: Served) -> None:
    engine = served.engine
    (address,) = engine.addresses
    first = _channel(engine, "first")
    with pytest.raises(ArealError, match="Failed to update parameter online"):  # received, then refused
        first.send(_Tensors([("model.not_a_layer.weight", torch.zeros(4, 4))]), 5)
    assert first.group is None  # the failure left the group: destroyed here and on the server
    assert post(address, "/destroy_weights_update_group", {"group_name": "first"}, engine.token)[0] == 400

    new_model = perturbed_model(served.base_dir, seed=4, scale=0.2)
    second = _channel(engine, "second")
    try:
        second.send(_Tensors(list(new_model.named_parameters())), 6)  # ends the session the failure left open
        engine.commit_weights(6)
        assert engine.served_versions() == [6]
        (resp,) = generate_all(engine, [greedy_request(PROMPT, 16)])
        assert resp.versions == [6] * 16 and resp.output_ids == hf_greedy(new_model, PROMPT, 16)
    finally:
        second.leave()
        engine.load_weights_from_disk(str(served.base_dir), 0)
    with pytest.raises(ArealError, match="no weight-update session is open"):  # the commit ended it
        engine.commit_weights(7)


class _Failing(_Tensors):
    """Raises after its first ``n`` tensors: the trainer fails mid-send."""

    def __init__(self, named: list[tuple[str, torch.Tensor]], n: int) -> None:
        super().__init__(named)
        self.n = n

    def __iter__(self) -> Iterator[tuple[str, torch.Tensor]]:
        for i, item in enumerate(super().__iter__()):
            if i == self.n:
                time.sleep(3)  # a slow gather: the servers are already waiting in this bucket's broadcast
                raise RuntimeError("the trainer failed mid-send")
            yield item


@pytest.mark.slow
def test_a_trainer_failure_mid_send_releases_the_servers(served: Served) -> None:
    engine = served.engine
    channel = _channel(engine, "failing")
    params = list(perturbed_model(served.base_dir, seed=5, scale=0.2).named_parameters())
    # the trainer's error, or the server's, whose broadcast failed when the trainer left (not at a timeout)
    failed = "the trainer failed mid-send|Connection closed by peer|Group failing not in"
    with pytest.raises((RuntimeError, ArealError), match=failed):
        channel.send(_Failing(params, len(params) // 2), 8)
    assert channel.group is None
    (address,) = engine.addresses
    assert post(address, "/destroy_weights_update_group", {"group_name": "failing"}, engine.token)[0] == 400  # gone
    new_model = perturbed_model(served.base_dir, seed=6, scale=0.2)
    second = _channel(engine, "after_failure")
    try:
        second.send(_Tensors(list(new_model.named_parameters())), 9)
        engine.commit_weights(9)
        (resp,) = generate_all(engine, [greedy_request(PROMPT, 16)])
        assert resp.versions == [9] * 16 and resp.output_ids == hf_greedy(new_model, PROMPT, 16)
    finally:
        second.leave()
        engine.load_weights_from_disk(str(served.base_dir), 0)
