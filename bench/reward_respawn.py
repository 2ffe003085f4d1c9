"""Cost of a reward that kills its worker (``os._exit``): each call then waits for a new worker.

    python bench/reward_respawn.py [--calls 20]

Runs the same RewardRunner twice, each in a fresh process: once as a run does it (the runner
made first, so the forkserver preloads the reward's module and the runner's), once with the
forkserver already started by something else (no preload: each new worker imports them). Prints
the mean seconds per failed call of each and their ratio.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import multiprocessing as mp
import os
import subprocess
import sys
import time


def exits(prompt: str, completion: str, **_: object) -> float:
    os._exit(3)


def _noop() -> None:
    pass


def _measure(calls: int, forkserver_first: bool) -> float:
    from areal_core.rollout.reward_runner import RewardRunner

    if forkserver_first:  # the forkserver starts before the runner could ask for its preload
        proc = mp.get_context("forkserver").Process(target=_noop)
        proc.start()
        proc.join()
    with RewardRunner(exits, workers=1, timeout=60.0) as runner:
        runner.start()

        async def score_all() -> None:
            for _ in range(calls):
                await runner.score("p", "c", {})

        start = time.perf_counter()
        asyncio.run(score_all())
        assert runner.stats.errors == calls
        return (time.perf_counter() - start) / calls


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--calls", type=int, default=20)
    parser.add_argument("--child", choices=["preload", "no-preload"], help=argparse.SUPPRESS)
    ns = parser.parse_args()
    if ns.child:
        print(json.dumps(_measure(ns.calls, ns.child == "no-preload")))
        return
    seconds = {}
    for mode in ("preload", "no-preload"):
        out = subprocess.run([sys.executable, __file__, "--calls", str(ns.calls), "--child", mode],
                             check=True, capture_output=True, text=True).stdout
        seconds[mode] = json.loads(out.strip().splitlines()[-1])
    for mode, s in seconds.items():
        print(f"{mode:<11} {s * 1000:8.1f} ms per call whose reward killed its worker")
    print(f"no-preload / preload: {seconds['no-preload'] / seconds['preload']:.1f}x")


if __name__ == "__main__":
    main()
