"""CISPO: clip the importance-sampling *weight*, not the update, so every token keeps a gradient.

PPO-style clipping zeroes the gradient of a token whose ratio left the trust region; rare,
high-ratio tokens (often the "forking" tokens of a reasoning chain) then stop learning. CISPO
(MiniMax-M1, 2025) instead treats the truncated ratio as a constant weight of a REINFORCE term::

    loss_t = -sg(w * min(r, 1 + eps_high)) * A * log pi(t)        r = exp(new - prox)

with GRPO's group-relative advantages and token-level normalisation. There is no lower bound on
the ratio. ``w`` is areal-core's behaviour importance weight (decoupled PPO) after ``actor.offpolicy``'s corrections.
"""

from __future__ import annotations

import torch

from areal_core.api.algorithm import LossInput
from areal_core.builtin.algorithms.grpo import GRPO
from areal_core.builtin.algorithms.ppo_loss import PolicyTerms, corrected_weights, finish_loss, mask_inputs, policy_ratio


class CISPO(GRPO):
    """GRPO advantages; REINFORCE gradient weighted by the truncated (stop-gradient) ratio.

    The truncation is ``1 + actor.eps_clip_higher`` (or ``1 + actor.eps_clip`` when unset).
    """

    name = "cispo"

    def clip_range(self) -> tuple[float, float]:
        _, eps_high = super().clip_range()
        return 1.0, eps_high  # lower bound 1 - 1.0 = 0: ratios are never clipped from below

    def loss(self, logprobs: torch.Tensor, batch: LossInput) -> tuple[torch.Tensor, dict[str, float]]:
        options = self.loss_options
        inputs = mask_inputs(logprobs, batch)
        weights = corrected_weights(inputs, batch.n_seqs, options)
        ratio = policy_ratio(inputs, batch.n_seqs, "token")
        truncated = ratio.clamp(max=1 + options.eps_high)
        per_token = -(weights.applied * truncated).detach() * inputs.advantages * inputs.logprobs
        terms = PolicyTerms(loss=per_token, ratio=ratio, clipped=ratio > 1 + options.eps_high)
        return finish_loss(terms, weights, inputs, batch, options)
