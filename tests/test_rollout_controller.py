"""RolloutRunner: exactly-once consumption, rejection/failure counting, staleness, pause/resume."""

from __future__ import annotations

import asyncio
import gc
import logging
import random
import time
import types
from typing import Any, Iterator

import pytest
from hypothesis import given
from hypothesis import strategies as st
from rollout_doubles import HoldingEngine, ScriptedEngine

from areal_core.agent import AgentProxy
from areal_core.agent.openai_api import RequestError, Sampling
from areal_core.api.engine import GenerationRequest, InferenceEngine, SamplingParams
from areal_core.config import GenerationConfig
from areal_core.rollout.runner import RolloutRunner, _lags, _token_versions
from areal_core.rollout.dataloader import PromptLoader
from areal_core.rollout.failures import FailureRateError, FailureTracker
from areal_core.rollout.staleness import StalenessManager
from areal_core.api.workflow import TokenSequence
from areal_core.api.trajectory import Trajectory
from areal_core.testing import LoopThread, wait_for

#: Largest version lag of a consumed token per bound, over the controller tests (reported).
OBSERVED_MAX_LAG: dict[int, int] = {}


class GroupWorkflow:
    """Test workflow: ``n`` samples of a prompt; rejects ids in ``reject``, raises on ids in ``fail``."""

    def __init__(self, n: int = 2, max_new_tokens: int = 4, reject=(), fail=(), grouped: bool = False) -> None:
        self.n, self.reject, self.fail, self.grouped = n, set(reject), set(fail), grouped
        self.sampling = SamplingParams(max_new_tokens=max_new_tokens)

    async def __call__(self, engine: InferenceEngine, data: dict[str, Any]) -> list[Trajectory] | None:
        if data["id"] in self.fail:
            raise RuntimeError("scripted workflow failure")
        prompt = [100, data["n"]]
        requests = [GenerationRequest(input_ids=prompt, sampling=self.sampling) for _ in range(self.n)]
        if self.grouped:
            responses = await engine.agenerate_group(requests)
        else:
            responses = await asyncio.gather(*(engine.agenerate(r) for r in requests))
        if data["id"] in self.reject:
            return None
        trajectories = []
        for response in responses:
            seq = TokenSequence()
            seq.add_context(prompt)
            seq.add_output(response, len(response.output_ids))
            trajectories.append(seq.to_trajectory(data["id"], 1.0, {}))
        return trajectories


class RecordingLoader(Iterator[dict[str, Any]]):
    """Wraps a PromptLoader and records the order in which items were handed out."""

    def __init__(self, loader: PromptLoader) -> None:
        self.loader, self.taken = loader, []

    def __next__(self) -> dict[str, Any]:
        item = next(self.loader)
        self.taken.append(item["id"])
        return item


def _items(n: int) -> list[dict[str, Any]]:
    return [{"id": f"p{i}", "n": i} for i in range(n)]


def _jittery_engine(seed: int = 0, slow_every: int = 5) -> ScriptedEngine:
    """Token delays that vary by prompt, with a slow tail every ``slow_every`` prompts."""
    rng = random.Random(seed)
    delays = {i: (0.004 if i % slow_every == 0 else rng.uniform(0.0001, 0.001)) for i in range(1000)}
    return ScriptedEngine(delay=lambda r: delays[r.input_ids[1]])


def _controller(engine, *, batch_size, eta, max_concurrent=8, version=0) -> RolloutRunner:
    staleness = StalenessManager(
        batch_size=batch_size, max_head_offpolicyness=eta, max_concurrent=max_concurrent, version=version
    )
    return RolloutRunner(engine, staleness)


def _episodes(batch: list[Trajectory], group_size: int = 2) -> list[str]:
    """Prompt ids of the batch's episodes, in order, checking that each group is contiguous."""
    groups = [batch[i : i + group_size] for i in range(0, len(batch), group_size)]
    assert all(len({t.prompt_id for t in g}) == 1 and len(g) == group_size for g in groups)
    return [g[0].prompt_id for g in groups]


def _bump(ctl: RolloutRunner) -> None:
    """A weight update: pause, new version, resume."""
    ctl.pause()
    ctl.set_version(ctl.version + 1)
    ctl.resume()


def test_every_item_consumed_once_per_epoch():
    loader = RecordingLoader(PromptLoader(_items(10), seed=3))
    consumed: list[str] = []
    carried_over = set()
    with _controller(_jittery_engine(), batch_size=3, eta=1) as ctl:
        for _ in range(8):
            batch = ctl.prepare_batch(loader, GroupWorkflow(), timeout=60)
            assert len(batch) == 3 * 2 and len(_episodes(batch)) == 3
            consumed += _episodes(batch)
            carried_over |= {d["id"] for d in ctl.in_flight()}
            _bump(ctl)
        ctl.end_intake()
        left = len(ctl.in_flight())
        consumed += _episodes(ctl.wait(left, timeout=60))
        stats = ctl.stats
    assert sorted(consumed) == sorted(loader.taken)  # nothing lost, nothing twice
    assert len(loader.taken) >= 24
    for epoch in range(len(loader.taken) // 10):
        assert sorted(loader.taken[10 * epoch : 10 * epoch + 10]) == sorted(d["id"] for d in _items(10))
    assert carried_over  # some items were in flight when a batch returned, and still got consumed
    assert stats.consumed == stats.accepted == len(consumed) and stats.rejected == stats.failed == 0
    assert stats.running == stats.queued == 0


def test_the_pipe_refills_between_batches_until_the_intake_ends():
    """While the caller trains on a batch, each episode that ends is replaced from the loader
    (``max_concurrent`` binds here), up to the staleness window; ``end_intake`` stops that."""
    loader = RecordingLoader(PromptLoader(_items(100), seed=0))
    with _controller(ScriptedEngine(), batch_size=2, eta=10, max_concurrent=4) as ctl:
        ctl.prepare_batch(loader, GroupWorkflow(), timeout=60)
        window = (10 + 1) * 2  # items version 0 admits, the batch taken included
        deadline = time.monotonic() + 30
        while len(loader.taken) < window and time.monotonic() < deadline:
            time.sleep(0.01)
        assert len(loader.taken) == window  # the pipe was refilled with no prepare_batch waiting
        ctl.end_intake()
        _bump(ctl)  # the window opens by a batch, but the intake is over
        time.sleep(0.3)
        assert len(loader.taken) == window
        with ctl.intake_held():
            assert len(ctl.in_flight()) == window - 2


@given(st.lists(st.lists(st.lists(st.integers(-1, 5), max_size=30), min_size=1, max_size=4), max_size=4),
       st.integers(5, 8))
def test_batch_lags_are_those_of_every_generated_token(episodes: list[list[list[int]]], version: int) -> None:
    counted = [_token_versions([_trajectory(v, f"u{i}") for i, v in enumerate(ep)]) for ep in episodes]
    lags = [version - v for ep in episodes for vs in ep for v in vs if v >= 0]
    max_lag, mean_lag = _lags(counted, version)
    assert max_lag == max(lags, default=0)
    assert mean_lag == pytest.approx(sum(lags) / len(lags) if lags else 0.0)


def _trajectory(versions: list[int], uid: str) -> Trajectory:
    n = len(versions)
    return Trajectory(input_ids=[0] * n, loss_mask=[0] * n, logprobs=[0.0] * n, versions=versions, reward=0.0,
                      prompt_id="p", uid=uid)


def test_stopping_answers_an_agent_s_pending_model_call_and_leaves_no_task_pending(caplog) -> None:
    """An agent's model call runs on the rollout loop, put there by the proxy's own thread: the
    runner's stop cancels it too, and the agent gets a 409 instead of a call that never returns."""
    engine = ScriptedEngine(delay=lambda request: 3600.0)  # a token an hour: the call is in flight at the stop
    no_decoding_tokenizer = types.SimpleNamespace(eos_token_id=None, pad_token_id=None, all_special_tokens=[])
    proxy = AgentProxy(engine, no_decoding_tokenizer, GenerationConfig(max_new_tokens=4))
    proxy_loop = LoopThread()  # the proxy server's loop
    runner = RolloutRunner(engine, StalenessManager(batch_size=1, max_head_offpolicyness=0, max_concurrent=1))
    runner.start()
    try:
        session = proxy.sessions.start(runner.run(_running_loop()))
        call = proxy_loop.submit(proxy.complete(session, [1, 2], Sampling(), "chatcmpl"))
        wait_for(lambda: engine.in_flight == 1, "the model call to reach the engine")
        with caplog.at_level(logging.ERROR, logger="asyncio"):
            runner.stop()
            with pytest.raises(RequestError) as refused:
                call.result(timeout=30)
            gc.collect()
    finally:
        runner.stop()
        proxy_loop.close()
    assert refused.value.status == 409
    assert "destroyed" not in caplog.text


async def _running_loop() -> asyncio.AbstractEventLoop:
    return asyncio.get_running_loop()


def test_rejections_are_counted_and_never_consumed():
    items = _items(12)
    rejected = {"p1", "p4", "p7"}
    with _controller(ScriptedEngine(), batch_size=3, eta=3) as ctl:
        for item in items:
            ctl.submit(item, GroupWorkflow(reject=rejected))
        batch = ctl.wait(9, timeout=60)
        stats = ctl.stats
    assert sorted(_episodes(batch)) == sorted(d["id"] for d in items if d["id"] not in rejected)
    assert (stats.submitted, stats.accepted, stats.rejected, stats.failed) == (12, 9, 3, 0)


def test_a_loader_that_raises_fails_prepare_batch_with_its_error():
    """The loop tops the pipe up from the loader while prepare_batch waits: its error still
    reaches the trainer's call."""

    def loader() -> Iterator[dict[str, Any]]:
        yield from _items(3)
        raise OSError("dataset shard unreadable")

    items = loader()
    with _controller(ScriptedEngine(), batch_size=2, eta=1, max_concurrent=2) as ctl:
        with pytest.raises(OSError, match="dataset shard unreadable"):
            for _ in range(3):  # the second batch at the latest runs into the error
                ctl.prepare_batch(items, GroupWorkflow(), timeout=60)
                _bump(ctl)


def test_workflow_exceptions_are_counted_and_reported_in_one_line(caplog):
    loader = PromptLoader(_items(6), shuffle=False)
    caplog.set_level(logging.INFO)
    with _controller(ScriptedEngine(), batch_size=2, eta=0, max_concurrent=2) as ctl:
        batches = []
        for _ in range(3):  # the loop survives each failure and keeps serving batches
            batches.append(ctl.prepare_batch(loader, GroupWorkflow(fail={"p0", "p3"}), timeout=60))
            _bump(ctl)
        stats = ctl.stats
        counts, line = ctl.failures.report()
    consumed = [pid for b in batches for pid in _episodes(b)]
    assert "p0" not in consumed and "p3" not in consumed and len(consumed) == 6
    assert stats.failed >= 2 and stats.accepted >= 6 and stats.retried == 0
    assert counts.failed == stats.failed and line is not None
    assert "RuntimeError: scripted workflow failure (x" in line
    assert caplog.records == []  # no line (or traceback) per failure: the caller logs `line` once per step


def test_a_failed_episode_runs_again_up_to_episode_retries_then_is_dropped():
    attempts: dict[str, int] = {}

    async def fails_twice(engine, data):
        attempts[data["id"]] = attempts.get(data["id"], 0) + 1
        if data["id"] == "p0" and attempts["p0"] <= 2:
            raise RuntimeError("flaky")
        return await GroupWorkflow()(engine, data)

    for retries, p0_consumed in ((2, True), (1, False)):
        attempts.clear()
        staleness = StalenessManager(batch_size=1, max_head_offpolicyness=4, max_concurrent=1)
        with RolloutRunner(ScriptedEngine(), staleness, episode_retries=retries) as ctl:
            ctl.submit({"id": "p0", "n": 0}, fails_twice)
            ctl.submit({"id": "p1", "n": 1}, fails_twice)
            batch = ctl.wait(1, timeout=60)
            stats = ctl.stats
        assert attempts["p0"] == retries + 1
        assert (_episodes(batch) == ["p0"]) is p0_consumed
        assert (stats.retried, stats.failed) == (retries, 0 if p0_consumed else 1)


def test_every_episode_failing_aborts_the_batch_with_one_line():
    loader = PromptLoader(_items(4), shuffle=False)
    staleness = StalenessManager(batch_size=2, max_head_offpolicyness=0, max_concurrent=2)
    failures = FailureTracker("episode attempts", "rollout.max_failure_rate", max_rate=0.5, window=6)
    with RolloutRunner(ScriptedEngine(), staleness, episode_retries=1, failures=failures) as ctl:
        with pytest.raises(FailureRateError) as info:
            ctl.prepare_batch(loader, GroupWorkflow(fail={f"p{i}" for i in range(4)}), timeout=60)
        stats = ctl.stats
    message = str(info.value)
    assert message.startswith("rollout.max_failure_rate: 6 of the last 6 episode attempts failed")
    assert "RuntimeError: scripted workflow failure" in message and "\n" not in message
    assert stats.failed + stats.retried <= 8  # no prompt attempted more than 1 + episode_retries times


@pytest.mark.parametrize("eta", [0, 1, 2])
def test_consumed_tokens_never_exceed_the_staleness_bound(eta):
    loader = PromptLoader(_items(40), seed=eta)
    batch_size = 4
    with _controller(_jittery_engine(seed=eta, slow_every=3), batch_size=batch_size, eta=eta, max_concurrent=12) as ctl:
        for _ in range(10):
            batch = ctl.prepare_batch(loader, GroupWorkflow(max_new_tokens=6), timeout=60)
            lags = [ctl.version - v for t in batch for v in t.versions if v >= 0]
            assert max(lags) <= eta, f"a token {max(lags)} versions old at version {ctl.version}"
            if eta == 0:
                assert {v for t in batch for v in t.versions if v >= 0} == {ctl.version}
            assert ctl.stats.batch_max_lag == max(lags)
            OBSERVED_MAX_LAG[eta] = max(OBSERVED_MAX_LAG.get(eta, 0), max(lags))
            _bump(ctl)
        stats = ctl.stats
    assert stats.running + stats.queued <= 12
    print(f"max_head_offpolicyness={eta}: largest observed token lag {OBSERVED_MAX_LAG[eta]}")


def test_a_batch_for_a_version_still_loading_counts_its_lag_from_the_trainer_s_version():
    loader = PromptLoader(_items(8), shuffle=False)
    with _controller(ScriptedEngine(), batch_size=2, eta=1) as ctl:
        first = ctl.prepare_batch(loader, GroupWorkflow(max_new_tokens=3), timeout=60)
        assert ctl.stats.batch_max_lag == 0
        wait_for(lambda: ctl.staleness.ready >= 2, "the next batch, generated on version 0")
        ctl.pause()  # version 1 is loading (an overlapped publish): the servers still serve 0
        ctl.prepare_batch(loader, GroupWorkflow(max_new_tokens=3), timeout=60, trainer_version=1)
        assert (ctl.stats.batch_max_lag, ctl.stats.batch_mean_lag) == (1, 1.0)
        ctl.resume()
    assert {v for t in first for v in t.versions if v >= 0} == {0}


@pytest.mark.parametrize("grouped", [False, True])
def test_pause_interrupts_generation_and_resume_continues_it(grouped):
    engine = ScriptedEngine(delay=lambda r: 0.01)
    with _controller(engine, batch_size=2, eta=1) as ctl:
        for item in _items(2):
            ctl.submit(item, GroupWorkflow(n=2, max_new_tokens=60, grouped=grouped))
        while engine.tokens < 4:  # generation has started
            time.sleep(0.005)
        ctl.pause()
        while engine.in_flight and engine.aborts < engine.in_flight:
            time.sleep(0.005)
        frozen = engine.tokens
        time.sleep(0.1)
        assert engine.tokens == frozen  # nothing is generated while paused
        ctl.set_version(1)
        ctl.resume()
        batch = ctl.wait(2, timeout=60)
    assert engine.aborts == 4  # every in-flight request was aborted once
    _assert_each_response_spans_versions_0_and_1(batch, tokens=60)
    assert ctl.stats.batch_max_lag == 1


def _assert_each_response_spans_versions_0_and_1(batch, tokens: int) -> None:
    for traj in batch:
        out_versions = [v for v in traj.versions if v >= 0]
        assert len(out_versions) == tokens and out_versions == sorted(out_versions)
        assert out_versions[0] == 0 and out_versions[-1] == 1  # one response, two weight versions


def test_a_keep_pause_holds_generation_and_aborts_nothing():
    """``rollout.pause_mode: keep``: the runner's pause goes to ``pause_keeping``; each response
    still spans both versions, in one piece."""
    engine = HoldingEngine(delay=lambda r: 0.01)
    staleness = StalenessManager(batch_size=2, max_head_offpolicyness=1, max_concurrent=8)
    with RolloutRunner(engine, staleness, keep_on_pause=True) as ctl:
        for item in _items(2):
            ctl.submit(item, GroupWorkflow(n=2, max_new_tokens=60))
        while engine.tokens < 4:  # generation has started
            time.sleep(0.005)
        ctl.pause()
        time.sleep(0.03)  # the tokens being produced at the pause come out
        held = engine.tokens
        time.sleep(0.1)
        assert engine.tokens == held  # nothing is generated while held
        ctl.set_version(1)
        ctl.resume()
        batch = ctl.wait(2, timeout=60)
    assert engine.aborts == 0 and engine.holding
    _assert_each_response_spans_versions_0_and_1(batch, tokens=60)


def test_every_accepted_sample_has_a_unique_uid():
    with _controller(ScriptedEngine(), batch_size=4, eta=1) as ctl:
        batch = ctl.prepare_batch(PromptLoader(_items(8)), GroupWorkflow(n=3), timeout=60)
    assert len(_episodes(batch, group_size=3)) == 4
    assert len({t.uid for t in batch}) == len(batch) == 12
    assert all(t.uid for t in batch)


def test_wait_times_out_with_a_clear_message():
    with _controller(ScriptedEngine(), batch_size=2, eta=0) as ctl:
        with pytest.raises(TimeoutError, match="0 of 2 episodes ready"):
            ctl.wait(2, timeout=0.05)


def test_wait_beyond_the_staleness_window_fails_fast():
    with _controller(ScriptedEngine(), batch_size=2, eta=0) as ctl:
        with pytest.raises(ValueError, match="admits only 2"):
            ctl.wait(3, timeout=60)


def test_bad_workflow_output_counts_as_failure():
    async def not_an_episode(engine, data):
        return ["not a trajectory"]

    with _controller(ScriptedEngine(), batch_size=1, eta=0) as ctl:
        ctl.submit({"id": "x"}, not_an_episode)
        ctl.submit({"id": "p1", "n": 1}, GroupWorkflow())
        ctl.wait(1, timeout=60)
        assert ctl.stats.failed == 1


@pytest.mark.slow
def test_rlvr_batches_from_real_hf_servers(tmp_path):
    """Integration: HFEngine servers + RLVRWorkflow + RewardRunner through prepare_batch and weight-version bumps."""
    from transformers import AutoTokenizer

    from areal_core.config import Config, DatasetConfig, GenerationConfig, ModelConfig, RolloutConfig, TinyModelSpec
    from areal_core.builtin.datasets.synthetic import load_arith
    from areal_core.builtin.engine_hf.client import HFEngine
    from areal_core.builtin.platform_cpu.platform import CpuPlatform
    from areal_core.builtin.rewards.synthetic import exact_match
    from areal_core.rollout.reward_runner import RewardRunner
    from areal_core.rollout.rlvr import RLVRWorkflow
    from areal_core.scheduler.local import LocalScheduler
    from areal_core.tiny_model import ensure_tiny_model

    items = load_arith(DatasetConfig(name="arith", size=5), "train")
    corpus = [d["prompt"] + d["answer"] for d in items]
    model_dir = ensure_tiny_model(TinyModelSpec(), corpus, tmp_path / "models", seed=0)
    config = Config(
        fileroot=str(tmp_path / "runs"),
        model=ModelConfig(path=str(model_dir)),
        rollout=RolloutConfig(
            max_concurrent_rollouts=4, max_head_offpolicyness=1, server_startup_timeout=120, request_timeout=60
        ),
        gconfig=GenerationConfig(n_samples=2, max_new_tokens=6),
        train_dataset=DatasetConfig(batch_size=2),
    )
    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    loader = RecordingLoader(PromptLoader(items, seed=1))
    consumed: list[str] = []
    scheduler = LocalScheduler(CpuPlatform())
    try:
        engine = HFEngine(config, CpuPlatform())
        engine.launch_servers(scheduler)
        runner = RewardRunner(exact_match, workers=1, timeout=30)
        with runner, RolloutRunner.from_config(engine, config) as ctl:
            workflow = RLVRWorkflow(tokenizer, config.gconfig, runner)
            for _ in range(3):
                batch = ctl.prepare_batch(loader, workflow, timeout=120)
                assert len(batch) == 4 and len({t.uid for t in batch}) == 4
                for traj in batch:
                    prompt = next(d["prompt"] for d in items if d["id"] == traj.prompt_id)
                    n_prompt = traj.loss_mask.index(1)
                    assert tokenizer.decode(traj.input_ids[:n_prompt]) == prompt
                    assert 1 <= traj.n_output_tokens <= 6 and traj.reward in (0.0, 1.0)
                    assert all(ctl.version - v <= 1 for v in traj.versions[n_prompt:])
                consumed += _episodes(batch)
                _bump(ctl)
            consumed += _episodes(ctl.wait(len(ctl.in_flight()), timeout=120))
            stats = ctl.stats
    finally:
        scheduler.stop_all()
    assert sorted(consumed) == sorted(loader.taken) and len(consumed) >= 6
    assert stats.failed == 0 and stats.rejected == 0


def test_loader_visits_each_item_once_per_epoch_and_resumes():
    items = _items(10)
    loader = PromptLoader(items, seed=5)
    first = [next(loader)["id"] for _ in range(13)]
    state = loader.state_dict()
    rest = [next(loader)["id"] for _ in range(17)]
    restored = PromptLoader(items, seed=0)
    restored.load_state_dict(state)
    assert [next(restored)["id"] for _ in range(17)] == rest
    ids = first + rest
    assert all(sorted(ids[i : i + 10]) == sorted(d["id"] for d in items) for i in (0, 10, 20))
    assert ids[:10] != ids[10:20]  # a new order each epoch
    assert [next(PromptLoader(items, shuffle=False))["id"] for _ in range(1)] == ["p0"]
    assert state == {"epoch": 1, "index": 3, "seed": 5}


def test_report_observed_lag():
    print(f"controller: largest observed token lag per bound: {dict(sorted(OBSERVED_MAX_LAG.items()))}")
    assert all(lag <= eta for eta, lag in OBSERVED_MAX_LAG.items())
