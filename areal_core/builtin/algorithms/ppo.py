"""Critic-free PPO and REINFORCE++: batch-baseline advantages, decoupled clipped loss."""

from __future__ import annotations

from areal_core.builtin.algorithms.advantages import AdvantageSpec
from areal_core.builtin.algorithms.base import ClippedPolicyGradient


class PPO(ClippedPolicyGradient):
    """AReaL-style decoupled PPO; rewards are normalised over the whole batch (no groups).

    ``actor.std_norm`` and ``actor.leave_one_out`` apply; ``actor.adv_norm`` does not.
    """

    name = "ppo"
    min_group_size = 1

    def make_advantage_spec(self) -> AdvantageSpec:
        return AdvantageSpec(scope="batch", std_norm=self.config.std_norm, leave_one_out=self.config.leave_one_out)


class ReinforcePlusPlus(PPO):
    """REINFORCE++ (batch baseline): always ``(r - batch mean) / batch std``, whatever the knobs say."""

    name = "reinforce_pp"

    def make_advantage_spec(self) -> AdvantageSpec:
        return AdvantageSpec(scope="batch", std_norm=True, leave_one_out=False)
