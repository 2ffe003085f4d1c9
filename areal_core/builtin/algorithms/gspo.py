"""GSPO: GRPO advantages with a sequence-level importance ratio and a per-sequence loss."""

from __future__ import annotations

import attrs

from areal_core.builtin.algorithms.grpo import GRPO
from areal_core.api import ActorConfig


class GSPO(GRPO):
    """Ratio ``exp(mean_t(new - prox))`` per sequence, clipped per sequence, averaged over sequences.

    A sequence-level ratio lives much closer to 1 than token ratios, so while ``actor.eps_clip``
    keeps its default and ``actor.eps_clip_higher`` is unset the clip range is GSPO's own
    ``(3e-4, 4e-4)``; set either key to choose it yourself.
    """

    name = "gspo"
    ratio_level = "sequence"
    reduction = "seq_mean"
    default_clip_range = (3e-4, 4e-4)

    def clip_range(self) -> tuple[float, float]:
        default_eps = attrs.fields(ActorConfig).eps_clip.default
        if self.config.eps_clip == default_eps and self.config.eps_clip_higher is None:
            return self.default_clip_range
        return super().clip_range()
