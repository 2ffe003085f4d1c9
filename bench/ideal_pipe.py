"""The fastest an asynchronous run can be under the staleness rules themselves: a simulation.

``bench/async_vs_sync.py``'s replay bound assumes ``max_concurrent`` episodes always in flight. The
rules every run keeps forbid that whenever the latencies have a long tail: the capacity window
(``accepted + running < (eta + v + 1) * B``) holds slots for stragglers, and an episode must be
consumed by its deadline (``eta`` versions after it started), so a batch waits for a straggler.
:func:`ideal_async_seconds` replays the same rules (the real :class:`StalenessManager`) with no
cost at all besides the episodes' latencies and a fixed train step: no controller overhead, no
pause for weight updates, no aborted or re-sent requests. The distance from it to a measured run
is the implementation's; the distance from it to the pipe bound is the cost of the rules.
"""

from __future__ import annotations

import heapq
import random
import statistics
from collections.abc import Callable

from areal_core.rollout.staleness import StalenessManager, Ticket


def ideal_async_seconds(
    *,
    steps: int,
    train_s: float,
    episode_s: Callable[[random.Random, int], float],
    batch_size: int,
    staleness: int,
    max_concurrent: int,
    seed: int = 0,
) -> float:
    """Seconds from start to the end of the last train step, each taking ``train_s``, when an
    episode started on weight version v lasts ``episode_s(rng, v)`` and episodes start the moment
    the rules let them."""
    rng = random.Random(seed)
    manager = StalenessManager(batch_size=batch_size, max_head_offpolicyness=staleness, max_concurrent=max_concurrent)
    finishing: list[tuple[float, int, Ticket]] = []  # (end time, serial, ticket), earliest first

    def top_up(now: float) -> None:
        while manager.capacity() > 0:
            ticket = manager.submit()
            heapq.heappush(finishing, (now + episode_s(rng, ticket.version), ticket.serial, ticket))

    def accept_until(end: float) -> None:
        while finishing and finishing[0][0] <= end:
            finished, _, ticket = heapq.heappop(finishing)
            manager.accept(ticket)
            top_up(finished)

    now = 0.0
    for version in range(steps):
        top_up(now)
        while (chosen := manager.select(batch_size)) is None:
            now = max(now, finishing[0][0])
            accept_until(now)
        manager.consume(chosen)
        top_up(now)
        now += train_s
        accept_until(now)
        manager.set_version(version + 1)
    return now


def ideal_async_median(repeats: int = 9, **kwargs: object) -> float:
    """The median of :func:`ideal_async_seconds` over ``repeats`` seeds (the tail makes one draw noisy)."""
    return statistics.median(ideal_async_seconds(seed=seed, **kwargs) for seed in range(repeats))  # type: ignore[arg-type]
