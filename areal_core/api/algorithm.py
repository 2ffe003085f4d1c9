"""Algorithm: advantage estimator + policy loss, selected by ``actor.algorithm``.

Data contract. Advantages are computed per sequence from outcome rewards; the FSDP policy
broadcasts them over each sequence's loss tokens. The loss sees one packed micro-batch in a flat
token layout: every tensor in :class:`LossInput` has shape ``[n_tokens]``.
"""

from __future__ import annotations

import abc
from typing import TYPE_CHECKING, ClassVar

import attrs

if TYPE_CHECKING:
    import torch

    from areal_core.config import ActorConfig


@attrs.define(kw_only=True)
class LossInput:
    """One packed micro-batch, flat over tokens (``[n_tokens]`` each)."""

    old_logprobs: torch.Tensor  # behaviour policy (from the rollout)
    prox_logprobs: torch.Tensor | None  # proximal policy (recomputed); None -> use old_logprobs
    advantages: torch.Tensor  # per-token (the sequence's advantage on each loss token)
    loss_mask: torch.Tensor  # bool; False on prompt and padding tokens
    seq_ids: torch.Tensor  # long, index of each token's sequence within this micro-batch
    n_seqs: int  # sequences in this micro-batch
    token_normalizer: float  # loss tokens in the whole minibatch (all micro-batches, all ranks)
    seq_normalizer: float  # sequences in the whole minibatch (all micro-batches, all ranks)
    max_new_tokens: int  # generation budget (Dr.GRPO's constant normaliser)
    ref_logprobs: torch.Tensor | None = None
    entropy: torch.Tensor | None = None  # for stats


class Algorithm(abc.ABC):
    """Base class for RL algorithms. Subclasses are registered via ``areal_register_algorithms``.

    ``loss`` returns this micro-batch's *share* of the minibatch loss (already divided by the
    minibatch-wide normaliser), so gradients of micro-batches simply add up.
    """

    name: ClassVar[str] = ""
    needs_proximal_logprobs: ClassVar[bool] = True
    min_group_size: ClassVar[int] = 1  # n_samples below this is a config error

    def __init__(self, config: ActorConfig) -> None:
        self.config = config

    @property
    def needs_ref(self) -> bool:
        return self.config.kl_coef > 0

    def filter_groups(self, rewards: torch.Tensor, group_ids: torch.Tensor) -> torch.Tensor:
        """Bool mask over samples to keep (DAPO drops all-equal-reward groups); default keeps all."""
        import torch

        return torch.ones_like(rewards, dtype=torch.bool)

    @abc.abstractmethod
    def compute_advantages(self, rewards: torch.Tensor, group_ids: torch.Tensor) -> torch.Tensor:
        """Per-sequence advantages ``[B]`` from rewards ``[B]`` and group ids ``[B]``."""

    @abc.abstractmethod
    def loss(self, logprobs: torch.Tensor, batch: LossInput) -> tuple[torch.Tensor, dict[str, float]]:
        """Scalar loss share and stats (means over this micro-batch's loss tokens)."""
