"""Built-in algorithms; each is a class in :mod:`areal_core.algorithms`, imported on first use."""

from areal_core import hookimpl

ALGORITHMS = {
    "grpo": "GRPO",
    "ppo": "PPO",
    "dr_grpo": "DrGRPO",
    "dapo": "DAPO",
    "rloo": "RLOO",
    "gspo": "GSPO",
    "reinforce_pp": "ReinforcePlusPlus",
}


@hookimpl
def areal_register_algorithms(register):
    for name, cls_name in ALGORITHMS.items():
        register(name, f"areal_core.algorithms:{cls_name}")
