"""Asynchronous vs synchronous GRPO on the real job (issue 44): SmolLM2-135M-Instruct, word problems.

    python bench/async_vs_sync_real.py [--steps 60] [--repeats 3] [--staleness 1]
        [--layouts split shared] [--first-seed 1] [--out DIR] [--set KEY=VALUE ...]

The job is ``examples/smollm2/config.yaml`` as the README runs it (vLLM-CPU server, bf16, 4 prompts
x 8 samples, 128 new tokens), in two layouts of this machine's cores:

- ``split``: the layout AReaL uses with separate GPUs, one core each: the inference server pinned to
  the first CPU and the trainer to the second (``rollout.cpus`` / ``actor.cpus``), one thread each;
- ``shared``: both on every core with 2 threads each, as the example runs (the processes contend).

Each layout runs synchronously (``rollout.max_head_offpolicyness: 0``) and asynchronously
(``--staleness``, by default 1: on this job 2 cost accuracy by step 30) on the same seed, one run
at a time. Printed per run: seconds per training step, the step's split into generation wait and
training, held-out greedy accuracy before -> after, and the wall seconds to the target accuracy
(``--gain`` over the synchronous run's accuracy before training, the same for both modes of a seed):
from launch (start-up included), and from the end of the evaluation before training (start-up and
that evaluation are the same work in both modes). Then per layout the speed-up (synchronous
seconds per step / asynchronous), the overlap bound from the synchronous run: (generation +
training) / max(generation, training) per step, with the share of the bound reached, and the
speed-up in time to the target (synchronous seconds / asynchronous, both clocks); with
``--repeats`` N, min/median/max over seeds ``--first-seed``... Answers shorten over
the first steps, and an asynchronous run samples from weights up to ``--staleness`` steps older,
so its steps carry longer answers (more work); the speed-up in answer tokens per second (sampled
and trained) is printed beside the one per step.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import re
import statistics
from pathlib import Path

from real_job import CONFIG, REPO, eval_points, first_reaching, run_job
from spread import spread

EXPERIMENT = "async_vs_sync_real"
LAYOUTS = {
    "split": ["rollout.cpus=[0]", "actor.cpus=[1]", "rollout.threads_per_server=1", "actor.threads_per_worker=1"],
    "shared": ["rollout.threads_per_server=2", "actor.threads_per_worker=2"],
}


RESULT_KEYS = {"step_s", "wait_s", "train_s", "answer_tokens", "curve"}


def run(layout: str, staleness: int, seed: int, steps: int, out: Path, extra: list[str]) -> dict:
    """One run of the job; its per-step timings and accuracy curve (wall seconds from launch)."""
    cpus = sorted(os.sched_getaffinity(0))
    pins = [p.replace("[0]", f"[{cpus[0]}]").replace("[1]", f"[{cpus[-1]}]") for p in LAYOUTS[layout]]
    overrides = [f"seed={seed}", f"total_train_steps={steps}", f"rollout.max_head_offpolicyness={staleness}", *pins, *extra]
    run_dir, launched = run_job(out, EXPERIMENT, f"{layout}-k{staleness}-seed{seed}", overrides)
    rows = [json.loads(line) for line in (run_dir / "stats.jsonl").read_text().splitlines()]
    rest = rows[1:]  # the first step also holds the first generation and the servers' warm-up
    return {  # RESULT_KEYS
        "step_s": statistics.mean(r["time/step_s"] for r in rest),
        "wait_s": statistics.mean(r["time/rollout_wait_s"] for r in rest),
        "train_s": statistics.mean(r["time/train_s"] + r["time/weight_update_s"] for r in rest),
        "answer_tokens": statistics.mean(r["perf/output_tokens"] for r in rest),
        "curve": eval_points(run_dir, launched),
    }


def finished(path: Path) -> dict | None:
    """A finished run's result, or None: not run yet, or written by an older version of this bench."""
    if not path.exists():
        return None
    result = json.loads(path.read_text())
    if RESULT_KEYS - result.keys():
        print(f"{path.name}: from an older version of this bench (no {sorted(RESULT_KEYS - result.keys())}); rerunning")
        return None
    return result


def before(result: dict) -> float:
    """Held-out accuracy before training (NaN for a run that did not evaluate): the synchronous
    run's is the target's base for both modes of a seed."""
    return result["curve"][0][2] if result["curve"] else math.nan


def time_to_target(curve: list[list[float]], accuracy: float) -> tuple[float, float]:
    """Wall seconds to the first evaluation after training starts that reaches ``accuracy``: from
    launch, and from the end of the evaluation before training; NaN where no evaluation reached it."""
    hit = first_reaching(curve, accuracy)
    if hit is None:
        return math.nan, math.nan
    return hit[1], hit[1] - curve[0][1]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=60)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--first-seed", type=int, default=1)
    parser.add_argument("--staleness", type=int, default=1, help="max_head_offpolicyness of the asynchronous runs")
    parser.add_argument("--gain", type=float, default=0.15,
                        help="the target: this much held-out accuracy over the synchronous run's before training")
    parser.add_argument("--layouts", nargs="+", choices=tuple(LAYOUTS), default=list(LAYOUTS))
    parser.add_argument("--out", type=Path, default=REPO / "runs" / EXPERIMENT, help="runs and results")
    parser.add_argument("--set", nargs="*", default=[], metavar="KEY=VALUE",
                        help="overrides for every run, e.g. stats.eval_every=0 to time steps only")
    opts = parser.parse_args()
    if opts.steps < 2 or opts.repeats < 1 or opts.staleness < 1:
        parser.error("--steps takes at least 2, --repeats and --staleness at least 1")
    opts.out.mkdir(parents=True, exist_ok=True)
    results: dict[tuple[str, int, int], dict] = {}
    for seed in range(opts.first_seed, opts.first_seed + opts.repeats):
        for layout in opts.layouts:
            for staleness in (0, opts.staleness):
                overrides = "".join("-" + re.sub(r"[^\w.=,-]+", "_", o) for o in opts.set)  # a path's / too
                done = opts.out / f"{layout}-k{staleness}-seed{seed}-{opts.steps}{overrides}.json"
                result = finished(done)  # a rerun with the same --out skips finished runs
                if result is None:
                    print(f"seed {seed} {layout} max_head_offpolicyness={staleness} ...", flush=True)
                    result = run(layout, staleness, seed, opts.steps, opts.out, opts.set)
                    done.write_text(json.dumps(result))
                results[layout, staleness, seed] = result
    seeds = range(opts.first_seed, opts.first_seed + opts.repeats)
    print(f"\njob: {CONFIG.relative_to(REPO)}, {opts.steps} steps; asynchronous: max_head_offpolicyness="
          f"{opts.staleness}; seconds per step from step 2 on\n")
    print(f"{'layout':<8}{'mode':<7}{'seed':>5}{'s/step':>8}{'wait s':>8}{'train s':>9}{'answer tok':>11}"
          f"{'before':>8}{'after':>7}{'target':>8}{'s to target: launch / training':>32}")
    target = {(layout, s): before(results[layout, 0, s]) + opts.gain for layout in opts.layouts for s in seeds}
    for layout in opts.layouts:
        for staleness in (0, opts.staleness):
            for seed in seeds:
                r = results[layout, staleness, seed]
                accuracy = f"{r['curve'][0][2]:>8.3f}{r['curve'][-1][2]:>7.3f}" if r["curve"] else f"{'-':>8}{'-':>7}"
                launch, training = time_to_target(r["curve"], target[layout, seed])
                print(f"{layout:<8}{'sync' if staleness == 0 else 'async':<7}{seed:>5}{r['step_s']:>8.1f}"
                      f"{r['wait_s']:>8.1f}{r['train_s']:>9.1f}{r['answer_tokens']:>11.0f}{accuracy}"
                      f"{target[layout, seed]:>8.3f}{f'{launch:.0f} / {training:.0f}':>32}")
    print("\nper layout, over seeds (min/median/max): speed-up = sync s/step / async s/step; bound = the sync "
          "run's (wait + train) / max(wait, train)")
    for layout in opts.layouts:
        sync = [results[layout, 0, s] for s in seeds]
        fast = [results[layout, opts.staleness, s] for s in seeds]
        speedup = [a["step_s"] / b["step_s"] for a, b in zip(sync, fast)]
        bound = [(a["wait_s"] + a["train_s"]) / max(a["wait_s"], a["train_s"]) for a in sync]
        share = [s / b for s, b in zip(speedup, bound)]
        per_token = [(b["answer_tokens"] / b["step_s"]) / (a["answer_tokens"] / a["step_s"]) for a, b in zip(sync, fast)]
        to_target = [  # [seed][from launch, from training]; NaN where a mode missed the target
            [a / b for a, b in zip(time_to_target(x["curve"], goal), time_to_target(y["curve"], goal))]
            for x, y, goal in zip(sync, fast, (target[layout, s] for s in seeds))
        ]
        print(f"  {layout:<7} speed-up {spread(speedup, '{:.2f}')}, bound {spread(bound, '{:.2f}')}, "
              f"share of bound {spread(share, '{:.2f}')} (goal: speed-up >= 1.5 and >= 0.90 of the bound); "
              f"in answer tokens per second {spread(per_token, '{:.2f}')}; in time to the target "
              f"{spread([t[0] for t in to_target], '{:.2f}')} from launch, "
              f"{spread([t[1] for t in to_target], '{:.2f}')} from the start of training")
    if {"split", "shared"} <= set(opts.layouts):  # what the example ships (sync, shared) against async, split
        ratio = [results["shared", 0, s]["step_s"] / results["split", opts.staleness, s]["step_s"] for s in seeds]
        print(f"  sync shared s/step / async split s/step: {spread(ratio, '{:.2f}')}")

if __name__ == "__main__":
    main()
