"""actor.offpolicy's corrections against verl's and AReaL's own functions, read from their wheels.

Each case runs our loss (GRPO's decoupled objective with one correction) and the reference on the
same random packed micro-batches, and compares the loss and its gradient. The references run in
a subprocess (tests/offpolicy_reference.py) with the wheels that ``bash
scripts/install_offpolicy_refs.sh`` installs into ``.offpolicy-refs`` (or ``$AREAL_OFFPOLICY_REFS``);
CI installs them. Batches keep ``|new - prox| < 0.9`` so that verl's dual clip (ratio 3, which our
objective does not have) never acts.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import attrs
import pytest
import torch

from areal_core.api.algorithm import LossInput
from areal_core.builtin.algorithms.grpo import GRPO
from areal_core.api.offpolicy import m2po_keep
from areal_core.config import ActorConfig, IcePopConfig, M2POConfig, MISConfig, OffPolicyConfig, TISConfig

REPO = Path(__file__).resolve().parents[1]
REFS = Path(os.environ.get("AREAL_OFFPOLICY_REFS") or REPO / ".offpolicy-refs")
BATCHES = 6  # random micro-batches per case
UNBOUNDED = 1e30  # an AReaL clamp bound that never binds: its weight is then rho itself



@attrs.frozen
class Case:
    """Our corrections, the reference (verl or areal) and its settings; ``spread`` scales
    ``prox - old`` (sequence products need a small one, or every sequence leaves the band)."""

    ours: OffPolicyConfig
    reference: str
    settings: dict[str, Any]
    spread: float = 1.0


CASES: dict[str, Case] = {
    "tis-token/verl": Case(OffPolicyConfig(corrections=["tis"]), "verl", {"level": "token", "threshold": 2.0}),
    "tis-sequence-product/verl": Case(
        OffPolicyConfig(corrections=["tis"], tis=TISConfig(level="sequence")),
        "verl", {"level": "sequence", "threshold": 2.0}, spread=0.2,
    ),
    "mis-token-two-sided/verl": Case(
        OffPolicyConfig(corrections=["mis"], mis=MISConfig(lower=0.5)),
        "verl", {"level": "token", "threshold": "0.5_2.0"},
    ),
    "mis-sequence-product/verl": Case(
        OffPolicyConfig(corrections=["mis"], mis=MISConfig(level="sequence", sequence_ratio="product", lower=0.5)),
        "verl", {"level": "sequence", "threshold": "0.5_2.0"}, spread=0.2,
    ),
    "icepop/verl": Case(OffPolicyConfig(corrections=["icepop"]), "verl", {"level": "token", "threshold": "0.5_5.0"}),
    "tis-token/areal": Case(
        OffPolicyConfig(corrections=["tis"]), "areal",
        {"rejection_sampling": {"level": "token", "action": "clamp", "upper": 2.0}},
    ),
    "tis-sequence-geometric/areal": Case(
        OffPolicyConfig(corrections=["tis"], tis=TISConfig(level="sequence", sequence_ratio="geometric", cap=1.1)),
        "areal", {"rejection_sampling": {"level": "sequence", "action": "clamp", "agg": "mean", "upper": 1.1}},
    ),
    "mis-token/areal": Case(
        OffPolicyConfig(corrections=["mis"]), "areal",
        {"rejection_sampling": {"level": "token", "action": "mask", "upper": 2.0}},
    ),
    "mis-sequence-geometric/areal": Case(
        OffPolicyConfig(corrections=["mis"], mis=MISConfig(level="sequence", lower=0.8, upper=1.25)),
        "areal",
        {"rejection_sampling": {"level": "sequence", "action": "mask", "agg": "mean", "lower": 0.8, "upper": 1.25}},
    ),
    "icepop/areal": Case(
        OffPolicyConfig(corrections=["icepop"]), "areal",
        {"rejection_sampling": {"level": "token", "action": "mask", "lower": 0.5, "upper": 5.0}},
    ),
    "m2po/areal": Case(
        OffPolicyConfig(corrections=["m2po"]), "areal",
        {"m2po": 0.04, "rejection_sampling": {"level": "token", "action": "clamp", "upper": UNBOUNDED}},
    ),
    "icepop+m2po/areal": Case(
        OffPolicyConfig(corrections=["icepop", "m2po"], icepop=IcePopConfig(), m2po=M2POConfig(threshold=0.1)),
        "areal", {"m2po": 0.1, "rejection_sampling": {"level": "token", "action": "mask", "lower": 0.5, "upper": 5.0}},
    ),
}  # fmt: skip


def random_batch(seed: int, scale: float = 1.0) -> dict[str, torch.Tensor]:
    """A packed micro-batch: 1-6 sequences of 2-14 tokens, each starting with 1-3 prompt tokens;
    ``prox - old`` spreads from 0.05 to 1 (by seed) times ``scale``, so that bands and caps act
    on some tokens."""
    gen = torch.Generator().manual_seed(seed)
    n_seqs = int(torch.randint(1, 7, (1,), generator=gen))
    lengths = torch.randint(2, 15, (n_seqs,), generator=gen)
    seq_ids = torch.repeat_interleave(torch.arange(n_seqs), lengths)
    starts = torch.cat([torch.zeros(1, dtype=torch.long), lengths.cumsum(0)[:-1]])
    position = torch.arange(len(seq_ids)) - starts[seq_ids]
    prompt = torch.randint(1, 4, (n_seqs,), generator=gen)[seq_ids]
    n = len(seq_ids)
    old = -torch.rand(n, generator=gen) * 3 - 0.05
    spread = [0.05, 0.2, 0.5, 1.0][seed % 4] * scale
    prox = old + torch.randn(n, generator=gen) * spread
    new = prox + (torch.rand(n, generator=gen) * 1.8 - 0.9)
    adv = torch.randn(n_seqs, generator=gen)[seq_ids]
    return {"old": old, "prox": prox, "new": new, "adv": adv, "mask": position >= prompt, "seq_ids": seq_ids}


def our_loss(
    offpolicy: OffPolicyConfig, data: dict[str, torch.Tensor], token_normalizer: float
) -> tuple[float, torch.Tensor]:
    new = data["new"].clone().requires_grad_(True)
    n_seqs = int(data["seq_ids"].max()) + 1
    batch = LossInput(
        old_logprobs=data["old"], prox_logprobs=data["prox"], advantages=data["adv"], loss_mask=data["mask"],
        seq_ids=data["seq_ids"], n_seqs=n_seqs, token_normalizer=token_normalizer, seq_normalizer=float(n_seqs),
        max_new_tokens=16,
    )  # fmt: skip
    loss, _ = GRPO(ActorConfig(offpolicy=offpolicy)).loss(new, batch)
    (grad,) = torch.autograd.grad(loss, new)
    return loss.item(), grad


@pytest.fixture(scope="module")
def references(tmp_path_factory) -> dict[str, list[dict[str, torch.Tensor]]]:
    """Every case's reference results, from one subprocess."""
    if not (REFS / "verl").is_dir() or not (REFS / "areal").is_dir():
        pytest.skip(f"no reference wheels at {REFS}: bash scripts/install_offpolicy_refs.sh")
    cases = [
        {**random_batch(seed, case.spread), "reference": case.reference, **case.settings}
        for case in CASES.values()
        for seed in range(BATCHES)
    ]
    tmp = tmp_path_factory.mktemp("offpolicy")
    torch.save(cases, tmp / "cases.pt")
    env = {**os.environ, "PYTHONPATH": str(REFS)}
    proc = subprocess.run(
        [sys.executable, str(REPO / "tests" / "offpolicy_reference.py"), str(tmp / "cases.pt"), str(tmp / "out.pt")],
        env=env, capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-3000:]
    results = torch.load(tmp / "out.pt")
    return {name: results[i * BATCHES : (i + 1) * BATCHES] for i, name in enumerate(CASES)}


@pytest.mark.parametrize("name", list(CASES))
def test_loss_and_gradient_match_the_reference(name, references):
    case = CASES[name]
    acted = 0
    for seed, reference in enumerate(references[name]):
        data = random_batch(seed, case.spread)
        if "keep" in reference:  # AReaL's M2PO takes masked tokens out of the normaliser too
            threshold = case.settings["m2po"]
            assert torch.equal(reference["keep"], m2po_keep(data["prox"] - data["old"], data["mask"], threshold))
            normalizer = float(reference["keep"].sum())
        else:
            normalizer = float(data["mask"].sum())
        loss, grad = our_loss(case.ours, data, normalizer)
        assert loss == pytest.approx(float(reference["loss"]), rel=1e-5, abs=1e-6), f"batch {seed}"
        assert torch.allclose(grad, reference["grad"].float(), rtol=1e-5, atol=1e-6), f"batch {seed}"
        plain, _ = our_loss(OffPolicyConfig(corrections=[]), data, normalizer)
        acted += abs(plain - loss) > 1e-6
    assert acted, f"{name}: the correction changed no batch's loss, so this case checks nothing"
