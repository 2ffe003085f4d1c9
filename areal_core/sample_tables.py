"""Sample tables: the rows of generations that a run sends to its stats sinks (``stats.samples``)."""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from typing import Any

from areal_core.api.stats_sink import SampleRow
from areal_core.api.trajectory import Trajectory


def eval_rows(
    step: int, items: Sequence[dict[str, Any]], results: Sequence[Trajectory | Exception], k: int
) -> list[SampleRow]:
    """The first ``k`` held-out answers of the evaluation at ``step`` (the same items every time, so
    answers can be compared across steps); the weights were those of version ``step``."""
    return [_row(step, "eval", item, result, version=step) for item, result in zip(items[:k], results)]


def train_rows(
    step: int, batch: Sequence[Trajectory], items_by_id: Mapping[str, dict[str, Any]], k: int
) -> list[SampleRow]:
    """The first ``k`` samples step ``step`` trained on, each with the newest weight version in it."""
    return [
        _row(step, "train", items_by_id.get(traj.prompt_id, {"id": traj.prompt_id}), traj, version=max(traj.versions))
        for traj in batch[:k]
    ]


def _row(step: int, split: str, item: dict[str, Any], result: Trajectory | Exception, *, version: int) -> SampleRow:
    """One row; a failed episode shows its error as the response and scores 0."""
    prompt = item.get("prompt", "")
    failed = isinstance(result, Exception)
    return SampleRow(
        step=step, split=split, id=str(item["id"]), prompt=prompt if isinstance(prompt, str) else json.dumps(prompt),
        response=f"{type(result).__name__}: {result}" if failed else str(result.info.get("completion", "")),
        reward=0.0 if failed else result.reward, output_tokens=0 if failed else result.n_output_tokens, version=version,
    )  # fmt: skip
