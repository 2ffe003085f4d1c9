"""How far the inference engine's log-probs are from the trainer's, every train step.

For each loss token, ``d = prox - old``: the trainer's recomputation (the proximal pass) minus
the log-prob the engine sampled the token with. ``d`` mixes two causes: the engine's numerics
(kernels, dtype, batching) and staleness (the token came from older weights). Tokens sampled by
the weights the trainer holds ("fresh": their version is the trainer's) carry the first alone,
so their stats are reported apart as well.

Stats (``train/mismatch/...``): ``abs_mean``, ``abs_p99``, ``abs_max`` of ``|d|``;
``out_of_band_frac``, the share with ``rho = exp(d)`` outside ``[1/band, band]``
(``actor.offpolicy.mismatch_band``); ``kl_k1`` = mean(-d) and ``kl_k3`` = mean(exp(d) - d - 1),
two estimates of KL(engine || trainer) from the engine's samples; ``fresh_frac``, and
``fresh_abs_mean`` / ``fresh_abs_max`` / ``fresh_kl_k3`` over the fresh tokens.
"""

from __future__ import annotations

import math

import torch

PREFIX = "mismatch/"


def gap_stats(gaps: torch.Tensor, fresh: torch.Tensor, band: float) -> dict[str, float]:
    """The stats of one step's ``gaps`` (``d`` of every loss token, 1-D) and ``fresh`` (bool, same shape)."""
    if gaps.numel() == 0:
        return {}
    gaps = gaps.double()
    out = {f"{PREFIX}{k}": v for k, v in _summary(gaps).items()}
    out[f"{PREFIX}abs_p99"] = float(torch.quantile(gaps.abs(), 0.99))
    out[f"{PREFIX}out_of_band_frac"] = float((gaps.abs() > math.log(band)).double().mean())
    out[f"{PREFIX}kl_k1"] = float((-gaps).mean())
    out[f"{PREFIX}fresh_frac"] = float(fresh.double().mean())
    if bool(fresh.any()):
        fresh_summary = _summary(gaps[fresh])
        out.update({f"{PREFIX}fresh_{k}": fresh_summary[k] for k in ("abs_mean", "abs_max", "kl_k3")})
    return out


def _summary(gaps: torch.Tensor) -> dict[str, float]:
    magnitude = gaps.abs()
    return {
        "abs_mean": float(magnitude.mean()),
        "abs_max": float(magnitude.max()),
        "kl_k3": float((torch.exp(gaps) - gaps - 1).mean()),
    }
