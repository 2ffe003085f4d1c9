"""bench/ideal_pipe.py: the simulated best case under the staleness rules, checked where it is known
in closed form (synchronous training, a train-bound pipe) and against the rules it replays."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "bench"))
from ideal_pipe import ideal_async_seconds  # noqa: E402


@given(
    steps=st.integers(1, 20),
    batch=st.integers(1, 8),
    latency=st.floats(0.01, 1.0),
    train=st.floats(0.01, 1.0),
    spare=st.integers(0, 16),
)
@settings(max_examples=50, deadline=None)
def test_synchronous_rules_wait_for_each_batch_then_train(steps, batch, latency, train, spare):
    """eta = 0: every step waits for its own batch, which starts only after the last step trained."""
    seconds = ideal_async_seconds(
        steps=steps, train_s=train, episode_s=lambda rng, version: latency, batch_size=batch, staleness=0,
        max_concurrent=batch + spare,
    )  # fmt: skip
    assert seconds == pytest.approx(steps * (latency + train))


def test_a_fast_pipe_leaves_only_the_first_batch_and_the_train_steps():
    seconds = ideal_async_seconds(
        steps=40, train_s=0.07, episode_s=lambda rng, version: 0.01, batch_size=8, staleness=2, max_concurrent=24
    )
    assert seconds == pytest.approx(0.01 + 40 * 0.07)


def test_a_long_tail_costs_less_the_more_staleness_the_rules_allow():
    def episode(rng, version):  # the slowest of 8 lognormal requests, as a group's episode
        return max(rng.lognormvariate(-3, 1) for _ in range(8))

    seconds = [
        ideal_async_seconds(steps=40, train_s=0.07, episode_s=episode, batch_size=8, staleness=eta, max_concurrent=24)
        for eta in (0, 2, 8)
    ]
    assert seconds[0] > seconds[1] > seconds[2] > 40 * 0.07


def test_an_episode_lasts_what_its_start_version_draws():
    """Only the episodes started on version 0 are slow: the first step waits for them, later steps do not."""
    seconds = ideal_async_seconds(
        steps=3, train_s=0.1, episode_s=lambda rng, version: 1.0 if version == 0 else 0.01, batch_size=2,
        staleness=0, max_concurrent=2,
    )  # fmt: skip
    assert seconds == pytest.approx(1.0 + 0.1 + 2 * (0.01 + 0.1))
