"""Outcome-reward advantages: group or batch baselines, optional std scaling, leave-one-out.

All functions take per-sample tensors ``[B]`` (rewards, group ids) and return ``[B]``. Group ids
may be any integers; samples with equal ids form one group (the n samples of one prompt).
"""

from __future__ import annotations

from typing import Literal

import attrs
import torch

Scope = Literal["group", "batch", "none"]


@attrs.frozen(kw_only=True)
class AdvantageSpec:
    """How rewards become advantages.

    ``scope`` is where the baseline mean and the std come from ("none": raw rewards);
    ``leave_one_out`` replaces the mean with the mean of the *other* samples in the scope.
    The std is the population std of the rewards in the scope.
    """

    scope: Scope = "group"
    std_norm: bool = True
    leave_one_out: bool = False
    eps: float = 1e-6


def _scope_index(group_ids: torch.Tensor, scope: Scope) -> tuple[torch.Tensor, int]:
    """Dense index ``[B]`` in ``0..n-1`` naming each sample's scope, and ``n``."""
    if scope == "batch":
        return torch.zeros_like(group_ids, dtype=torch.long), 1
    unique, inverse = torch.unique(group_ids, return_inverse=True)
    return inverse, unique.numel()


def _per_scope_sum(values: torch.Tensor, index: torch.Tensor, n: int) -> torch.Tensor:
    """Sum of ``values`` within each scope, broadcast back to samples."""
    sums = torch.zeros(n, dtype=values.dtype, device=values.device).index_add_(0, index, values)
    return sums[index]


def normalize_rewards(rewards: torch.Tensor, group_ids: torch.Tensor, spec: AdvantageSpec) -> torch.Tensor:
    """Advantages ``(r - baseline) / (std + eps)`` per ``spec``, as a float tensor ``[B]``.

    The sums run in float64, where a scope of equal rewards has a baseline equal to each of them
    and so advantages of exactly 0 (in float32, 7 x 0.1 averages to 0.1 - 1e-8, and dividing
    that by a std of 1e-8 + eps made every advantage of the group -0.007)."""
    out_dtype = rewards.dtype if rewards.is_floating_point() else torch.float32
    if spec.scope == "none" or rewards.numel() == 0:
        return rewards.to(out_dtype, copy=True)
    rewards = rewards.double()
    index, n = _scope_index(group_ids, spec.scope)
    count = _per_scope_sum(torch.ones_like(rewards), index, n)
    total = _per_scope_sum(rewards, index, n)
    mean = total / count
    if spec.leave_one_out:
        others = (total - rewards) / (count - 1).clamp(min=1)
        baseline = torch.where(count > 1, others, rewards)  # a lone sample has no baseline: 0
    else:
        baseline = mean
    advantages = rewards - baseline
    if spec.std_norm:
        std = (_per_scope_sum((rewards - mean) ** 2, index, n) / count).sqrt()
        advantages = advantages / (std + spec.eps)
    return advantages.to(out_dtype)


def uniform_reward_samples(rewards: torch.Tensor, group_ids: torch.Tensor) -> torch.Tensor:
    """Bool ``[B]``: True where the sample's whole group has one reward value (no signal)."""
    index, n = _scope_index(group_ids, "group")
    if n == 0:
        return torch.zeros_like(rewards, dtype=torch.bool)
    empty = torch.zeros(n, dtype=rewards.dtype, device=rewards.device)
    high = empty.scatter_reduce(0, index, rewards, reduce="amax", include_self=False)
    low = empty.scatter_reduce(0, index, rewards, reduce="amin", include_self=False)
    return (high == low)[index]
