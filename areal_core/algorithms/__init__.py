"""Built-in RL algorithms (registered by :mod:`areal_core.builtin.algorithms`).

Every one is a :class:`ClippedPolicyGradient`: outcome-reward advantages from
:mod:`.advantages` and the decoupled PPO objective from :mod:`.ppo_loss`. Third-party algorithms
may subclass any of them or compose those two modules.
"""

from areal_core.builtin.algorithms.base import ClippedPolicyGradient
from areal_core.builtin.algorithms.grpo import DAPO, GRPO, DrGRPO
from areal_core.builtin.algorithms.gspo import GSPO
from areal_core.builtin.algorithms.ppo import PPO, ReinforcePlusPlus
from areal_core.builtin.algorithms.rloo import RLOO

__all__ = ["DAPO", "GRPO", "GSPO", "PPO", "RLOO", "ClippedPolicyGradient", "DrGRPO", "ReinforcePlusPlus"]
