"""areal-reward-example: registers two rewards by ``"module:attr"`` path, so discovery imports nothing else."""

from areal_core.api import hookimpl


@hookimpl
def areal_register_rewards(register):
    register("answer_format", "areal_reward_example.rewards:answer_format")
    register("arith_length_penalty", "areal_reward_example.rewards:arith_length_penalty")
