"""The shared shape of the built-in algorithms: reward normalisation + decoupled clipped loss.

A variant only says how it differs: its :class:`AdvantageSpec`, its clip range, and (as class
attributes) the ratio level and the loss reduction.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, ClassVar

import torch

from areal_core.api.algorithm import Algorithm, LossInput
from areal_core.builtin.algorithms.advantages import AdvantageSpec, normalize_rewards
from areal_core.builtin.algorithms.ppo_loss import PPOLossOptions, RatioLevel, Reduction, decoupled_ppo_loss
from areal_core.api.errors import ConfigError

if TYPE_CHECKING:
    from areal_core.api import ActorConfig


class ClippedPolicyGradient(Algorithm):
    """Outcome-reward advantages and the decoupled PPO objective; subclasses pick the variant."""

    ratio_level: ClassVar[RatioLevel] = "token"
    reduction: ClassVar[Reduction] = "token_mean"

    def __init__(self, config: ActorConfig) -> None:
        super().__init__(config)
        self.advantage_spec = self.make_advantage_spec()
        if self.advantage_spec.leave_one_out and self.advantage_spec.scope == "none":
            raise ConfigError(
                "actor.leave_one_out",
                f"{self.name} has no baseline with actor.adv_norm=none; set adv_norm to group or batch",
            )
        self.loss_options = self.make_loss_options()

    def make_advantage_spec(self) -> AdvantageSpec:
        """Default: everything from ``actor.adv_norm``, ``actor.std_norm``, ``actor.leave_one_out``."""
        return AdvantageSpec(
            scope=self.config.adv_norm, std_norm=self.config.std_norm, leave_one_out=self.config.leave_one_out
        )

    def clip_range(self) -> tuple[float, float]:
        """``(eps_low, eps_high)``: ``actor.eps_clip`` and ``actor.eps_clip_higher`` (or eps_clip)."""
        high = self.config.eps_clip_higher
        return self.config.eps_clip, self.config.eps_clip if high is None else high

    def make_loss_options(self) -> PPOLossOptions:
        eps_low, eps_high = self.clip_range()
        return PPOLossOptions(
            eps_low=eps_low,
            eps_high=eps_high,
            offpolicy=self.config.offpolicy,
            kl_coef=self.config.kl_coef,
            ratio_level=self.ratio_level,
            reduction=self.reduction,
        )

    def compute_advantages(self, rewards: torch.Tensor, group_ids: torch.Tensor) -> torch.Tensor:
        return normalize_rewards(rewards, group_ids, self.advantage_spec)

    def loss(self, logprobs: torch.Tensor, batch: LossInput) -> tuple[torch.Tensor, dict[str, float]]:
        return decoupled_ppo_loss(logprobs, batch, self.loss_options)
