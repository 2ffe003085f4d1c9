"""Freeing a taken batch: the rollout loop's longest stall, all at once against one trajectory at a time.

    python bench/batch_free.py [--episodes 8192] [--samples 4] [--tokens 260] [--repeats 3]

A batch (``episodes`` x ``samples`` trajectories of ``tokens`` tokens: ids from a 150k
vocabulary, distinct log-probs, versions) is freed while the rollout loop runs on its own thread.
Dropping the last reference frees every list and number inside one C call, holding the GIL;
``free_in_turns`` (``areal_core.controller_tuning``, what the controller's GC clock does with
the batch the trainer hands over during a weight update) frees them one trajectory at a time. Under the controller's
interpreter settings, a probe on an asyncio loop in another thread sleeps 1 ms again and again
and records how late each wake-up comes while the batch is freed. Printed per way: the free's
wall time and the probe's longest and p99 lateness; the repeats alternate the two ways.
"""

from __future__ import annotations

import argparse
import asyncio
import random
import statistics
import threading
import time
from collections.abc import Callable

from areal_core.api.trajectory import Trajectory
from areal_core.controller_tuning import controller_tuning, free_in_turns

PROBE_SLEEP_S = 0.001


def build_batch(episodes: int, samples: int, tokens: int, rng: random.Random) -> list[Trajectory]:
    prompt = tokens // 4
    batch: list[Trajectory] = []
    for e in range(episodes * samples):
        ids = [rng.randrange(150_000) for _ in range(tokens)]
        mask = [0] * prompt + [1] * (tokens - prompt)
        logprobs = [0.0] * prompt + [-rng.random() * 5 for _ in range(tokens - prompt)]
        versions = [-1] * prompt + [1000 + e % 3] * (tokens - prompt)
        batch.append(Trajectory(uid=f"u{e}", prompt_id=f"p{e // samples}", input_ids=ids, loss_mask=mask,
                                logprobs=logprobs, versions=versions, reward=0.0))
    return batch


class Probe:
    """An asyncio loop on its own thread: 1 ms sleeps, recording each wake-up's lateness while on."""

    def __init__(self) -> None:
        self.late: list[float] = []
        self.recording = False
        self._stop = False
        self._thread = threading.Thread(target=lambda: asyncio.run(self._run()), daemon=True)

    async def _run(self) -> None:
        while not self._stop:
            start = time.perf_counter()
            await asyncio.sleep(PROBE_SLEEP_S)
            if self.recording:
                self.late.append(time.perf_counter() - start - PROBE_SLEEP_S)

    def __enter__(self) -> Probe:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop = True
        self._thread.join()


def free_once(batch: list[Trajectory]) -> None:
    batch.clear()  # what dropping the last reference does: everything inside one C call


def measure(way: Callable[[list[Trajectory]], None], batch: list[Trajectory]) -> dict[str, float]:
    with Probe() as probe:
        time.sleep(0.1)
        probe.recording = True
        start = time.perf_counter()
        way(batch)
        seconds = time.perf_counter() - start
        if batch:
            raise RuntimeError(f"{way.__name__} left {len(batch)} trajectories in the batch")
        time.sleep(0.05)  # the wake-up that was due during the free still counts
        probe.recording = False
    late = sorted(probe.late)
    return {"free_s": seconds, "max_ms": 1e3 * late[-1], "p99_ms": 1e3 * late[int(0.99 * (len(late) - 1))]}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--episodes", type=int, default=8192)
    parser.add_argument("--samples", type=int, default=4)
    parser.add_argument("--tokens", type=int, default=260)
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
    ways = {"all at once": free_once, "free_in_turns": free_in_turns}
    results: dict[str, list[dict[str, float]]] = {name: [] for name in ways}
    rng = random.Random(0)
    with controller_tuning():
        for repeat in range(args.repeats):
            for name, way in ways.items():
                batch = build_batch(args.episodes, args.samples, args.tokens, rng)
                results[name].append(row := measure(way, batch))
                print(f"repeat {repeat + 1} {name:>13}: free {row['free_s']:.3f} s, "
                      f"loop late max {row['max_ms']:.1f} ms, p99 {row['p99_ms']:.2f} ms", flush=True)
    print("\nmin / median / max over the repeats")
    for name, rows in results.items():
        cells = []
        for key, label in (("free_s", "free s"), ("max_ms", "loop late max ms"), ("p99_ms", "p99 ms")):
            values = sorted(r[key] for r in rows)
            cells.append(f"{label} {values[0]:.3g}/{statistics.median(values):.3g}/{values[-1]:.3g}")
        print(f"{name:>13}: " + ", ".join(cells))
    once, turns = (statistics.median(r["max_ms"] for r in results[n]) for n in ways)
    print(f"longest loop stall, median: all at once / in turns = {once / turns:.1f}x")


if __name__ == "__main__":
    main()
