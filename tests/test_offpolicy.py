"""actor.offpolicy by hand and by invariants; the engine/trainer gap stats; the config's errors.

The comparison with verl's and AReaL's own functions is tests/test_offpolicy_parity.py.
"""

from __future__ import annotations

import math

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from test_algorithms import actor, batch, flat_batches, loss_and_grad

from areal_core.api.errors import ConfigError
from areal_core.builtin.algorithms.gspo import GSPO
from areal_core.builtin.algorithms.grpo import GRPO
from areal_core.api.offpolicy import behaviour_weights, m2po_keep
from areal_core.config import MISConfig, M2POConfig, OffPolicyConfig, TISConfig, load_config
from areal_core.train.logprob_gap import gap_stats

FEW = settings(max_examples=30, deadline=None)
NONE = OffPolicyConfig(corrections=[])
TOKEN_LEVEL = [
    OffPolicyConfig(corrections=["tis"]),
    OffPolicyConfig(corrections=["mis"], mis=MISConfig(lower=0.7, upper=1.3)),
    OffPolicyConfig(corrections=["icepop"]),
    OffPolicyConfig(corrections=["m2po"], m2po=M2POConfig(threshold=0.01)),
    OffPolicyConfig(corrections=["icepop", "m2po"]),
]
SEQUENCE_LEVEL = [
    OffPolicyConfig(corrections=["tis"], tis=TISConfig(level="sequence", cap=1.2)),
    OffPolicyConfig(corrections=["tis"], tis=TISConfig(level="sequence", sequence_ratio="geometric", cap=1.05)),
    OffPolicyConfig(corrections=["mis"], mis=MISConfig(level="sequence", lower=0.9, upper=1.1)),
    OffPolicyConfig(corrections=["mis"], mis=MISConfig(level="sequence", sequence_ratio="product", upper=1.5)),
]


@st.composite
def stale_batches(draw):
    """``flat_batches`` with ``prox - old`` stretched up to 8x (ratios from about 0.14 to 7)."""
    data = draw(flat_batches())
    stretch = draw(st.floats(1, 8))
    prox = [o + (p - o) * stretch for o, p in zip(data["old"], data["prox"])]
    new = [q + n - p for q, n, p in zip(prox, data["new"], data["prox"])]  # the same new - prox
    return {**data, "prox": prox, "new": new, "ref": None}


def weights_of(offpolicy: OffPolicyConfig, old, prox, seq_ids, mask=None):
    mask = torch.tensor(mask if mask is not None else [True] * len(old))
    seq_ids = torch.tensor(seq_ids)
    return behaviour_weights(torch.tensor(old), torch.tensor(prox), mask, seq_ids, int(seq_ids.max()) + 1, offpolicy)


# --------------------------------------------------------------------------- by hand


def test_sequence_tis_uses_the_product_by_default():
    # sequence 0: d = 0.5, 0.5 -> product e^1 = 2.72, capped at 2; sequence 1: d = -0.2 -> e^-0.2
    w = weights_of(OffPolicyConfig(corrections=["tis"], tis=TISConfig(level="sequence")),
                   [-1.0, -1.0, -1.0], [-0.5, -0.5, -1.2], [0, 0, 1])  # fmt: skip
    assert w.applied.tolist() == pytest.approx([2.0, 2.0, math.exp(-0.2)], rel=1e-6)
    assert w.truncated.tolist() == [True, True, False]
    geometric = OffPolicyConfig(corrections=["tis"], tis=TISConfig(level="sequence", sequence_ratio="geometric"))
    w = weights_of(geometric, [-1.0, -1.0, -1.0], [-0.5, -0.5, -1.2], [0, 0, 1])
    assert w.applied.tolist() == pytest.approx([math.exp(0.5), math.exp(0.5), math.exp(-0.2)], rel=1e-6)


def test_sequence_mis_masks_whole_sequences_by_their_geometric_mean():
    # sequence 0: d = 1.0, -0.2 -> geometric e^0.4 = 1.49 (in [0.5, 2]); sequence 1: d = 0.8, 0.8 -> e^0.8 = 2.23
    offpolicy = OffPolicyConfig(corrections=["mis"], mis=MISConfig(level="sequence", lower=0.5))
    w = weights_of(offpolicy, [-2.0] * 4, [-1.0, -2.2, -1.2, -1.2], [0, 0, 1, 1])
    assert w.applied.tolist() == pytest.approx([math.exp(0.4)] * 2 + [0.0] * 2, rel=1e-6)
    assert w.masked.tolist() == [False, False, True, True]


def test_icepop_masks_both_sides_of_its_band():
    prox = [-2.0 + math.log(r) for r in (0.4, 0.6, 4.0, 6.0)]
    w = weights_of(OffPolicyConfig(corrections=["icepop"]), [-2.0] * 4, prox, [0] * 4)
    assert w.applied.tolist() == pytest.approx([0.0, 0.6, 4.0, 0.0], rel=1e-6)


def test_m2po_drops_the_fewest_largest_second_moments():
    # d^2 = 1, 0.09, 0.01, 0 (mean 0.275); without the first the mean is 0.0333 <= 0.04
    d = torch.tensor([1.0, 0.3, -0.1, 0.0])
    assert m2po_keep(d, torch.ones(4, dtype=torch.bool), 0.04).tolist() == [False, True, True, True]
    # above the threshold to the last token: keep the smallest one; masked positions stay False
    keep = m2po_keep(torch.tensor([2.0, 5.0, -1.0, 9.0]), torch.tensor([True, True, True, False]), 0.04)
    assert keep.tolist() == [False, False, True, False]


def test_corrections_reach_the_loss_and_its_stats():
    # A = 1, new = prox (ratio 1): the per-token loss is -w; token 0 has rho 6 (IcePop masks it)
    prox = [-2.0 + math.log(6.0), -1.0]
    logprobs, inp = batch(old=[-2.0, -1.2], prox=prox, new=prox, adv=[1.0, 1.0])
    loss, grad, stats = loss_and_grad(GRPO(actor()), logprobs, inp)  # the default: [icepop]
    assert loss == pytest.approx(-math.exp(0.2) / 2, rel=1e-5)
    assert grad.tolist() == pytest.approx([0.0, -math.exp(0.2) / 2], rel=1e-5)
    assert stats["masked_frac"] == 0.5 and stats["truncated_frac"] == 0.0


# --------------------------------------------------------------------------- invariants


@FEW
@given(data=flat_batches(zero_ratio=True), offpolicy=st.sampled_from(TOKEN_LEVEL + SEQUENCE_LEVEL), gspo=st.booleans())
def test_a_ratio_of_one_everywhere_is_plain_ppo(data, offpolicy, gspo):
    cls = GSPO if gspo else GRPO
    data = {**data, "new": [n + 0.3 * ((i % 3) - 1) for i, n in enumerate(data["new"])]}  # policy moved
    corrected = loss_and_grad(cls(actor(offpolicy=offpolicy)), *batch(**data))
    plain = loss_and_grad(cls(actor(offpolicy=NONE)), *batch(**data))
    assert corrected[0] == pytest.approx(plain[0], abs=1e-6)
    assert torch.allclose(corrected[1], plain[1], atol=1e-7)


@FEW
@given(data=stale_batches(), offpolicy=st.sampled_from(TOKEN_LEVEL))
def test_token_corrections_never_raise_a_tokens_gradient(data, offpolicy):
    """Each token's gradient is its weight times the same term, so a weight that is only ever
    lowered (or zeroed) bounds every component, and the norm, by the uncorrected one's."""
    _, grad, _ = loss_and_grad(GRPO(actor(offpolicy=offpolicy)), *batch(**data))
    _, plain, _ = loss_and_grad(GRPO(actor(offpolicy=NONE)), *batch(**data))
    assert (grad.abs() <= plain.abs() * (1 + 1e-5) + 1e-7).all()
    assert grad.norm() <= plain.norm() * (1 + 1e-5) + 1e-7


@FEW
@given(data=stale_batches(), offpolicy=st.sampled_from(TOKEN_LEVEL + SEQUENCE_LEVEL))
def test_masked_tokens_get_no_gradient_and_weights_respect_their_bounds(data, offpolicy):
    logprobs, inp = batch(**data)
    _, grad, _ = loss_and_grad(GRPO(actor(offpolicy=offpolicy)), logprobs, inp)
    mask = inp.loss_mask
    w = behaviour_weights(inp.old_logprobs, inp.prox_logprobs, mask, inp.seq_ids, inp.n_seqs, offpolicy)
    assert not grad[w.masked].any()
    assert not (w.masked & ~mask).any() and not (w.truncated & ~mask).any()
    if "tis" in offpolicy.corrections:
        assert (w.applied[mask] <= offpolicy.tis.cap * (1 + 1e-6)).all()
    if "mis" in offpolicy.corrections:
        kept = w.applied[mask & ~w.masked]
        assert (kept <= offpolicy.mis.upper * (1 + 1e-6)).all()
        assert offpolicy.mis.lower is None or (kept >= offpolicy.mis.lower * (1 - 1e-6)).all()


@FEW
@given(d=st.lists(st.floats(-3, 3, width=32), min_size=1, max_size=40), threshold=st.floats(0.001, 1))
def test_m2po_keeps_the_largest_set_whose_second_moment_fits(d, threshold):
    d = torch.tensor(d)
    keep = m2po_keep(d, torch.ones_like(d, dtype=torch.bool), threshold)
    second = d * d
    assert keep.any()
    if keep.sum() > 1:
        assert second[keep].mean() <= threshold * (1 + 1e-6)
    assert second[keep].max() <= second[~keep].min() if (~keep).any() else True  # the largest are dropped
    if (~keep).any():  # dropping one fewer would not fit
        restored = torch.cat([second[keep], second[~keep].min().reshape(1)])
        assert restored.mean() > threshold * (1 - 1e-6)


# --------------------------------------------------------------------------- the gap stats


def test_gap_stats_by_hand():
    gaps = torch.tensor([0.0, 0.1, -0.1, 1.0])  # ln 2 = 0.69: one token outside [1/2, 2]
    fresh = torch.tensor([True, True, False, False])
    stats = gap_stats(gaps, fresh, band=2.0)
    assert stats["mismatch/abs_mean"] == pytest.approx(0.3)
    assert stats["mismatch/abs_max"] == pytest.approx(1.0)
    assert stats["mismatch/abs_p99"] == pytest.approx(0.1 + 0.97 * 0.9)  # linear between the top two
    assert stats["mismatch/out_of_band_frac"] == 0.25
    assert stats["mismatch/kl_k1"] == pytest.approx(-0.25)
    k3 = [math.exp(g) - g - 1 for g in (0.0, 0.1, -0.1, 1.0)]
    assert stats["mismatch/kl_k3"] == pytest.approx(sum(k3) / 4)
    assert stats["mismatch/fresh_frac"] == 0.5
    assert stats["mismatch/fresh_abs_mean"] == pytest.approx(0.05)
    assert stats["mismatch/fresh_abs_max"] == pytest.approx(0.1)
    assert stats["mismatch/fresh_kl_k3"] == pytest.approx(sum(k3[:2]) / 2)
    assert "mismatch/fresh_abs_mean" not in gap_stats(gaps, torch.zeros(4, dtype=torch.bool), 2.0)
    assert gap_stats(torch.zeros(0), torch.zeros(0, dtype=torch.bool), 2.0) == {}


# --------------------------------------------------------------------------- config


@pytest.mark.parametrize(
    ("override", "message"),
    [
        ("actor.offpolicy.corrections=[tis,icepop]", "actor.offpolicy.corrections: ['tis', 'icepop']: tis and icepop each set"),
        ("actor.offpolicy.corrections=[m2po,m2po]", "actor.offpolicy.corrections: ['m2po', 'm2po']: m2po is listed twice"),
        ("actor.offpolicy.corrections=[pg_is]", "actor.offpolicy.corrections[0]: must be one of 'tis', 'mis', 'icepop', 'm2po'"),
        ("actor.offpolicy.mis.lower=1.5", "actor.offpolicy.mis.lower: must be < 1"),
        ("actor.offpolicy.icepop.lower=0", "actor.offpolicy.icepop.lower: must be > 0"),
        ("actor.offpolicy.tis.cap=1", "actor.offpolicy.tis.cap: must be > 1"),
        ("actor.offpolicy.m2po.threshold=0", "actor.offpolicy.m2po.threshold: must be > 0"),
        ("actor.offpolicy.tis.level=seq", "actor.offpolicy.tis.level: must be one of 'token', 'sequence'"),
        ("actor.behav_imp_weight_cap=5", "actor.behav_imp_weight_cap: was replaced: use actor.offpolicy"),
    ],
)
def test_bad_settings_name_the_key(override, message):
    with pytest.raises(ConfigError) as info:
        load_config(None, [override])
    assert str(info.value).startswith(message) and "\n" not in str(info.value)


def test_corrections_combine_m2po_with_a_weight():
    config = load_config(None, ["actor.offpolicy.corrections=[mis,m2po]", "actor.offpolicy.mis.level=sequence"])
    assert config.actor.offpolicy.corrections == ["mis", "m2po"] and config.actor.offpolicy.mis.level == "sequence"
