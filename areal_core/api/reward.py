"""Reward interface: ``fn(prompt, completion, **data) -> float`` (sync or async).

Rewards run in a process pool with a per-call timeout (see :mod:`areal_core.rollout.reward_runner`);
an exception or timeout scores 0 and is counted, never killing the run.
"""

from __future__ import annotations

from typing import Any, Awaitable, Callable, Union

RewardFn = Callable[..., Union[float, Awaitable[float]]]


def call_reward(fn: RewardFn, prompt: str, completion: str, data: dict[str, Any]) -> float:
    """Run a reward to completion in the current process (used inside pool workers)."""
    import asyncio
    import inspect

    result = fn(prompt, completion, **data)
    if inspect.isawaitable(result):
        result = asyncio.run(result)
    return float(result)
