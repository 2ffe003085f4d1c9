"""bench/replay_engine.py's pauses, which the async benchmark's figures rest on: an abort pause ends
a running request with the tokens it has and the rest is sent again, its token in progress carried
on; a keep pause freezes it and it goes on after ``resume``, uninterrupted. Either way its later
tokens carry the new version."""

from __future__ import annotations

import random
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from areal_core.api.engine import GenerationRequest, SamplingParams
from areal_core.builtin.platform_cpu.platform import CpuPlatform
from areal_core.config import Config
from areal_core.testing import LoopThread

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "bench"))
from replay_engine import ReplayLatencyEngine, _Running, recorded  # noqa: E402

LATENCY, TOKENS = 1.0, 10  # long enough that the pause lands mid-request on a loaded machine


SAMPLING = SamplingParams(max_new_tokens=TOKENS)


@pytest.fixture
def served() -> Iterator[tuple[ReplayLatencyEngine, LoopThread]]:
    """An engine whose every request takes LATENCY for TOKENS, and the loop it runs on, after a
    first request (the first call's imports and set-up)."""
    engine = ReplayLatencyEngine(Config(), CpuPlatform(), sampler=lambda rng, version: (LATENCY, TOKENS))
    engine.launch_servers(None)
    loop = LoopThread()
    try:
        loop.submit(engine.agenerate(GenerationRequest(input_ids=[1], sampling=SAMPLING))).result(timeout=10)
        yield engine, loop
    finally:
        loop.close()


@pytest.mark.parametrize("keep", [False, True], ids=["abort", "keep"])
def test_a_pause_mid_request_splits_its_versions(served, keep: bool) -> None:
    engine, loop = served
    start = time.monotonic()
    future = loop.submit(engine.agenerate(GenerationRequest(input_ids=[1, 2], sampling=SAMPLING)))
    time.sleep(LATENCY / 2)  # about half the tokens are out
    if keep:
        engine.pause_keeping()
    else:
        engine.pause()
    time.sleep(0.2)
    engine.set_version(1)
    engine.resume()
    response = future.result(timeout=10)
    wall = time.monotonic() - start
    k = response.versions.index(1)
    assert 0 < k < TOKENS and response.versions == [0] * k + [1] * (TOKENS - k)
    assert response.stop_reason == "length" and len(response.output_ids) == TOKENS
    assert engine.completed == 2 and wall >= LATENCY + 0.2  # no token comes out while paused
    assert len(engine.added) == (2 if keep else 1)  # `added`: requests no pause interrupted
    if keep:  # ... less the time the pause held them: the 0.2 s waited out is the update's, not added
        assert 0 <= engine.added[-1] < 0.2
    assert engine.aborted_segments == (0 if keep else 1)


def test_an_aborted_segment_hands_its_token_in_progress_on() -> None:
    """Aborted 0.55 s into 10 tokens over 1 s: 5 tokens out and 0.05 s of the sixth decoded, which
    the segment sent after the resume finishes first: its 5 tokens take 0.45 s, the first 0.05 s."""
    first = _Running(future=None, start=0.0, seconds=1.0, tokens=10)
    assert first.produced(0.55) == 5 and first.in_progress(0.55) == pytest.approx(0.05)
    second = _Running(future=None, start=2.0, seconds=0.45, tokens=5, carried=first.in_progress(0.55))
    assert [second.produced(2.0 + t) for t in (0.049, 0.051, 0.149, 0.151, 0.45)] == [0, 1, 1, 2, 5]
    assert second.in_progress(2.0 + 0.45) == 0.0


def test_pauses_closer_than_a_token_still_let_it_finish(served) -> None:
    """A token that takes longer than the time between two abort pauses still comes out: each abort
    hands the decoding done so far on (the hf server's pause lands between decode steps), so no
    pause cadence starves a request."""
    engine, loop = served
    engine.sampler = lambda rng, version: (1.0, 1)
    future = loop.submit(engine.agenerate(GenerationRequest(input_ids=[1, 2], sampling=SAMPLING)))
    pauses = 0
    while not future.done() and pauses < 200:
        time.sleep(0.05)  # twenty of these decode the token
        engine.pause()
        time.sleep(0.01)
        engine.resume()
        pauses += 1
    assert future.done() and len(future.result().output_ids) == 1
    assert engine.aborted_segments >= 2  # interrupted mid-token more than once


def test_two_keep_pauses_split_a_request_in_three_versions(served) -> None:
    engine, loop = served
    start = time.monotonic()
    future = loop.submit(engine.agenerate(GenerationRequest(input_ids=[1, 2], sampling=SAMPLING)))
    for version in (1, 2):  # a third of the latency, then a 0.2 s hold that bumps the version
        time.sleep(LATENCY / 3)
        engine.pause_keeping()
        time.sleep(0.2)
        engine.set_version(version)
        engine.resume()
    response = future.result(timeout=10)
    wall = time.monotonic() - start
    first, second = response.versions.index(1), response.versions.index(2)
    assert 0 < first < second < TOKENS
    assert response.versions == [0] * first + [1] * (second - first) + [2] * (TOKENS - second)
    assert wall >= LATENCY + 0.4 and 0 <= engine.added[-1] < 0.2  # both holds waited out, neither added


def test_a_request_draws_from_the_recording_of_the_version_it_starts_on(served) -> None:
    """A recording is drawn from per weight version (the latest recorded at or below the request's,
    else the first): a policy's lengths drift as it trains."""
    draw = recorded({1: [(0.2, 2)], 3: [(1.0, 5)], 6: [(0.3, 3)]})
    drawn = [draw(random.Random(0), version) for version in (0, 1, 2, 3, 5, 6, 9)]
    assert drawn == [(0.2, 2)] * 3 + [(1.0, 5)] * 2 + [(0.3, 3)] * 2
    engine, loop = served
    engine.sampler = draw
    engine.set_version(3)  # drawn once, at the version it starts on, though sent again after a bump
    future = loop.submit(engine.agenerate(GenerationRequest(input_ids=[1, 2], sampling=SAMPLING)))
    time.sleep(0.3)
    engine.pause()
    engine.set_version(6)
    engine.resume()
    response = future.result(timeout=10)
    assert len(response.output_ids) == 5 and response.versions[0] == 3 and response.versions[-1] == 6
