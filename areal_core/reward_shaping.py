"""Reward shaping the trainer applies before advantages, whatever the algorithm: DAPO's soft
overlong punishment (Yu et al. 2025, "DAPO", eq. 13), ``reward.overlong_buffer`` and
``reward.overlong_penalty``.

An answer (a trajectory's output tokens, every turn of a multi-turn one together) is free up to
``max_new_tokens - buffer`` of them; past that its reward drops
linearly, by ``penalty`` at ``max_new_tokens`` (a truncated answer) and no further. A group whose
answers drift towards the budget then gets a signal towards ending, even when none is right.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from areal_core.api.trajectory import Trajectory
from areal_core.config import Config


def overlong_penalty(lengths: torch.Tensor, max_new_tokens: int, buffer: int, penalty: float) -> torch.Tensor:
    """Per answer, ``-penalty * min(1, max(0, length - (max_new_tokens - buffer)) / buffer)``
    (all 0 when ``buffer`` is 0)."""
    if buffer <= 0:
        return torch.zeros(lengths.shape, dtype=torch.float32)
    over = (lengths.float() - (max_new_tokens - buffer)).clamp(min=0) / buffer
    return -penalty * over.clamp(max=1)


def shaped_rewards(batch: Sequence[Trajectory], config: Config) -> tuple[torch.Tensor, dict[str, float]]:
    """The rewards the algorithm's advantages start from, ``[B]``, and the shaping's stats."""
    rewards = torch.tensor([t.reward for t in batch], dtype=torch.float32)
    buffer = config.reward.overlong_buffer
    if not buffer:
        return rewards, {}
    lengths = torch.tensor([t.n_output_tokens for t in batch])
    penalty = overlong_penalty(lengths, config.gconfig.max_new_tokens, buffer, config.reward.overlong_penalty)
    stats = {
        "reward/overlong_penalty": float(penalty.mean()),
        "reward/overlong_frac": float((penalty < 0).float().mean()),
    }
    return rewards + penalty, stats
