"""GRPO and the variants that change one of its pieces: Dr.GRPO and DAPO."""

from __future__ import annotations

import attrs
import torch

from areal_core.builtin.algorithms.advantages import AdvantageSpec, uniform_reward_samples
from areal_core.builtin.algorithms.base import ClippedPolicyGradient


class GRPO(ClippedPolicyGradient):
    """Group-relative advantages ``(r - mean_group) / (std_group + eps)``, decoupled PPO loss."""

    name = "grpo"
    min_group_size = 2


class DrGRPO(GRPO):
    """Dr.GRPO: no std scaling and a constant normaliser (sequences x ``max_new_tokens``)."""

    name = "dr_grpo"
    reduction = "token_sum_budget"

    def make_advantage_spec(self) -> AdvantageSpec:
        return attrs.evolve(super().make_advantage_spec(), std_norm=False)


class DAPO(GRPO):
    """DAPO: clip-higher (0.28 unless ``actor.eps_clip_higher`` is set), drop groups with one reward."""

    name = "dapo"
    default_eps_clip_higher = 0.28

    def clip_range(self) -> tuple[float, float]:
        high = self.config.eps_clip_higher
        return self.config.eps_clip, self.default_eps_clip_higher if high is None else high

    def filter_groups(self, rewards: torch.Tensor, group_ids: torch.Tensor) -> torch.Tensor:
        return ~uniform_reward_samples(rewards, group_ids)
