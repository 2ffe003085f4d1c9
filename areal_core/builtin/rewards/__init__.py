"""Built-in rewards: math answers (math-verify) and exact scoring of the synthetic tasks."""

from areal_core.api import hookimpl


@hookimpl
def areal_register_rewards(register):
    register("math", "areal_core.builtin.rewards.math:math_reward")
    register("gsm8k", "areal_core.builtin.rewards.math:math_reward")
    register("arith", "areal_core.builtin.rewards.synthetic:arith_reward")
    register("reverse", "areal_core.builtin.rewards.synthetic:reverse_reward")
