"""Trajectory: one finished episode, as the rollout side hands it to the trainer."""

from __future__ import annotations

from typing import Any

import attrs


@attrs.frozen(kw_only=True)
class Trajectory:
    """A prompt + completion token sequence with everything the loss needs.

    All per-token lists have ``len(input_ids)`` entries. ``logprobs[t]`` is the behaviour
    log-prob of ``input_ids[t]`` given ``input_ids[:t]`` (0 where ``loss_mask`` is 0), and
    ``versions[t]`` the weight version that produced it (-1 on prompt tokens).
    """

    uid: str  # unique per sample
    prompt_id: str  # samples of one prompt share it (the GRPO group)
    input_ids: list[int]
    loss_mask: list[int]
    logprobs: list[float]
    versions: list[int]
    reward: float
    info: dict[str, Any] = attrs.Factory(dict)  # stop reason, turns, ... for stats only

    def __attrs_post_init__(self) -> None:
        n = len(self.input_ids)
        for name in ("loss_mask", "logprobs", "versions"):
            if len(getattr(self, name)) != n:
                raise ValueError(f"Trajectory.{name} has {len(getattr(self, name))} entries, expected {n}")

    @property
    def n_output_tokens(self) -> int:
        return sum(self.loss_mask)
