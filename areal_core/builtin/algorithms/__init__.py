"""Built-in RL algorithms, registered here and imported on first use.

Every one is a :class:`~areal_core.builtin.algorithms.base.ClippedPolicyGradient`: outcome-reward
advantages from :mod:`.advantages` and the decoupled PPO objective from :mod:`.ppo_loss`.
"""

from areal_core.api import hookimpl

ALGORITHMS = {
    "grpo": "grpo:GRPO",
    "ppo": "ppo:PPO",
    "dr_grpo": "grpo:DrGRPO",
    "dapo": "grpo:DAPO",
    "rloo": "rloo:RLOO",
    "gspo": "gspo:GSPO",
    "reinforce_pp": "ppo:ReinforcePlusPlus",
}


@hookimpl
def areal_register_algorithms(register):
    for name, target in ALGORITHMS.items():
        register(name, f"{__name__}.{target}")
