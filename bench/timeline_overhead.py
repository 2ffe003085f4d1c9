"""What recording the timeline costs on the quickstart, two ways, side by side in one invocation.

    python bench/timeline_overhead.py [--steps 30] [--pairs 2]

1. Direct: the "on" run's own timeline says how many spans and rollout samples each step records;
   recording and flushing that many events is timed here in a loop (median of rounds) and divided
   by the run's mean step time. This is the figure the < 1% goal is about: it does not drown in
   the machine's noise.
2. End to end: the quickstart (eval off, hf engine, FSDP2 worker) runs ``--pairs`` times with
   ``stats.timeline=true`` and ``false``, alternating; the ratio of the mean step times is printed,
   with the spread between pairs to read it against (2 shared CPU cores: a few % of noise).
"""

from __future__ import annotations

import argparse
import json
import statistics
import tempfile
import time
from pathlib import Path

from areal_core.config import load_config
from areal_core.rollout.runner import RolloutRunner
from areal_core.rollout.staleness import StalenessManager
from areal_core.timeline import TIMELINE_FILE, Timeline
from areal_core.trainer import Trainer

CONFIG = Path(__file__).resolve().parents[1] / "examples" / "quickstart" / "config.yaml"


def run(root: Path, trial: str, steps: int, timeline: bool) -> tuple[float, Path]:
    """One quickstart run; returns its mean step time (``time/step_s``) and run directory."""
    overrides = [
        f"fileroot={root}", f"trial_name={trial}", f"total_train_steps={steps}", "stats.eval_every=0",
        "stats.progress=false", "stats.sinks=[jsonl]", f"stats.timeline={str(timeline).lower()}",
    ]
    summary = Trainer(load_config(str(CONFIG), overrides)).run()
    rows = [json.loads(line) for line in (summary.run_dir / "stats.jsonl").read_text().splitlines()]
    return statistics.mean(r["time/step_s"] for r in rows), summary.run_dir


def recording_cost(spans_per_step: float, samples_per_step: float, tmp: Path, rounds: int = 200) -> float:
    """Seconds to record and flush one step's events (median over ``rounds`` steps)."""
    timeline = Timeline(tmp / TIMELINE_FILE)
    # the rollout controller's own gauge (not started: only its bookkeeping runs)
    controller = RolloutRunner(None, StalenessManager(batch_size=16, max_head_offpolicyness=2, max_concurrent=64),
                                   timeline=timeline)
    n_spans, n_samples = round(spans_per_step), round(samples_per_step)
    costs = []
    for step in range(rounds):
        start = time.perf_counter()
        for _ in range(n_spans):
            with timeline.span("minibatch", step, parent="train", index=0):
                pass
        for _ in range(n_samples):
            controller._aborted += 1  # a new state each time, so each call records
            controller._gauge()
        timeline.flush()
        costs.append(time.perf_counter() - start)
    return statistics.median(costs)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=30)
    parser.add_argument("--pairs", type=int, default=2)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="areal-bench-") as tmp:
        root = Path(tmp)
        on, off = [], []
        for pair in range(args.pairs):
            step_on, run_dir = run(root, f"on{pair}", args.steps, True)
            step_off, _ = run(root, f"off{pair}", args.steps, False)
            on.append(step_on)
            off.append(step_off)
            print(f"pair {pair + 1}: mean step {step_on * 1e3:.1f} ms with the timeline, {step_off * 1e3:.1f} ms without")
        rows = [json.loads(line) for line in (run_dir / TIMELINE_FILE).read_text().splitlines()]
        spans = sum(r["ev"] == "span" for r in rows) / args.steps
        samples = sum(r["ev"] == "rollout" for r in rows) / args.steps
        cost = recording_cost(spans, samples, root)
        mean_step = statistics.mean(on)
    print(f"\nper step: {spans:.1f} spans, {samples:.1f} rollout samples; recording + flushing them takes "
          f"{cost * 1e6:.0f} us = {100 * cost / mean_step:.3f}% of the mean step ({mean_step * 1e3:.1f} ms)")
    ratios = [a / b for a, b in zip(on, off)]
    print(f"end to end: step time with / without the timeline = {statistics.mean(on) / statistics.mean(off):.3f} "
          f"(per pair {', '.join(f'{r:.3f}' for r in ratios)}; the spread is the machine's noise)")


if __name__ == "__main__":
    main()
