"""The hf engine: real server processes on 127.0.0.1 checked against transformers itself.

The test model is the tiny Qwen3 with its weights perturbed (so greedy outputs vary instead of
repeating one token) and without an end-of-sequence id (so lengths are deterministic). One
server is shared per module; tests that change its weights restore version 0 afterwards.
"""

from __future__ import annotations

import asyncio
import json
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import attrs
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from areal_core.config import Config, ModelConfig, RolloutConfig, TinyModelSpec
from areal_core.api.engine import GenerationRequest, SamplingParams
from areal_core.api.wire import GenerateBody
from areal_core.api.http_engine import Router
from areal_core.api.errors import ArealError
from areal_core.builtin.engine_hf.client import HFEngine
from areal_core.builtin.engine_hf import generator
from areal_core.builtin.engine_hf.generator import sample
from areal_core.builtin.platform_cpu.platform import CpuPlatform
from areal_core.api.scheduler import free_port
from areal_core.scheduler.local import LocalScheduler
from areal_core.testing import (
    LoopThread,
    assert_greedy_on_kept_cache,
    assert_greedy_under,
    generate_all,
    greedy_request,
    hf_greedy,
    load_model,
    perturbed_model,
    wait_for,
)
from areal_core.tiny_model import ensure_tiny_model
from areal_core.api.weight_channel import flatten_bucket, open_channel, unflatten_bucket

PROMPTS = [[3, 4, 5], [7, 8, 9, 10, 11, 12, 13], [12], [5, 6, 7, 8, 9], [20, 3], [9, 9, 9, 9, 9, 9, 9, 9, 9, 9]]
LOGPROB_ATOL = 1e-4  # fp32 server vs fp32 recomputation; batching changes summation order only


# --------------------------------------------------------------------------- helpers


def make_config(run_root: Path, model_dir: Path, servers: int = 1) -> Config:
    return Config(
        fileroot=str(run_root),
        model=ModelConfig(path=str(model_dir)),
        rollout=RolloutConfig(servers=servers, server_startup_timeout=120, request_timeout=60),
    )


def raw_post(address: str, endpoint: str, body: dict, token: str | None) -> tuple[int, dict]:
    headers = {"Content-Type": "application/json"}
    if token is not None:
        headers["Authorization"] = f"Bearer {token}"
    req = urllib.request.Request(f"http://{address}{endpoint}", json.dumps(body).encode(), headers, method="POST")
    try:
        with urllib.request.urlopen(req, timeout=30) as resp:
            return resp.status, json.loads(resp.read())
    except urllib.error.HTTPError as exc:
        return exc.code, json.loads(exc.read())


# --------------------------------------------------------------------------- fixtures


@attrs.frozen
class Served:
    engine: HFEngine
    model: Any  # the reference model with the servers' version-0 weights
    v0_dir: Path  # those weights inside the run dir (so a server may reload them)
    run_dir: Path


@pytest.fixture(scope="module")
def base_model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return ensure_tiny_model(TinyModelSpec(), ["abcdefghij0123456789+-= "], tmp_path_factory.mktemp("models"), seed=0)


def _serve(root: Path, base: Path, servers: int) -> Iterator[Served]:
    model = perturbed_model(base, seed=0)
    config = make_config(root / "runs", Path(), servers)
    # the v0 weights live inside the run dir, so tests may reload them (a server-allowed path)
    v0_dir = config.run_dir / "weights" / "v0"
    model.save_pretrained(v0_dir)
    config = attrs.evolve(config, model=ModelConfig(path=str(v0_dir)))
    scheduler = LocalScheduler(CpuPlatform())
    try:
        engine = HFEngine(config, CpuPlatform())
        engine.launch_servers(scheduler)
        yield Served(engine, model, v0_dir, config.run_dir)
    finally:
        scheduler.stop_all()


@pytest.fixture(scope="module")
def served(tmp_path_factory: pytest.TempPathFactory, base_model: Path) -> Iterator[Served]:
    yield from _serve(tmp_path_factory.mktemp("one"), base_model, servers=1)


@pytest.fixture(scope="module")
def served_two(tmp_path_factory: pytest.TempPathFactory, base_model: Path) -> Iterator[Served]:
    yield from _serve(tmp_path_factory.mktemp("two"), base_model, servers=2)


@pytest.fixture
def restore_v0(served: Served) -> Iterator[None]:
    yield
    served.engine.resume()
    served.engine.load_weights_from_disk(str(served.v0_dir), 0)


# --------------------------------------------------------------------------- pure logic


@settings(max_examples=30, deadline=None)
@given(ids=st.lists(st.text("abcdefgh", min_size=1, max_size=3), min_size=1, max_size=40), servers=st.integers(1, 4))
def test_router_pins_ids_and_balances_new_ones(ids: list[str], servers: int) -> None:
    router = Router(servers)
    first: dict[str, int] = {}
    for rid in ids:
        server = router.acquire(rid)
        assert first.setdefault(rid, server) == server
    fresh, loads = Router(servers), [0] * servers
    for i in range(servers * 3):  # distinct ids, all in flight: spread evenly
        loads[fresh.acquire(f"id{i}")] += 1
    assert loads == [3] * servers


@settings(max_examples=25, deadline=None)
@given(
    parts=st.lists(
        st.tuples(
            st.sampled_from(["float32", "bfloat16", "float16", "int64"]), st.lists(st.integers(1, 4), max_size=3)
        ),
        min_size=1,
        max_size=5,
    )
)
def test_bucket_round_trip(parts: list[tuple[str, list[int]]]) -> None:
    tensors = [(torch.randn(shape) * 100).to(getattr(torch, dtype)) for dtype, shape in parts]
    flat = flatten_bucket(tensors)
    assert flat.dtype == torch.uint8
    back = unflatten_bucket(flat, [d for d, _ in parts], [s for _, s in parts])
    for original, restored in zip(tensors, back):
        assert restored.dtype == original.dtype and torch.equal(restored, original)


def test_sample_greedy_top_p_and_logprobs() -> None:
    logits = torch.tensor([[1.0, 3.0, 2.0, 0.0], [0.5, 0.1, 4.0, 0.2], [2.0, 1.0, 0.0, 5.0]])
    temperature = torch.tensor([1.0, 0.5, 2.0])
    gen = torch.Generator().manual_seed(0)
    tiny_top_p = torch.tensor([1e-6, 1e-6, 1e-6])  # keeps only the most likely token
    for greedy in (torch.tensor([True, True, True]), torch.tensor([False, False, False])):
        tokens, logprobs = sample(logits, temperature, tiny_top_p, greedy, torch.rand(3, generator=gen))
        assert tokens.tolist() == [1, 2, 3]
        expected = torch.log_softmax(logits / temperature[:, None], -1).gather(-1, tokens[:, None]).squeeze(-1)
        torch.testing.assert_close(logprobs, expected)
    n = 2000  # draws per row, taken as one batch of n copies
    no_greedy = torch.zeros(3 * n, dtype=torch.bool)
    draws, _ = sample(logits.repeat(n, 1), temperature.repeat(n), torch.ones(3 * n), no_greedy, torch.rand(3 * n, generator=gen))
    for row in range(3):  # top_p=1 samples the temperature-scaled distribution
        freq = torch.bincount(draws[row::3], minlength=4) / n
        torch.testing.assert_close(freq, torch.softmax(logits[row] / temperature[row], -1), atol=0.04, rtol=0)
    nucleus, _ = sample(logits[:1].repeat(n, 1), torch.ones(n), torch.full((n,), 0.7), no_greedy[:n], torch.rand(n, generator=gen))
    assert set(nucleus.tolist()) == {1, 2}  # p = .64, .24 | .09, .03: the 0.7 nucleus is {1, 2}


def test_sample_gives_each_row_what_it_gets_alone() -> None:
    """Greedy rows, nucleus rows and full-vocabulary rows take different paths in one batch; each
    row's token and log-prob are those it gets in a batch of its own (batching changes nothing)."""
    gen = torch.Generator().manual_seed(1)
    rows = 12
    logits = (torch.randn(rows, 97, generator=gen) * 3).to(torch.bfloat16)
    temperature = torch.rand(rows, generator=gen) + 0.3
    top_p = torch.tensor([1.0, 0.5, 0.9, 1.0] * 3)
    greedy = torch.tensor([True] * 4 + [False] * 8)
    uniforms = torch.rand(rows, generator=gen)
    tokens, logprobs = sample(logits, temperature, top_p, greedy, uniforms)
    assert tokens[:4].tolist() == logits[:4].argmax(-1).tolist()
    for row in range(rows):
        alone = sample(*(t[row : row + 1] for t in (logits, temperature, top_p, greedy, uniforms)))
        assert (alone[0].item(), alone[1].item()) == (tokens[row].item(), logprobs[row].item())


def test_newcomers_join_a_running_wave_prefilled_alone_and_decode_as_if_alone(
    base_model: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Continuous batching: queued requests join the running wave on its KV cache once a quarter of
    the batch is free, each prefilled once (the running rows never again), and every request
    decodes exactly what it decodes alone."""
    calls: list[tuple[str, int]] = []  # (model call, rows)
    for name in ("prefill", "step"):
        original = getattr(generator._Batch, name)

        def logged(self: Any, *args: Any, _original: Any = original, _name: str = name) -> Any:
            calls.append((_name, len(self.seqs)))
            return _original(self, *args)

        monkeypatch.setattr(generator._Batch, name, logged)
    gen = generator.Generator(perturbed_model(base_model, seed=0), eos_ids=frozenset(), pad_id=0, max_batch_size=8, seed=0)
    prompts = [[3, 4, 5], [6, 7], [8, 9, 10, 11], [5]]
    bodies = [
        GenerateBody(rid=f"r{i}", input_ids=prompts[i % 4], max_new_tokens=n, greedy=True)
        for i, n in enumerate([1, 1, 2, 3, 4, 5, 6, 7] + [6] * 4)
    ]  # fmt: skip

    async def run() -> tuple[list[list[int]], list[tuple[str, int]], list[list[int]]]:
        server = asyncio.create_task(gen.serve_forever())
        together = [r.output_ids for r in await gen.generate_many(bodies)]
        calls_together = list(calls)
        alone = [(await gen.generate(body)).output_ids for body in bodies]
        server.cancel()
        return together, calls_together, alone

    together, calls_together, alone = asyncio.run(run())
    assert together == alone and [len(out) for out in together] == [b.max_new_tokens for b in bodies]
    # 2 rows end at the prefill: 2 join; 1 ends: 1 free slot waits; the next ends: the last 2 join
    assert calls_together[:5] == [("prefill", 8), ("prefill", 2), ("step", 8), ("step", 7), ("prefill", 2)]
    assert sum(rows for call, rows in calls_together if call == "prefill") == len(bodies)  # each prefilled once


def test_a_cache_that_cannot_join_decodes_in_waves_re_formed_once_half_empty(
    base_model: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The fallback for caches that padding cannot join (sliding-window, static): a wave of 4 whose
    rows end one per step is re-formed with the waiting requests only once 2 rows are left."""
    calls: list[str] = []
    original = generator._Batch.prefill

    def logged(self: Any) -> Any:
        calls.append("prefill")
        return original(self)

    monkeypatch.setattr(generator._Batch, "prefill", logged)
    monkeypatch.setattr(generator, "_plain_growing", lambda cache: False)
    gen = generator.Generator(perturbed_model(base_model, seed=0), eos_ids=frozenset(), pad_id=0, max_batch_size=4, seed=0)
    bodies = [GenerateBody(rid=f"r{n}", input_ids=[3, 4, 5], max_new_tokens=n, greedy=True) for n in (1, 2, 3, 4, 4, 4, 4, 4)]

    async def run() -> list[list[int]]:
        server = asyncio.create_task(gen.serve_forever())
        together = [r.output_ids for r in await gen.generate_many(bodies)]
        server.cancel()
        return together

    together = asyncio.run(run())
    assert [len(out) for out in together] == [1, 2, 3, 4, 4, 4, 4, 4]
    assert together[4:] == [together[3]] * 4  # greedy on one prompt: the re-prefilled row decodes the same
    assert calls == ["prefill"] * 3  # 4 rows; 2 left + 2 newcomers; 2 left + the last 2


def test_a_failed_join_fails_every_row_in_flight_and_the_server_serves_on(
    base_model: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The joining rows' prefill fails: the 6 running rows and the 2 joining ones get the error (none
    is left waiting forever), and the requests still queued are served."""
    original, failures = generator._Batch.prefill, [RuntimeError("injected")]

    def prefill(self: Any) -> Any:
        if len(self.seqs) == 2 and failures:
            raise failures.pop()
        return original(self)

    monkeypatch.setattr(generator._Batch, "prefill", prefill)
    gen = generator.Generator(perturbed_model(base_model, seed=0), eos_ids=frozenset(), pad_id=0, max_batch_size=8, seed=0)
    bodies = [GenerateBody(rid=f"r{i}", input_ids=[3, 4], max_new_tokens=n, greedy=True) for i, n in enumerate([1, 1] + [4] * 10)]

    async def run() -> list[Any]:
        server = asyncio.create_task(gen.serve_forever())
        results = await asyncio.wait_for(asyncio.gather(*(gen.generate(b) for b in bodies), return_exceptions=True), 60)
        server.cancel()
        return results

    outcome = [type(r).__name__ if isinstance(r, Exception) else len(r.output_ids) for r in asyncio.run(run())]
    assert outcome == [1, 1] + ["RuntimeError"] * 8 + [4, 4]


def test_a_batch_drops_columns_only_padding_fills_and_a_join_pads_to_the_longer(base_model: Path) -> None:
    """A wave that lives on as rows come and go keeps its KV cache as wide as its longest row, not
    as wide as every row it ever held."""
    model = perturbed_model(base_model, seed=0)

    def prefilled(*prompts: list[int]) -> Any:
        seqs = [generator._Seq(GenerateBody(rid=f"r{i}", input_ids=p, max_new_tokens=4), None, frozenset()) for i, p in enumerate(prompts)]
        batch = generator._Batch(model, seqs, 0, torch.Generator().manual_seed(0))
        batch.prefill()
        return batch

    def widths(batch: Any) -> set[tuple[int, int]]:
        return {(layer.keys.shape[0], layer.keys.shape[2]) for layer in batch.cache.layers} | {tuple(batch.mask.shape)}

    batch = prefilled([1, 2, 3, 4, 5, 6], [7, 8])
    batch.keep([1])
    assert batch.can_join and widths(batch) == {(1, 2)} and batch.mask.tolist() == [[1, 1]]
    batch.join(prefilled([3, 4, 5]))
    assert widths(batch) == {(2, 3)} and batch.mask.tolist() == [[0, 1, 1], [1, 1, 1]]
    assert batch.positions.tolist() == [[1], [2]] and [seq.body.rid for seq in batch.seqs] == ["r1", "r0"]


# --------------------------------------------------------------------------- one server


@pytest.mark.slow
def test_sampled_logprobs_match_a_transformers_forward(served: Served) -> None:
    temperature = 0.7
    requests = [
        GenerationRequest(input_ids=p, sampling=SamplingParams(max_new_tokens=24, temperature=temperature, top_p=0.9))
        for p in PROMPTS
    ]
    for req, resp in zip(requests, generate_all(served.engine, requests)):
        assert resp.stop_reason == "length" and len(resp.output_ids) == 24
        assert resp.versions == [0] * 24 and resp.input_ids == req.input_ids
        ids = torch.tensor([req.input_ids + resp.output_ids])
        with torch.no_grad():
            logits = served.model(input_ids=ids).logits[0, len(req.input_ids) - 1 : -1].float()
        expected = torch.log_softmax(logits / temperature, -1).gather(-1, torch.tensor(resp.output_ids)[:, None])
        torch.testing.assert_close(torch.tensor(resp.logprobs), expected.squeeze(-1), atol=LOGPROB_ATOL, rtol=0)


@pytest.mark.slow
def test_stop_token_ends_generation_and_is_kept(served: Served) -> None:
    reference = hf_greedy(served.model, PROMPTS[1], 32)
    stop = reference[10]
    cut = reference.index(stop) + 1
    (resp,) = generate_all(served.engine, [greedy_request(PROMPTS[1], 32, stop_token_ids=(stop,))])
    assert resp.stop_reason == "stop" and resp.output_ids == reference[:cut]


def test_a_client_session_serves_every_request_on_its_loop(served: Served) -> None:
    """Inside ``client_session`` requests share one aiohttp session (closed on exit) and give the
    same outputs as requests that open their own."""
    engine = served.engine
    requests = [greedy_request(p, 8) for p in PROMPTS[:3]]
    alone = [resp.output_ids for resp in generate_all(engine, requests)]

    async def shared() -> tuple[Any, list[list[int]]]:
        async with engine.client_session():
            session = engine._sessions[asyncio.get_running_loop()]
            outputs = [(await engine.agenerate(r)).output_ids for r in requests]
            assert not session.closed
        return session, outputs

    session, outputs = asyncio.run(shared())
    assert outputs == alone and session.closed and not engine._sessions


@pytest.mark.slow
def test_one_batch_of_concurrent_requests_equals_one_at_a_time(served: Served) -> None:
    engine, (address,) = served.engine, served.engine.addresses
    requests = [greedy_request(p, 20) for p in PROMPTS]
    alone = [generate_all(engine, [r])[0].output_ids for r in requests]
    # hold the server so every request is queued, then release them into one wave
    assert raw_post(address, "/abort_all", {}, engine.token)[0] == 200
    loop = LoopThread()
    try:
        futures = [loop.submit(engine.agenerate(r)) for r in requests]
        wait_for(lambda: engine.server_health()[0].queued == len(requests), "all requests queued")
        assert raw_post(address, "/continue", {}, engine.token)[0] == 200
        together = [f.result(timeout=60).output_ids for f in futures]
    finally:
        raw_post(address, "/continue", {}, engine.token)
        loop.close()
    assert together == alone


@pytest.mark.slow
def test_requests_arriving_mid_wave_join_it_and_outputs_stay_exact(served: Served) -> None:
    engine, long_n, short_n = served.engine, 300, 8
    loop = LoopThread()
    try:
        long = loop.submit(engine.agenerate(greedy_request(PROMPTS[2], long_n)))
        wait_for(lambda: engine.server_health()[0].running == 1, "the long request to start decoding")
        short = [loop.submit(engine.agenerate(greedy_request(p, short_n))) for p in PROMPTS[:2]]
        short_out = [f.result(timeout=60).output_ids for f in short]
        # 300 decode steps leave a wide margin for the short ones to arrive while the long one runs
        assert not long.done()  # they joined its wave instead of waiting for it to finish
        long_out = long.result(timeout=60).output_ids
    finally:
        loop.close()
    assert short_out == [hf_greedy(served.model, p, short_n) for p in PROMPTS[:2]]
    assert long_out == hf_greedy(served.model, PROMPTS[2], long_n)  # exact across the re-prefill


def _count_segment_calls(engine: HFEngine, monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """Requests carried by each of the engine's (real) ``_generate_segments`` calls, as they happen."""
    counts: list[int] = []
    real = engine._generate_segments

    async def counted(session: Any, address: str, *, calls: list[Any]) -> list[Any]:
        counts.append(len(calls))
        return await real(session, address, calls=calls)

    monkeypatch.setattr(engine, "_generate_segments", counted)
    return counts


def test_a_group_is_one_call_and_equals_its_requests_sent_alone(served: Served, monkeypatch: pytest.MonkeyPatch) -> None:
    engine = served.engine
    requests = [greedy_request(p, 12) for p in PROMPTS]
    alone = [generate_all(engine, [r])[0].output_ids for r in requests]
    before = engine.server_health()[0].served
    counts = _count_segment_calls(engine, monkeypatch)
    responses = asyncio.run(engine.agenerate_group(requests))
    assert [r.output_ids for r in responses] == alone
    assert [r.input_ids for r in responses] == [r.input_ids for r in requests]
    assert counts == [len(requests)]  # one /generate_batch round trip
    assert engine.server_health()[0].served == before + len(requests)  # each request counted as one


def test_an_interrupted_group_continues_only_its_unfinished_requests(
    served: Served, monkeypatch: pytest.MonkeyPatch
) -> None:
    engine, lengths = served.engine, [4, 300, 300]
    requests = [greedy_request(PROMPTS[i], n) for i, n in enumerate(lengths)]
    counts = _count_segment_calls(engine, monkeypatch)
    loop = LoopThread()
    try:
        future = loop.submit(engine.agenerate_group(requests))
        wait_for(lambda: engine.server_health()[0].running == 2, "the short request to end, the long ones to decode")
        engine.pause()
        engine.set_version(7)
        engine.resume()
        responses = future.result(timeout=120)
    finally:
        engine.resume()
        engine.set_version(0)
        loop.close()
    assert counts == [3, 2]  # the second segment carries only the two aborted requests
    for req, resp, n in zip(requests, responses, lengths):
        assert resp.output_ids == hf_greedy(served.model, req.input_ids, n)  # exact across the abort
        assert resp.stop_reason == "length" and len(resp.logprobs) == n
    assert responses[0].versions == [0] * 4
    for resp in responses[1:]:
        k = resp.versions.index(7)
        assert k > 0 and resp.versions == [0] * k + [7] * (300 - k)  # per-token versions across the abort


def test_a_keep_pause_holds_requests_through_an_update_on_their_kv_cache(
    served: Served, restore_v0: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``pause_keeping`` (``rollout.pause_mode: keep``) parks the running requests; new weights load
    and, after ``resume``, each request decodes on in the same call: its tokens before the switch
    follow the old weights, those after it the new weights over the KV cache the old ones computed."""
    engine, n = served.engine, 300
    new_model = perturbed_model(served.v0_dir, seed=5)
    new_dir = served.run_dir / "weights" / "keep-v1"
    new_model.save_pretrained(new_dir)
    requests = [greedy_request(PROMPTS[i], n) for i in (0, 1)]
    counts = _count_segment_calls(engine, monkeypatch)
    loop = LoopThread()
    try:
        future = loop.submit(engine.agenerate_group(requests))
        wait_for(lambda: engine.server_health()[0].running == 2, "both requests to decode")
        engine.pause_keeping()
        health = engine.server_health()[0]
        assert health.paused and health.running == 2 and not future.done()
        engine.load_weights_from_disk(str(new_dir), 1)
        engine.set_version(1)
        engine.resume()
        responses = future.result(timeout=120)
    finally:
        loop.close()
    assert counts == [2]  # one call: nothing was aborted or sent again
    for req, resp in zip(requests, responses):
        k = resp.versions.index(1)
        assert 0 < k < n and resp.versions == [0] * k + [1] * (n - k)
        assert resp.stop_reason == "length" and len(resp.logprobs) == n
        assert_greedy_under(served.model, req.input_ids, resp.output_ids[:k])
        assert_greedy_on_kept_cache(served.model, new_model, req.input_ids, resp.output_ids, k)


def test_a_batch_with_one_bad_body_queues_none(served: Served) -> None:
    (address,) = served.engine.addresses
    good = {"rid": "g", "input_ids": [3], "max_new_tokens": 2}
    before = served.engine.server_health()[0].served
    status, reply = raw_post(address, "/generate_batch", [good, {**good, "max_new_tokens": 0}], served.engine.token)
    assert status == 400 and "max_new_tokens must be >= 1" in reply["error"]
    assert raw_post(address, "/generate_batch", [], served.engine.token)[0] == 400
    assert served.engine.server_health()[0].served == before


@pytest.mark.slow
def test_mutating_endpoints_need_the_token(served: Served) -> None:
    (address,) = served.engine.addresses
    body = {"rid": "x", "input_ids": [3], "max_new_tokens": 2}
    for token in (None, "wrong"):
        calls = [("/generate", body), ("/abort_all", {}), ("/hold_all", {}),
                 ("/load_weights", {"path": "/", "version": 1})]
        for endpoint, payload in calls:
            status, reply = raw_post(address, endpoint, payload, token)
            assert status == 401 and "token" in reply["error"]
    assert served.engine.health() == [True]  # /health is open
    assert raw_post(address, "/generate", body, served.engine.token)[0] == 200


@pytest.mark.slow
def test_load_refuses_paths_outside_the_run_dir(served: Served, tmp_path: Path) -> None:
    served.model.save_pretrained(tmp_path / "outside")
    with pytest.raises(ArealError, match="outside the server's --allowed-root"):
        served.engine.load_weights_from_disk(str(tmp_path / "outside"), 3)
    with pytest.raises(ArealError, match="starts with '.'"):
        served.engine.load_weights_from_disk(str(served.run_dir / "weights" / ".tmp-v3"), 3)
    assert served.engine.server_health()[0].version == 0


class _Tensors:
    """A fixed :class:`~areal_core.api.weight_channel.TensorSource`."""

    def __init__(self, named: dict[str, torch.Tensor]) -> None:
        self.named = named

    def specs(self) -> list[tuple[str, str, tuple[int, ...]]]:
        return [(n, str(t.dtype).removeprefix("torch."), tuple(t.shape)) for n, t in self.named.items()]

    def __iter__(self) -> Any:
        return iter(self.named.items())


@pytest.mark.slow
def test_the_hf_channel_stages_buckets_until_the_commit(served: Served, restore_v0: None) -> None:
    engine = served.engine
    spec = engine.weight_channel("127.0.0.1", free_port(), "test_weights")
    channel = open_channel(attrs.evolve(spec, bucket_bytes=4096), rank=0, device=torch.device("cpu"))
    channel.join()

    new_model = perturbed_model(served.v0_dir, seed=2, scale=0.2)
    names = ["model.embed_tokens.weight", "model.layers.0.mlp.down_proj.weight", "model.norm.weight"]
    params = dict(new_model.named_parameters())
    tensors = [params[names[0]].detach(), params[names[1]].detach().to(torch.bfloat16), params[names[2]].detach()]
    channel.send(_Tensors(dict(zip(names, tensors))), 7)
    (staged,) = generate_all(engine, [greedy_request(PROMPTS[3], 24)])  # staged only: old weights serve
    assert staged.versions == [0] * 24 and staged.output_ids == hf_greedy(served.model, PROMPTS[3], 24)
    with pytest.raises(ArealError, match="cannot commit version 8: version 7 is staged"):
        engine.commit_weights(8)
    engine.commit_weights(7)
    with pytest.raises(ArealError, match="nothing is staged"):  # a commit consumes the staged buckets
        engine.commit_weights(7)
    channel.leave()

    expected = load_model(served.v0_dir)  # the servers' v0 weights ...
    with torch.no_grad():  # ... with the three received tensors (bf16 one cast back to fp32)
        for name, tensor in zip(names, tensors):
            dict(expected.named_parameters())[name].copy_(tensor)
    (resp,) = generate_all(engine, [greedy_request(PROMPTS[3], 24)])
    assert resp.versions == [7] * 24
    assert resp.output_ids == hf_greedy(expected, PROMPTS[3], 24)
    assert resp.output_ids != hf_greedy(served.model, PROMPTS[3], 24)


# --------------------------------------------------------------------------- two servers, start-up


@pytest.mark.slow
def test_two_servers_pin_request_ids(served_two: Served) -> None:
    engine = served_two.engine
    before = [h.served for h in engine.server_health()]
    short = SamplingParams(max_new_tokens=2)
    for rid in ("a", "b"):  # sequential new ids alternate between the servers
        generate_all(engine, [GenerationRequest(input_ids=[3], sampling=short, request_id=rid)])
    middle = [h.served for h in engine.server_health()]
    assert [m - b for m, b in zip(middle, before)] == [1, 1]
    for _ in range(3):  # the same id goes back to its server
        generate_all(engine, [GenerationRequest(input_ids=[3], sampling=short, request_id="a")])
    after = [h.served for h in engine.server_health()]
    assert sorted(a - m for a, m in zip(after, middle)) == [0, 3]
    outputs = generate_all(engine, [greedy_request(p, 16) for p in PROMPTS])  # both servers, same weights
    assert [r.output_ids for r in outputs] == [hf_greedy(served_two.model, p, 16) for p in PROMPTS]


@pytest.mark.slow
def test_a_server_that_dies_at_start_up_reports_its_log(tmp_path: Path) -> None:
    (tmp_path / "empty_model").mkdir()
    config = make_config(tmp_path / "runs", tmp_path / "empty_model")
    with LocalScheduler(CpuPlatform()) as scheduler:
        with pytest.raises(ArealError, match=r"exited with code \d+ during start-up(.|\n)*log tail"):
            HFEngine(config, CpuPlatform()).launch_servers(scheduler)
