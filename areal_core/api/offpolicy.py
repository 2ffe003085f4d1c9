"""Off-policy corrections: what the decoupled loss weights each token's policy term with.

Part of the plugin API, so that a plugin's algorithm applies ``actor.offpolicy`` as the built-ins do.

Per loss token, ``d = prox - old`` compares the trainer's recomputed log-prob with the one the
inference engine sampled the token with (older weights, other numerics), and ``rho = exp(d)`` is
the importance weight between them. Without corrections the weight is ``rho``. Each correction
named in ``actor.offpolicy.corrections`` changes it (docs/algorithms.md has the formulas):

- ``tis``: ``min(rho_level, cap)``;
- ``mis``: ``rho_level``, or 0 outside ``[lower, upper]``;
- ``icepop``: token ``rho``, or 0 outside ``[lower, upper]``;
- ``m2po``: 0 on the tokens with the largest ``d**2``, as few as leave the rest's mean ``d**2``
  at most ``threshold`` (this micro-batch's loss tokens).

``rho_level`` is the token's own ``rho`` at level ``token``; at level ``sequence`` every token
of a sequence gets the sequence's: ``exp(sum d)`` (``product``) or ``exp(mean d)``
(``geometric``), over its loss tokens. A zero weight removes the token's policy term from the
loss; the loss normaliser still counts it, as in AReaL and verl.
"""

from __future__ import annotations

from typing import Literal

import attrs
import torch

from areal_core.config import OffPolicyConfig

#: ``|log rho|`` above this is clamped before ``exp`` (a sequence's sum can overflow float32).
LOG_RATIO_BOUND = 20.0


@attrs.frozen
class BehaviourWeights:
    """Each loss token's weight: ``raw`` = ``rho``; ``applied`` after the corrections."""

    raw: torch.Tensor
    applied: torch.Tensor
    masked: torch.Tensor  # bool: loss tokens a correction gave weight 0
    truncated: torch.Tensor  # bool: loss tokens whose weight TIS lowered to its cap


def behaviour_weights(
    old: torch.Tensor, prox: torch.Tensor, mask: torch.Tensor, seq_ids: torch.Tensor, n_seqs: int,
    offpolicy: OffPolicyConfig,
) -> BehaviourWeights:  # fmt: skip
    """The weights of one packed micro-batch (``[n_tokens]`` each; ``seq_ids`` index its sequences)."""
    log_rho = torch.where(mask, prox.float() - old.float(), 0.0)
    raw = torch.exp(log_rho.clamp(-LOG_RATIO_BOUND, LOG_RATIO_BOUND))
    weight, keep, truncated = raw, mask.clone(), torch.zeros_like(mask)
    for name in offpolicy.corrections:
        if name == "tis":
            tis = offpolicy.tis
            level_rho = _level_ratio(raw, log_rho, mask, seq_ids, n_seqs, tis.level, tis.sequence_ratio)
            truncated = (level_rho > tis.cap) & mask
            weight = level_rho.clamp(max=tis.cap)
        elif name == "mis":
            mis = offpolicy.mis
            weight = _level_ratio(raw, log_rho, mask, seq_ids, n_seqs, mis.level, mis.sequence_ratio)
            keep &= _in_band(weight, mis.lower, mis.upper)
        elif name == "icepop":
            keep &= _in_band(raw, offpolicy.icepop.lower, offpolicy.icepop.upper)
        elif name == "m2po":
            keep &= m2po_keep(log_rho, mask, offpolicy.m2po.threshold)
        else:  # the config's Literal admits no other name
            raise ValueError(f"unknown off-policy correction {name!r}")
    applied = torch.where(keep, weight, 0.0)
    return BehaviourWeights(raw=raw, applied=applied, masked=mask & ~keep, truncated=truncated & keep)


def _level_ratio(
    rho: torch.Tensor, log_rho: torch.Tensor, mask: torch.Tensor, seq_ids: torch.Tensor, n_seqs: int,
    level: Literal["token", "sequence"], sequence_ratio: Literal["product", "geometric"],
) -> torch.Tensor:  # fmt: skip
    """``rho`` per token, or each token's sequence ratio (product or geometric mean over loss tokens)."""
    if level == "token":
        return rho
    zeros = torch.zeros(n_seqs, dtype=log_rho.dtype, device=log_rho.device)
    sums = zeros.index_add(0, seq_ids, log_rho)
    if sequence_ratio == "geometric":
        sums = sums / zeros.index_add(0, seq_ids, mask.to(log_rho.dtype)).clamp(min=1)
    return torch.exp(sums.clamp(-LOG_RATIO_BOUND, LOG_RATIO_BOUND))[seq_ids]


def _in_band(ratio: torch.Tensor, lower: float | None, upper: float) -> torch.Tensor:
    inside = ratio <= upper
    return inside & (ratio >= lower) if lower is not None else inside


def m2po_keep(log_rho: torch.Tensor, mask: torch.Tensor, threshold: float) -> torch.Tensor:
    """Bool per token: False on the fewest largest-``d**2`` loss tokens whose removal leaves the
    others' mean ``d**2`` at most ``threshold`` (at least one loss token is always kept)."""
    second = (log_rho * log_rho)[mask]
    keep = mask.clone()
    if second.numel() == 0:
        return keep
    ordered, order = torch.sort(second, descending=True)
    remaining = torch.arange(len(ordered), 0, -1, dtype=ordered.dtype, device=ordered.device)
    rest_mean = ordered.flip(0).cumsum(0).flip(0) / remaining  # mean of ordered[i:]
    within = torch.nonzero(rest_mean <= threshold)
    n_dropped = int(within[0]) if len(within) else len(ordered) - 1
    kept = torch.ones_like(ordered, dtype=torch.bool)
    kept[order[:n_dropped]] = False
    keep[mask] = kept
    return keep
