"""RLOO: REINFORCE with a leave-one-out group baseline, under the decoupled PPO loss."""

from __future__ import annotations

from areal_core.builtin.algorithms.advantages import AdvantageSpec
from areal_core.builtin.algorithms.grpo import GRPO


class RLOO(GRPO):
    """Advantage ``r_i - mean of the other samples of the group``; no std scaling."""

    name = "rloo"

    def make_advantage_spec(self) -> AdvantageSpec:
        return AdvantageSpec(scope="group", std_norm=False, leave_one_out=True)
