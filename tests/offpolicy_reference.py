"""The reference side of tests/test_offpolicy_parity.py: verl's and AReaL's own functions, from
their wheels (``scripts/install_offpolicy_refs.sh`` puts them on this process's path only).

    python tests/offpolicy_reference.py CASES.pt RESULTS.pt    # or --check: do they import?

``CASES.pt`` holds a list of cases: a packed micro-batch (flat ``old``, ``prox``, ``new``,
``adv``, ``mask``, contiguous ``seq_ids``) and which reference to run with which settings.
``RESULTS.pt`` gets, per case, the reference's loss, its gradient with respect to ``new`` (flat
again) and, for M2PO, AReaL's kept-token mask. Runs in its own process so that neither library's
dependencies reach the test process.
"""

from __future__ import annotations

import sys
from typing import Any

import torch


def verl_loss(case: dict[str, Any]) -> dict[str, torch.Tensor]:
    """verl: ``compute_rollout_correction_weights`` (TIS, or IcePop-style masking with a
    ``lower_upper`` threshold) into ``compute_policy_loss_vanilla``, padded ``[B, T]``."""
    from verl.trainer.ppo.core_algos import compute_policy_loss_vanilla
    from verl.trainer.ppo.rollout_corr_helper import compute_rollout_correction_weights

    rows, cols = padded_positions(case["seq_ids"])
    shape = (int(rows.max()) + 1, int(cols.max()) + 1)

    def pad(flat: torch.Tensor) -> torch.Tensor:
        out = torch.zeros(shape, dtype=flat.dtype)
        out[rows, cols] = flat
        return out

    new = pad(case["new"]).requires_grad_(True)
    mask = pad(case["mask"].float())
    old, prox, adv = pad(case["old"]), pad(case["prox"]), pad(case["adv"])
    weights, _ = compute_rollout_correction_weights(
        prox - old, mask, rollout_is=case["level"], rollout_is_threshold=case["threshold"]
    )
    config = _VerlConfig(
        clip_ratio=0.2, clip_ratio_low=0.2, clip_ratio_high=0.2, clip_ratio_c=3.0, global_batch_info={}
    )
    loss, _ = compute_policy_loss_vanilla(prox, new, adv, mask, "token-mean", config, rollout_is_weights=weights)
    (grad,) = torch.autograd.grad(loss, new)
    return {"loss": loss.detach(), "grad": grad[rows, cols]}


class _VerlConfig(dict):
    """The actor config fields ``compute_policy_loss_vanilla`` reads (attributes and ``.get``)."""

    __getattr__ = dict.__getitem__


def areal_loss(case: dict[str, Any]) -> dict[str, torch.Tensor]:
    """AReaL: ``ppo_actor_loss_fn`` with a ``RejectionSamplingConfig`` on the packed batch; with
    ``m2po`` set, ``_apply_m2po_masking`` first changes the loss mask, as AReaL's actor does."""
    from areal.api.cli_args import RejectionSamplingConfig
    from areal.trainer.ppo.actor import _apply_m2po_masking
    from areal.utils.functional.functional import ppo_actor_loss_fn

    new = case["new"].clone().requires_grad_(True)
    mask = case["mask"]
    out: dict[str, torch.Tensor] = {}
    if case.get("m2po") is not None:
        mask = out["keep"] = _apply_m2po_masking(case["old"], case["prox"], mask, case["m2po"])
    counts = torch.bincount(case["seq_ids"])
    cu_seqlens = torch.cat([torch.zeros(1, dtype=torch.long), counts.cumsum(0)]).int()
    sampling = RejectionSamplingConfig(**case["rejection_sampling"])
    loss, _ = ppo_actor_loss_fn(
        logprobs=new, proximal_logprobs=case["prox"], old_logprobs=case["old"], advantages=case["adv"],
        eps_clip=0.2, loss_mask=mask, rejection_sampling=sampling, cu_seqlens=cu_seqlens,
    )  # fmt: skip
    (grad,) = torch.autograd.grad(loss, new)
    return {**out, "loss": loss.detach(), "grad": grad}


def padded_positions(seq_ids: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(row, column) of each packed token in a ``[B, T]`` layout (sequences are contiguous)."""
    starts = torch.cat([torch.zeros(1, dtype=torch.long), torch.bincount(seq_ids).cumsum(0)[:-1]])
    return seq_ids, torch.arange(len(seq_ids)) - starts[seq_ids]


REFERENCES = {"verl": verl_loss, "areal": areal_loss}


def main(argv: list[str]) -> int:
    if argv == ["--check"]:
        import areal.trainer.ppo.actor  # noqa: F401
        import areal.utils.functional.functional  # noqa: F401
        import verl.trainer.ppo.core_algos  # noqa: F401
        import verl.trainer.ppo.rollout_corr_helper  # noqa: F401

        return 0
    cases_path, results_path = argv
    cases = torch.load(cases_path)
    torch.save([REFERENCES[case["reference"]](case) for case in cases], results_path)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
