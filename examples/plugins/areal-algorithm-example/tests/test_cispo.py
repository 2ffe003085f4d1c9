"""CISPO's maths on hand-sized batches, and its registration through the plugin hook."""

from __future__ import annotations

import math

import attrs
import pytest
import torch

import areal_algorithm_example
from areal_algorithm_example.cispo import CISPO
from areal_core.api.algorithm import LossInput
from areal_core.builtin.algorithms.grpo import GRPO
from areal_core.config import ActorConfig
from areal_core.plugins import load_plugins


def make_batch(new, old, prox, adv, mask):
    logprobs = torch.tensor(new, requires_grad=True)
    n = len(new)
    return logprobs, LossInput(
        old_logprobs=torch.tensor(old),
        prox_logprobs=torch.tensor(prox),
        advantages=torch.tensor(adv),
        loss_mask=torch.tensor(mask),
        seq_ids=torch.zeros(n, dtype=torch.long),
        n_seqs=1,
        token_normalizer=float(sum(mask)),
        seq_normalizer=1.0,
        max_new_tokens=n,
    )


# new - prox = [0.5, -0.7, 0.1, 3.0]; prox - old = [0, 0.2, 0, 0]; the last token is masked
CASE = dict(
    new=[-0.5, -1.7, -0.9, 2.0],
    old=[-1.0, -1.2, -1.0, -1.0],
    prox=[-1.0, -1.0, -1.0, -1.0],
    adv=[1.0, -2.0, 0.5, 4.0],
    mask=[True, True, True, False],
)


def test_gradient_is_the_truncated_weight_times_the_advantage():
    logprobs, batch = make_batch(**CASE)
    loss, stats = CISPO(ActorConfig()).loss(logprobs, batch)
    loss.backward()
    # token 0: r = e^0.5 truncated to 1.2; token 1: r = e^-0.7 (no lower bound), w = e^0.2; token 2: r = e^0.1
    weights = [1.2, math.exp(0.2) * math.exp(-0.7), math.exp(0.1)]
    expected_grad = [-weights[0] * 1.0 / 3, -weights[1] * -2.0 / 3, -weights[2] * 0.5 / 3, 0.0]
    assert logprobs.grad.tolist() == pytest.approx(expected_grad, rel=1e-5)
    expected_loss = -(weights[0] * 1.0 * -0.5 + weights[1] * -2.0 * -1.7 + weights[2] * 0.5 * -0.9) / 3
    assert loss.item() == pytest.approx(expected_loss, rel=1e-5)
    assert stats["clip_frac"] == pytest.approx(1 / 3)


def test_clipped_tokens_keep_learning_where_grpo_stops():
    logprobs, batch = make_batch(**CASE)
    grpo_loss, _ = GRPO(ActorConfig()).loss(logprobs, batch)
    (grpo_grad,) = torch.autograd.grad(grpo_loss, logprobs)
    cispo_loss, _ = CISPO(ActorConfig()).loss(logprobs, batch)
    (cispo_grad,) = torch.autograd.grad(cispo_loss, logprobs)
    assert grpo_grad[0] == 0 and grpo_grad[1] == 0  # clipped above (A > 0) and below (A < 0)
    assert cispo_grad[0] < 0 and cispo_grad[1] > 0


def test_on_policy_gradient_matches_grpo():
    # new = prox = old: every ratio and weight is 1, both reduce to -A / n_tokens
    same = [-1.0, -0.5, -2.0]
    logprobs, batch = make_batch(new=same, old=same, prox=same, adv=[1.0, -0.5, 2.0], mask=[True] * 3)
    grads = []
    for cls in (GRPO, CISPO):
        loss, _ = cls(ActorConfig()).loss(logprobs, batch)
        grads.append(torch.autograd.grad(loss, logprobs)[0])
    assert grads[0].tolist() == pytest.approx([-1 / 3, 0.5 / 3, -2 / 3])
    assert torch.allclose(grads[0], grads[1])


def test_truncation_follows_eps_clip_higher():
    logprobs, batch = make_batch(**CASE)
    loss, _ = CISPO(attrs.evolve(ActorConfig(), eps_clip_higher=1.0)).loss(logprobs, batch)
    (grad,) = torch.autograd.grad(loss, logprobs)
    assert grad[0].item() == pytest.approx(-math.exp(0.5) / 3, rel=1e-5)  # e^0.5 < 2: not truncated


def test_registered_through_the_hook():
    plugins = load_plugins(autoload=False, extra=[("algorithm_example", areal_algorithm_example)])
    assert plugins.get("algorithm", "cispo") is CISPO
