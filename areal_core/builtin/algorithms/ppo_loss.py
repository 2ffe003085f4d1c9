"""The decoupled clipped PPO objective shared by every built-in algorithm.

Three policies: behaviour (``old_logprobs``, what generated the tokens), proximal
(``prox_logprobs``, the trust-region anchor) and current (``logprobs``). Per loss token::

    w = exp(prox - old)            as changed by actor.offpolicy's corrections (api/offpolicy.py)
    r = exp(new - prox)            or GSPO's per-sequence exp(mean over the sequence of new - prox)
    loss_t = -w * min(r * A, clip(r, 1 - eps_low, 1 + eps_high) * A) + kl_coef * k3(new, ref)

then reduced to this micro-batch's share of the minibatch loss (see :data:`Reduction`). Values at
positions outside ``loss_mask`` are replaced by constants first, so they never reach the loss or
its gradient (not even as NaN).
"""

from __future__ import annotations

from typing import Literal

import attrs
import torch

from areal_core.api.algorithm import LossInput
from areal_core.api import OffPolicyConfig
from areal_core.api.offpolicy import BehaviourWeights, behaviour_weights

#: ``token_mean``: sum over loss tokens / ``token_normalizer``;
#: ``token_sum_budget``: sum / (``seq_normalizer`` * ``max_new_tokens``) (Dr.GRPO);
#: ``seq_mean``: sum over sequences of their token mean / ``seq_normalizer`` (GSPO).
Reduction = Literal["token_mean", "token_sum_budget", "seq_mean"]
RatioLevel = Literal["token", "sequence"]


@attrs.frozen(kw_only=True)
class PPOLossOptions:
    """Knobs of :func:`decoupled_ppo_loss`; algorithms build one from their config."""

    eps_low: float = 0.2
    eps_high: float = 0.2
    offpolicy: OffPolicyConfig = attrs.Factory(OffPolicyConfig)
    kl_coef: float = 0.0
    ratio_level: RatioLevel = "token"
    reduction: Reduction = "token_mean"


@attrs.frozen
class MaskedInputs:
    """The batch's tensors as float32 with every non-loss position set to a constant."""

    logprobs: torch.Tensor
    old: torch.Tensor
    prox: torch.Tensor
    advantages: torch.Tensor
    mask: torch.Tensor
    seq_ids: torch.Tensor
    ref: torch.Tensor | None


def mask_inputs(logprobs: torch.Tensor, batch: LossInput) -> MaskedInputs:
    """Float32 copies of the loss inputs with zeros (and sequence 0) outside the loss mask."""
    mask = batch.loss_mask.bool()

    def keep(t: torch.Tensor) -> torch.Tensor:
        return torch.where(mask, t.float(), torch.zeros((), dtype=torch.float32, device=t.device))

    prox = batch.prox_logprobs if batch.prox_logprobs is not None else batch.old_logprobs
    return MaskedInputs(
        logprobs=keep(logprobs),
        old=keep(batch.old_logprobs).detach(),
        prox=keep(prox).detach(),
        advantages=keep(batch.advantages).detach(),
        mask=mask,
        seq_ids=torch.where(mask, batch.seq_ids.long(), 0),
        ref=keep(batch.ref_logprobs).detach() if batch.ref_logprobs is not None else None,
    )


def corrected_weights(inputs: MaskedInputs, n_seqs: int, options: PPOLossOptions) -> BehaviourWeights:
    """The behaviour weights of ``inputs`` after ``options.offpolicy``'s corrections."""
    return behaviour_weights(inputs.old, inputs.prox, inputs.mask, inputs.seq_ids, n_seqs, options.offpolicy)


def k3_kl(logprobs: torch.Tensor, ref_logprobs: torch.Tensor) -> torch.Tensor:
    """Per-token k3 estimate of KL(current || ref) from samples: ``e^d - d - 1``, d = ref - new."""
    delta = ref_logprobs - logprobs
    return torch.exp(delta) - delta - 1


def sequence_means(values: torch.Tensor, inputs: MaskedInputs, n_seqs: int) -> torch.Tensor:
    """Mean of ``values`` over each sequence's loss tokens, ``[n_seqs]`` (0 for a sequence without any)."""
    zeros = torch.zeros(n_seqs, dtype=values.dtype, device=values.device)
    sums = zeros.index_add(0, inputs.seq_ids, torch.where(inputs.mask, values, 0.0))
    counts = zeros.index_add(0, inputs.seq_ids, inputs.mask.to(values.dtype))
    return sums / counts.clamp(min=1)


def reduce_token_losses(per_token: torch.Tensor, inputs: MaskedInputs, batch: LossInput, reduction: Reduction) -> torch.Tensor:
    """This micro-batch's share of the minibatch loss from per-token losses."""
    if reduction == "seq_mean":
        return sequence_means(per_token, inputs, batch.n_seqs).sum() / batch.seq_normalizer
    total = torch.where(inputs.mask, per_token, 0.0).sum()
    if reduction == "token_sum_budget":
        return total / (batch.seq_normalizer * batch.max_new_tokens)
    return total / batch.token_normalizer


def policy_ratio(inputs: MaskedInputs, n_seqs: int, level: RatioLevel) -> torch.Tensor:
    """Current/proximal ratio per token; at ``sequence`` level every token gets its sequence's."""
    log_ratio = inputs.logprobs - inputs.prox
    if level == "sequence":
        log_ratio = sequence_means(log_ratio, inputs, n_seqs)[inputs.seq_ids]
    return torch.exp(log_ratio)


def token_stats(inputs: MaskedInputs, named: dict[str, torch.Tensor]) -> dict[str, float]:
    """Means over loss tokens of each tensor in ``named`` (bool tensors become fractions)."""
    n = inputs.mask.sum().clamp(min=1)
    return {
        key: float(torch.where(inputs.mask, value.detach().float(), 0.0).sum() / n)
        for key, value in named.items()
    }


@attrs.frozen
class PolicyTerms:
    """An objective's per-token pieces: its loss, the ratio it used, and where it clipped."""

    loss: torch.Tensor
    ratio: torch.Tensor
    clipped: torch.Tensor  # bool


def finish_loss(
    terms: PolicyTerms, weights: BehaviourWeights, inputs: MaskedInputs, batch: LossInput, options: PPOLossOptions
) -> tuple[torch.Tensor, dict[str, float]]:
    """Add ``kl_coef * k3(new, ref)``, reduce to the loss share, and compute the standard stats."""
    per_token = terms.loss
    named = {
        "clip_frac": terms.clipped,
        "imp_weight_mean": weights.raw,
        "masked_frac": weights.masked,
        "truncated_frac": weights.truncated,
        "ratio_mean": terms.ratio,
        "approx_kl": k3_kl(inputs.logprobs, inputs.prox),
    }
    if inputs.ref is not None:
        kl_ref = k3_kl(inputs.logprobs, inputs.ref)
        named["kl_ref"] = kl_ref
        if options.kl_coef > 0:
            per_token = per_token + options.kl_coef * kl_ref
    if batch.entropy is not None:
        named["entropy"] = batch.entropy
    stats = token_stats(inputs, {"loss": per_token, **named})
    stats["imp_weight_max"] = float(torch.where(inputs.mask, weights.raw, 0.0).max()) if inputs.mask.any() else 0.0
    return reduce_token_losses(per_token, inputs, batch, options.reduction), stats


def decoupled_ppo_loss(
    logprobs: torch.Tensor, batch: LossInput, options: PPOLossOptions
) -> tuple[torch.Tensor, dict[str, float]]:
    """Loss share and stats (means over this micro-batch's loss tokens) of the decoupled objective."""
    inputs = mask_inputs(logprobs, batch)
    weights = corrected_weights(inputs, batch.n_seqs, options)
    ratio = policy_ratio(inputs, batch.n_seqs, options.ratio_level)
    surrogate = ratio * inputs.advantages
    clipped_surrogate = ratio.clamp(1 - options.eps_low, 1 + options.eps_high) * inputs.advantages
    per_token = -weights.applied * torch.minimum(surrogate, clipped_surrogate)
    # decided from the ratio and the advantage's sign, not by comparing the two products, which
    # underflow to equal values for subnormal advantages
    adv = inputs.advantages
    clipped = ((adv > 0) & (ratio > 1 + options.eps_high)) | ((adv < 0) & (ratio < 1 - options.eps_low))
    terms = PolicyTerms(per_token, ratio, clipped)
    return finish_loss(terms, weights, inputs, batch, options)
