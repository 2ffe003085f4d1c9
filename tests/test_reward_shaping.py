"""DAPO's soft overlong punishment (``reward.overlong_buffer`` / ``reward.overlong_penalty``)."""

from __future__ import annotations

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from areal_core.api.errors import ConfigError
from areal_core.api.trajectory import Trajectory
from areal_core.config import load_config
from areal_core.reward_shaping import overlong_penalty, shaped_rewards


@settings(deadline=None)  # torch's first calls in a process can take longer than the default 200 ms
@given(
    max_new=st.integers(1, 512),
    data=st.data(),
    penalty=st.floats(0, 10, allow_nan=False),
)
def test_free_below_the_buffer_then_falling_to_the_penalty_at_the_budget(max_new, data, penalty):
    buffer = data.draw(st.integers(1, max_new))
    lengths = torch.tensor(sorted(data.draw(st.lists(st.integers(0, 2 * max_new), min_size=1, max_size=20))))
    got = overlong_penalty(lengths, max_new, buffer, penalty)
    assert ((got <= 0) & (got >= -penalty - 1e-6)).all()
    assert (got[lengths <= max_new - buffer] == 0).all()
    assert torch.allclose(got[lengths >= max_new], torch.tensor(-penalty))
    assert (got.diff() <= 1e-6).all()  # longer never costs less
    inside = (lengths > max_new - buffer) & (lengths < max_new)
    if penalty > 1e-6:  # a smaller one underflows float32 at a fraction of it
        assert (got[inside] < 0).all() and (got[inside] > -penalty).all()


def test_off_by_default_and_exact_on_a_hand_case():
    assert (overlong_penalty(torch.tensor([0, 128, 500]), 128, 0, 1.0) == 0).all()
    got = overlong_penalty(torch.tensor([64, 96, 112, 128]), 128, 32, 0.5)
    assert got.tolist() == [0.0, 0.0, -0.25, -0.5]


def _trajectory(reward: float, prompt: int, answer: int) -> Trajectory:
    n = prompt + answer
    mask = [0] * prompt + [1] * answer
    return Trajectory(uid=f"u{answer}", prompt_id="p", input_ids=[5] * n, loss_mask=mask, logprobs=[0.0] * n,
                      versions=[-1] * prompt + [0] * answer, reward=reward)  # fmt: skip


def test_the_trainer_shapes_by_output_tokens_and_reports_it():
    batch = [_trajectory(1.0, 30, 40), _trajectory(1.0, 30, 100), _trajectory(0.0, 30, 128)]
    off, stats = shaped_rewards(batch, load_config(None, ["gconfig.max_new_tokens=128"]))
    assert off.tolist() == [1.0, 1.0, 0.0] and stats == {}
    config = load_config(None, ["gconfig.max_new_tokens=128", "reward.overlong_buffer=64", "reward.overlong_penalty=2"])
    on, stats = shaped_rewards(batch, config)
    assert on.tolist() == pytest.approx([1.0, 1.0 - 2 * 36 / 64, -2.0])
    assert stats["reward/overlong_frac"] == pytest.approx(2 / 3)
    assert stats["reward/overlong_penalty"] == pytest.approx(-(2 * 36 / 64 + 2) / 3)


def test_a_buffer_beyond_the_budget_is_refused():
    with pytest.raises(ConfigError, match=r"reward.overlong_buffer: 200 is more than gconfig.max_new_tokens=128"):
        load_config(None, ["gconfig.max_new_tokens=128", "reward.overlong_buffer=200"])
