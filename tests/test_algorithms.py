"""Built-in algorithms: hand-computed values, invariants of the decoupled objective, registry."""

from __future__ import annotations

import math

import attrs
import pytest
import torch
from hypothesis import example, given, settings
from hypothesis import strategies as st

from areal_core.api.algorithm import Algorithm, LossInput
from areal_core.builtin.algorithms.rloo import RLOO
from areal_core.builtin.algorithms.ppo import ReinforcePlusPlus, PPO
from areal_core.builtin.algorithms.gspo import GSPO
from areal_core.builtin.algorithms.grpo import DrGRPO, GRPO, DAPO
from areal_core.builtin.algorithms import ALGORITHMS
from areal_core.config import ActorConfig, MISConfig, OffPolicyConfig, TISConfig, load_config
from areal_core.api.errors import ConfigError
from areal_core.plugins import load_plugins

ALL = [GRPO, PPO, DrGRPO, DAPO, RLOO, GSPO, ReinforcePlusPlus]
TOKEN_MEAN = [GRPO, PPO, DAPO, RLOO, ReinforcePlusPlus]
FEW = settings(max_examples=25, deadline=None)
NO_CORRECTION = OffPolicyConfig(corrections=[])


def actor(**overrides) -> ActorConfig:
    return attrs.evolve(ActorConfig(), **overrides)


def batch(
    *,
    old,
    new,
    adv,
    mask=None,
    prox=None,
    seq_ids=None,
    ref=None,
    token_normalizer=None,
    seq_normalizer=None,
    max_new_tokens=4,
    entropy=None,
) -> tuple[torch.Tensor, LossInput]:
    """(logprobs leaf with grad, LossInput) from plain lists."""
    n = len(old)
    mask = torch.tensor(mask if mask is not None else [True] * n)
    seq_ids = torch.tensor(seq_ids if seq_ids is not None else [0] * n)
    n_seqs = int(seq_ids.max()) + 1
    logprobs = torch.tensor(new, dtype=torch.float32, requires_grad=True)
    as_t = lambda xs: None if xs is None else torch.tensor(xs, dtype=torch.float32)  # noqa: E731
    return logprobs, LossInput(
        old_logprobs=as_t(old),
        prox_logprobs=as_t(prox),
        advantages=as_t(adv),
        loss_mask=mask,
        seq_ids=seq_ids,
        n_seqs=n_seqs,
        token_normalizer=float(mask.sum()) if token_normalizer is None else token_normalizer,
        seq_normalizer=float(n_seqs) if seq_normalizer is None else seq_normalizer,
        max_new_tokens=max_new_tokens,
        ref_logprobs=as_t(ref),
        entropy=as_t(entropy),
    )


def loss_and_grad(algo: Algorithm, logprobs: torch.Tensor, inp: LossInput):
    loss, stats = algo.loss(logprobs, inp)
    (grad,) = torch.autograd.grad(loss, logprobs)
    return loss.item(), grad, stats


# --------------------------------------------------------------------------- advantages by hand

REWARDS = torch.tensor([1.0, 0.0, 2.0, 3.0, 3.0])
GROUPS = torch.tensor([7, 7, 7, 2, 2])  # ids need not be dense or sorted


def test_grpo_advantages_by_hand():
    # group 7: mean 1, population std sqrt(2/3) -> (r - 1) / sqrt(2/3); group 2: all equal -> 0
    expected = [0.0, -1 / math.sqrt(2 / 3), 1 / math.sqrt(2 / 3), 0.0, 0.0]
    assert GRPO(actor()).compute_advantages(REWARDS, GROUPS).tolist() == pytest.approx(expected, abs=1e-5)


def test_grpo_knobs_by_hand():
    no_std = GRPO(actor(std_norm=False)).compute_advantages(REWARDS, GROUPS)
    assert no_std.tolist() == pytest.approx([0.0, -1.0, 1.0, 0.0, 0.0])
    # leave-one-out: baselines (0+2)/2, (1+2)/2, (1+0)/2 and 3, 3
    loo = GRPO(actor(std_norm=False, leave_one_out=True)).compute_advantages(REWARDS, GROUPS)
    assert loo.tolist() == pytest.approx([0.0, -1.5, 1.5, 0.0, 0.0])
    # batch scope: mean 1.8, population variance (0.64 + 3.24 + 0.04 + 1.44 + 1.44) / 5 = 1.36
    batch_adv = GRPO(actor(adv_norm="batch")).compute_advantages(REWARDS, GROUPS)
    expected = [(r - 1.8) / math.sqrt(1.36) for r in [1.0, 0.0, 2.0, 3.0, 3.0]]
    assert batch_adv.tolist() == pytest.approx(expected, abs=1e-5)
    raw = GRPO(actor(adv_norm="none")).compute_advantages(REWARDS, GROUPS)
    assert raw.tolist() == [1.0, 0.0, 2.0, 3.0, 3.0]


def test_rloo_advantages_by_hand():
    # ignores std_norm/adv_norm: always leave-one-out within the group, no std
    adv = RLOO(actor(adv_norm="batch")).compute_advantages(REWARDS, GROUPS)
    assert adv.tolist() == pytest.approx([0.0, -1.5, 1.5, 0.0, 0.0])


def test_drgrpo_advantages_skip_std():
    assert DrGRPO(actor()).compute_advantages(REWARDS, GROUPS).tolist() == pytest.approx([0.0, -1.0, 1.0, 0.0, 0.0])


def test_ppo_and_reinforce_pp_use_the_batch():
    expected = [(r - 1.8) / math.sqrt(1.36) for r in [1.0, 0.0, 2.0, 3.0, 3.0]]
    assert PPO(actor()).compute_advantages(REWARDS, GROUPS).tolist() == pytest.approx(expected, abs=1e-5)
    no_std = PPO(actor(std_norm=False)).compute_advantages(REWARDS, GROUPS)
    assert no_std.tolist() == pytest.approx([-0.8, -1.8, 0.2, 1.2, 1.2], abs=1e-6)
    # REINFORCE++ always divides by the batch std, whatever std_norm says
    rpp = ReinforcePlusPlus(actor(std_norm=False)).compute_advantages(REWARDS, GROUPS)
    assert rpp.tolist() == pytest.approx(expected, abs=1e-5)


def test_dapo_filters_groups_with_one_reward():
    rewards = torch.tensor([1.0, 1.0, 0.0, 1.0, 0.5, 0.5, 2.0])
    groups = torch.tensor([0, 0, 1, 1, 2, 2, 3])
    assert DAPO(actor()).filter_groups(rewards, groups).tolist() == [False, False, True, True, False, False, False]
    assert GRPO(actor()).filter_groups(rewards, groups).all()


def test_leave_one_out_without_a_scope_is_a_config_error():
    with pytest.raises(ConfigError, match=r"^actor\.leave_one_out: "):
        GRPO(actor(adv_norm="none", leave_one_out=True))


def test_group_sizes():
    assert [cls.min_group_size for cls in ALL] == [2, 1, 2, 2, 2, 2, 1]


# --------------------------------------------------------------------------- losses by hand

# three loss tokens and one masked one. prox - old = [0.1, 0, 0]; new - prox = [0.5, -0.1, -0.5]
HAND = dict(
    old=[-1.0, -1.2, -0.7, -3.0],
    prox=[-0.9, -1.2, -0.7, -3.0],
    new=[-0.4, -1.3, -1.2, 5.0],
    adv=[1.0, 1.0, -2.0, 7.0],
    mask=[True, True, True, False],
    seq_ids=[0, 0, 1, 1],
)
# token 0: A>0, r=e^0.5 > 1.2 -> clipped at 1.2, weight e^0.1; token 1: r=e^-0.1, unclipped;
# token 2: A<0, r=e^-0.5 < 0.8 -> clipped at 0.8, min(-2 e^-0.5, -1.6) = -1.6
HAND_TOKEN_LOSSES = [-math.exp(0.1) * 1.2, -math.exp(-0.1), 1.6]


def test_grpo_loss_by_hand():
    logprobs, inp = batch(**HAND)
    loss, grad, stats = loss_and_grad(GRPO(actor()), logprobs, inp)
    assert loss == pytest.approx(sum(HAND_TOKEN_LOSSES) / 3, rel=1e-5)
    # only the unclipped token 1 moves: d/dnew(-e^(new - prox) * 1) / 3
    assert grad.tolist() == pytest.approx([0.0, -math.exp(-0.1) / 3, 0.0, 0.0], abs=1e-6)
    assert stats["loss"] == pytest.approx(sum(HAND_TOKEN_LOSSES) / 3, rel=1e-5)
    assert stats["clip_frac"] == pytest.approx(2 / 3)
    assert stats["imp_weight_mean"] == pytest.approx((math.exp(0.1) + 2) / 3, rel=1e-5)
    assert stats["imp_weight_max"] == pytest.approx(math.exp(0.1), rel=1e-5)
    assert stats["ratio_mean"] == pytest.approx((math.exp(0.5) + math.exp(-0.1) + math.exp(-0.5)) / 3, rel=1e-5)
    k3 = [math.exp(-d) + d - 1 for d in (0.5, -0.1, -0.5)]  # k3 with ref = prox, d = new - prox
    assert stats["approx_kl"] == pytest.approx(sum(k3) / 3, rel=1e-5)
    assert stats["masked_frac"] == 0.0
    assert all(type(v) is float for v in stats.values())


def test_loss_share_uses_minibatch_token_count():
    logprobs, inp = batch(**HAND, token_normalizer=12.0)
    assert loss_and_grad(GRPO(actor()), logprobs, inp)[0] == pytest.approx(sum(HAND_TOKEN_LOSSES) / 12, rel=1e-5)


def test_proximal_defaults_to_behaviour():
    hand = {**HAND, "prox": None}  # then w = 1 and r = exp(new - old) = [e^0.6, e^-0.1, e^-0.5]
    logprobs, inp = batch(**hand)
    loss = loss_and_grad(GRPO(actor()), logprobs, inp)[0]
    assert loss == pytest.approx((-1.2 - math.exp(-0.1) + 1.6) / 3, rel=1e-5)


def test_drgrpo_divides_by_the_generation_budget():
    logprobs, inp = batch(**HAND, max_new_tokens=4)  # 2 sequences x 4 tokens
    loss, grad, _ = loss_and_grad(DrGRPO(actor()), logprobs, inp)
    assert loss == pytest.approx(sum(HAND_TOKEN_LOSSES) / 8, rel=1e-5)
    assert grad[1].item() == pytest.approx(-math.exp(-0.1) / 8, rel=1e-5)


@pytest.mark.parametrize(
    ("offpolicy", "weights"),
    [
        (OffPolicyConfig(corrections=["mis"], mis=MISConfig(upper=5.0)), [0.0, math.exp(0.2)]),
        (OffPolicyConfig(corrections=["tis"], tis=TISConfig(cap=5.0)), [5.0, math.exp(0.2)]),
        (NO_CORRECTION, [6.0, math.exp(0.2)]),
    ],
)
def test_behaviour_weight_cap_by_hand(offpolicy, weights):
    # ratio 1 (new = prox), A = 1: per-token loss is -w
    prox = [-2.0 + math.log(6.0), -1.0]
    logprobs, inp = batch(old=[-2.0, -1.2], prox=prox, new=prox, adv=[1.0, 1.0])
    algo = GRPO(actor(offpolicy=offpolicy))
    loss, grad, stats = loss_and_grad(algo, logprobs, inp)
    assert loss == pytest.approx(-sum(weights) / 2, rel=1e-5)
    assert grad.tolist() == pytest.approx([-w / 2 for w in weights], rel=1e-5)
    assert stats["masked_frac"] == (0.5 if offpolicy.corrections == ["mis"] else 0.0)
    assert stats["truncated_frac"] == (0.5 if offpolicy.corrections == ["tis"] else 0.0)
    assert stats["imp_weight_max"] == pytest.approx(6.0, rel=1e-5)


def test_dapo_clips_higher():
    # r = e^0.22 ~ 1.246, A = 1: inside DAPO's 1.28 (gradient flows), outside GRPO's 1.2
    logprobs, inp = batch(old=[-1.0], new=[-0.78], adv=[1.0])
    grpo_loss, grpo_grad, _ = loss_and_grad(GRPO(actor()), logprobs, inp)
    dapo_loss, dapo_grad, dapo_stats = loss_and_grad(DAPO(actor()), logprobs, inp)
    assert grpo_loss == pytest.approx(-1.2) and grpo_grad.item() == 0.0
    assert dapo_loss == pytest.approx(-math.exp(0.22), rel=1e-5)
    assert dapo_grad.item() == pytest.approx(-math.exp(0.22), rel=1e-5)
    assert dapo_stats["clip_frac"] == 0.0
    assert DAPO(actor(eps_clip_higher=0.21)).loss(logprobs, inp)[0].item() == pytest.approx(-1.21)


def test_gspo_sequence_ratio_by_hand():
    # seq 0: log-ratios 0.1, -0.3 -> s = e^-0.1, A = 1: below the range but A > 0 -> unclipped
    # seq 1: one loss token (the first is prompt), log-ratio 0.002 -> s = e^0.002, A = -1: unclipped
    # seq 2: log-ratios 0.01, 0.01 -> s = e^0.01 > 1 + 4e-4, A = 1 -> clipped, no gradient
    old = [-1.0, -1.0, -2.0, -1.0, -1.0, -1.0]
    new = [-0.9, -1.3, 9.0, -0.998, -0.99, -0.99]
    adv = [1.0, 1.0, 0.0, -1.0, 1.0, 1.0]
    mask = [True, True, False, True, True, True]
    logprobs, inp = batch(old=old, new=new, adv=adv, mask=mask, seq_ids=[0, 0, 1, 1, 2, 2])
    loss, grad, stats = loss_and_grad(GSPO(actor()), logprobs, inp)
    s0, s1 = math.exp(-0.1), math.exp(0.002)
    assert loss == pytest.approx((-s0 + s1 - (1 + 4e-4)) / 3, rel=1e-4)
    # d s_i / d new_t = s_i / L_i
    assert grad.tolist() == pytest.approx([-s0 / 2 / 3, -s0 / 2 / 3, 0.0, s1 / 3, 0.0, 0.0], abs=1e-5)
    assert stats["clip_frac"] == pytest.approx(2 / 5)
    # explicit config values replace GSPO's own range
    assert GSPO(actor(eps_clip=0.2, eps_clip_higher=0.3)).loss_options.eps_high == 0.3


def test_kl_to_reference_by_hand():
    # A = 0 and ratio 1: only kl_coef * k3 remains; k3 = e^d - d - 1 with d = ref - new = 0.5
    logprobs, inp = batch(old=[-1.5, -1.0], new=[-1.5, -1.0], adv=[0.0, 0.0], ref=[-1.0, -1.0])
    algo = PPO(actor(kl_coef=0.1))
    assert algo.needs_ref and not PPO(actor()).needs_ref
    loss, grad, stats = loss_and_grad(algo, logprobs, inp)
    k3 = math.exp(0.5) - 0.5 - 1
    assert loss == pytest.approx(0.1 * k3 / 2, rel=1e-5)
    assert grad.tolist() == pytest.approx([-0.1 * (math.exp(0.5) - 1) / 2, 0.0], abs=1e-6)
    assert stats["kl_ref"] == pytest.approx(k3 / 2, rel=1e-5)


def test_entropy_is_reported():
    logprobs, inp = batch(old=[-1.0, -1.0], new=[-1.0, -1.0], adv=[1.0, 1.0], mask=[True, False], entropy=[2.0, 9.0])
    assert GRPO(actor()).loss(logprobs, inp)[1]["entropy"] == 2.0


def test_micro_batch_without_loss_tokens():
    logprobs, inp = batch(old=[-1.0, -1.0], new=[-1.0, -1.0], adv=[1.0, 1.0], mask=[False, False], token_normalizer=5.0)
    for cls in ALL:
        loss, grad, stats = loss_and_grad(cls(actor()), logprobs, inp)
        assert loss == 0.0 and not grad.any()
        assert all(math.isfinite(v) for v in stats.values())


# --------------------------------------------------------------------------- invariants


@st.composite
def flat_batches(draw, zero_ratio: bool = False):
    """Random packed micro-batch: 1-4 sequences of 0-2 prompt and 1-4 response tokens."""
    seq_ids, mask, adv = [], [], []
    n_seqs = draw(st.integers(1, 4))
    for s in range(n_seqs):
        prompt, response = draw(st.integers(0, 2)), draw(st.integers(1, 4))
        a = draw(st.floats(-2, 2, width=32))
        seq_ids += [s] * (prompt + response)
        mask += [False] * prompt + [True] * response
        adv += [a] * (prompt + response)
    n = len(mask)
    old = draw(st.lists(st.floats(-4, -0.125, width=32), min_size=n, max_size=n))
    if zero_ratio:
        prox, new = list(old), list(old)
    else:
        prox = [o + d for o, d in zip(old, draw(st.lists(st.floats(-0.25, 0.25, width=32), min_size=n, max_size=n)))]
        new = [p + d for p, d in zip(prox, draw(st.lists(st.floats(-0.5, 0.5, width=32), min_size=n, max_size=n)))]
    ref = [o + 0.1 for o in old]
    return dict(old=old, prox=prox, new=new, adv=adv, mask=mask, seq_ids=seq_ids, ref=ref)


@FEW
@given(
    rewards=st.lists(st.floats(-5, 5, width=32), min_size=1, max_size=12),
    group_size=st.integers(1, 4),
    std_norm=st.booleans(),
    leave_one_out=st.booleans(),
)
@example(rewards=[0.3899] * 3, group_size=3, std_norm=True, leave_one_out=True)  # float32 sums missed 0 by 0.03
def test_grpo_advantages_have_zero_group_mean(rewards, group_size, std_norm, leave_one_out):
    groups = torch.tensor([i // group_size for i in range(len(rewards))])
    algo = GRPO(actor(std_norm=std_norm, leave_one_out=leave_one_out))
    adv = algo.compute_advantages(torch.tensor(rewards), groups)
    for g in groups.unique():
        assert adv[groups == g].mean().item() == pytest.approx(0.0, abs=1e-4)


@FEW
@given(
    reward=st.floats(-5, 5, width=32),
    group_size=st.integers(1, 12),
    std_norm=st.booleans(),
    leave_one_out=st.booleans(),
)
@example(reward=0.1, group_size=7, std_norm=True, leave_one_out=False)  # float32 sums gave -0.007 each
def test_a_group_of_equal_rewards_has_zero_advantages(reward, group_size, std_norm, leave_one_out):
    algo = GRPO(actor(std_norm=std_norm, leave_one_out=leave_one_out))
    adv = algo.compute_advantages(torch.full((group_size,), reward), torch.zeros(group_size, dtype=torch.long))
    assert adv.dtype == torch.float32 and adv.eq(0).all(), adv.tolist()


@FEW
@given(data=flat_batches(zero_ratio=True))
def test_ratio_one_loss_is_minus_mean_advantage(data):
    logprobs, inp = batch(**{**data, "ref": None})
    mask = inp.loss_mask
    adv = inp.advantages
    for cls in TOKEN_MEAN:
        loss = cls(actor(offpolicy=NO_CORRECTION)).loss(logprobs, inp)[0]
        assert loss.item() == pytest.approx(-adv[mask].mean().item(), abs=1e-5)
    per_seq = [adv[mask & (inp.seq_ids == s)].mean().item() for s in range(inp.n_seqs)]
    assert GSPO(actor(offpolicy=NO_CORRECTION)).loss(logprobs, inp)[0].item() == pytest.approx(
        -sum(per_seq) / inp.n_seqs, abs=1e-5
    )
    budget = inp.n_seqs * inp.max_new_tokens
    assert DrGRPO(actor(offpolicy=NO_CORRECTION)).loss(logprobs, inp)[0].item() == pytest.approx(
        -adv[mask].sum().item() / budget, abs=1e-5
    )


SUBNORMAL_ADVANTAGE = dict(  # once made clip_frac 0: both surrogates underflowed to the same value
    old=[-1.0] * 6, prox=[-1.0] * 6, new=[-1.0] * 5 + [-1.5], adv=[0.0] + [-1.4e-45] * 5,
    mask=[True, False, True, True, True, True], seq_ids=[0, 1, 1, 1, 1, 1], ref=[-0.9] * 6,
)


@FEW
@given(data=flat_batches(), cls=st.sampled_from([GRPO, DAPO, PPO]))
@example(data=SUBNORMAL_ADVANTAGE, cls=GRPO)
def test_clipped_tokens_get_no_gradient(data, cls):
    algo = cls(actor(offpolicy=NO_CORRECTION))
    low, high = algo.clip_range()
    logprobs, inp = batch(**{**data, "ref": None})
    _, grad, stats = loss_and_grad(algo, logprobs, inp)
    ratio = torch.exp(logprobs.detach() - inp.prox_logprobs)
    adv = inp.advantages
    clipped = ((adv > 0) & (ratio > 1 + high)) | ((adv < 0) & (ratio < 1 - low))
    mask = inp.loss_mask
    assert not grad[mask & clipped].any()
    moving = mask & ~clipped & (adv.abs() > 1e-3)
    if moving.any():
        assert grad[moving].abs().min().item() > 0
    assert stats["clip_frac"] == pytest.approx((clipped & mask).sum().item() / mask.sum().item(), abs=1e-6)


@FEW
@given(log_ratio=st.floats(-2, 2), adv=st.floats(-3, 3).filter(lambda a: abs(a) > 1e-3), cls=st.sampled_from(ALL))
def test_effective_ratio_stays_within_the_clip_bound(log_ratio, adv, cls):
    # one token: loss = -min(r A, clip(r) A), so -loss / A is min(r, clip r) for A > 0, max for A < 0
    algo = cls(actor(offpolicy=NO_CORRECTION))
    low, high = algo.clip_range()
    logprobs, inp = batch(old=[-1.0], new=[-1.0 + log_ratio], adv=[adv], max_new_tokens=1)
    effective = -algo.loss(logprobs, inp)[0].item() / adv
    if adv > 0:
        assert effective <= 1 + high + 1e-5
    else:
        assert effective >= 1 - low - 1e-5


@FEW
@given(
    data=flat_batches(),
    junk=st.lists(st.floats(-50, 50, width=32), min_size=5, max_size=5),
    corrections=st.sampled_from([[], ["tis"], ["mis"], ["icepop", "m2po"]]),
    level=st.sampled_from(["token", "sequence"]),
)
def test_masked_positions_never_contribute(data, junk, corrections, level):
    masked = [i for i, m in enumerate(data["mask"]) if not m]
    changed = {key: list(data[key]) for key in ("old", "prox", "new", "adv", "ref")}
    for i in masked:
        for j, key in enumerate(changed):
            changed[key][i] = junk[j]
    changed["seq_ids"] = [0 if i in masked else s for i, s in enumerate(data["seq_ids"])]
    for cls in ALL:
        offpolicy = OffPolicyConfig(corrections=corrections, tis=TISConfig(level=level), mis=MISConfig(level=level))
        algo = cls(actor(kl_coef=0.05, offpolicy=offpolicy))
        loss_a, grad_a, stats_a = loss_and_grad(algo, *batch(**data))
        loss_b, grad_b, stats_b = loss_and_grad(algo, *batch(**{**data, **changed}))
        assert loss_a == loss_b and torch.equal(grad_a, grad_b) and stats_a == stats_b


def test_nan_and_inf_at_masked_positions_are_harmless():
    data = {**HAND, "new": [-0.4, -1.3, -1.2, float("nan")], "adv": [1.0, 1.0, -2.0, float("inf")]}
    for cls in ALL:
        loss, grad, _ = loss_and_grad(cls(actor()), *batch(**data))
        assert math.isfinite(loss) and torch.isfinite(grad).all() and grad[3] == 0


def _sub_batch(data: dict, first: int, last: int) -> dict:
    """Sequences ``first..last-1`` of ``data``, re-indexed from 0."""
    keep = [i for i, s in enumerate(data["seq_ids"]) if first <= s < last]
    part = {key: [data[key][i] for i in keep] for key in ("old", "prox", "new", "adv", "mask", "ref")}
    part["seq_ids"] = [data["seq_ids"][i] - first for i in keep]
    return part


@FEW
@given(data=flat_batches(), split=st.integers(1, 3), kl=st.sampled_from([0.0, 0.1]))
def test_micro_batch_shares_add_up(data, split, kl):
    n_seqs = max(data["seq_ids"]) + 1
    split = min(split, n_seqs)
    norms = dict(token_normalizer=float(sum(data["mask"])), seq_normalizer=float(n_seqs))
    for cls in ALL:
        algo = cls(actor(kl_coef=kl))
        whole, grad, _ = loss_and_grad(algo, *batch(**data, **norms))
        parts = [(0, split), (split, n_seqs)] if split < n_seqs else [(0, n_seqs)]
        results = [loss_and_grad(algo, *batch(**_sub_batch(data, a, b), **norms)) for a, b in parts]
        assert sum(r[0] for r in results) == pytest.approx(whole, rel=1e-5, abs=1e-6)
        assert torch.allclose(torch.cat([r[1] for r in results]), grad, atol=1e-6)


# --------------------------------------------------------------------------- registry


@pytest.mark.parametrize("name", sorted(ALGORITHMS))
def test_builtin_names_resolve(name):
    cls = load_plugins(autoload=False).get("algorithm", name)
    assert issubclass(cls, Algorithm) and cls.name == name
    algo = cls(load_config(None, [f"actor.algorithm={name}"]).actor)
    logprobs, inp = batch(**HAND)
    loss, _ = algo.loss(logprobs, inp)
    loss.backward()
    assert logprobs.grad is not None and torch.isfinite(logprobs.grad).all()
