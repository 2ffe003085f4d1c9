"""Asynchronous vs synchronous GRPO: the same job twice in one invocation, side by side.

    python bench/async_vs_sync.py [--steps 40] [--staleness 2] [--pause-mode abort|keep] [--repeats 3] [--keep DIR]

Part 1 runs the real system (hf server, FSDP2 worker, disk weight updates) with
``max_head_offpolicyness`` 0 and then ``--staleness``: same seed, same number of samples, a
long-tail workload (the quickstart's addition task with up to 24 new tokens: a random-init model
stops only when it happens to emit end-of-sequence). Every request's latency and length are recorded.

Part 2 repeats the comparison with ``ReplayLatencyEngine``, which replays the latencies and
lengths recorded in part 1 instead of running a model, so the controller's overlap is measured
without generation and training competing for the same 2 cores.

Each part prints wall time, tokens/s, final reward, the ideal speed-up and how close the
asynchronous run comes to it. Ideal = synchronous wall / max(train time, generation time): for the
real engine the generation time is the synchronous run's measured wait (the plain overlap bound);
for the replay engine it is the time a never-blocked pipe of in-flight episodes needs, since
asynchrony also stops waiting for stragglers. The staleness rules themselves block that pipe on a
long tail, so the replay part also prints the rules' own bound: the same async run simulated with
no cost but the recorded latencies and the synchronous run's train steps (``ideal_pipe.py``),
and what the async run's abort pauses cost, which that bound does not charge: the requests they
ended and the decoding lost (each one's token in progress).

After each part it prints the asynchronous run's rollout waits (first batch, staleness deadline,
generation) and its largest idle gaps, from its timeline (``areal timeline``). With
``--repeats N`` both parts run N times (part 2 replays part 1's recording of the same repeat) and
the min, median and max of the speed-up, of the % of bound and of part 1's final rewards close the
output; the repeats run with seeds 3, 4, 5, ..., so the synchronous run's rewards have a spread too. ``--keep DIR``
keeps the run directories (timelines included) under DIR. ``--pause-mode`` is ``rollout.pause_mode``:
what weight updates do to requests in flight (the replay engine freezes held requests as a real
server does).
"""

from __future__ import annotations

import argparse
import json
import random
import statistics
import sys
import tempfile
import time
import types
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from ideal_pipe import ideal_async_median
from replay_engine import ReplayLatencyEngine, recorded

from areal_core.api import hookimpl
from areal_core.config import load_config
from areal_core.api.engine import GenerationRequest, GenerationResponse
from areal_core.builtin.engine_hf.client import HFEngine
from areal_core.plugins import load_plugins
from areal_core.timeline_report import find_gaps, load, wait_breakdown
from areal_core.trainer import Trainer

BATCH, N_SAMPLES, MAX_CONCURRENT = 8, 8, 24
RECORDED: list[tuple[float, int]] = []  # (latency s, output tokens) of every hf request in part 1
ReplayLatencyEngine.default_sampler = recorded(RECORDED)  # part 2 replays them
REPLAY_ENGINES: list[ReplayLatencyEngine] = []  # every replay engine made, the last run's last


class RecordingHFEngine(HFEngine):
    """The real hf engine, recording each request's latency and length for the replay."""

    name = "hf-recording"

    async def agenerate_group(self, requests: Sequence[GenerationRequest]) -> list[GenerationResponse]:
        responses = await super().agenerate_group(requests)  # agenerate comes here too
        RECORDED.extend((r.latency, len(r.output_ids)) for r in responses)
        return responses


class TrackedReplayEngine(ReplayLatencyEngine):
    """The replay engine, kept in ``REPLAY_ENGINES`` so that its abort counts can be read after the run."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        REPLAY_ENGINES.append(self)


@hookimpl
def areal_register_inference_engines(register):
    register(RecordingHFEngine.name, RecordingHFEngine)
    register(ReplayLatencyEngine.name, TrackedReplayEngine)


def run_job(root: Path, trial: str, overrides: list[str]) -> dict[str, Any]:
    plugins = load_plugins(extra=[("bench-engines", types.SimpleNamespace(areal_register_inference_engines=areal_register_inference_engines))])
    config = load_config(None, [f"fileroot={root}", f"trial_name={trial}", *overrides])
    start = time.perf_counter()
    summary = Trainer(config, plugins).run()
    wall = time.perf_counter() - start
    rows = [json.loads(line) for line in (summary.run_dir / "stats.jsonl").read_text().splitlines()]
    return {
        "wall": wall,
        "loop": summary.wall_seconds,
        "tokens_per_s": summary.output_tokens / summary.wall_seconds,
        "reward": summary.reward_last,
        "gen": sum(r["time/rollout_wait_s"] for r in rows),
        "train": sum(r["time/train_s"] + r["time/weight_update_s"] for r in rows),
        "max_lag": max(r["rollout/max_lag"] for r in rows),
        "run_dir": summary.run_dir,
    }


def episode_latency(n_samples: int, trials: int = 20000) -> float:
    """Expected latency of one episode (its slowest of ``n_samples`` requests) under the recording."""
    rng = random.Random(0)
    return sum(max(rng.choice(RECORDED)[0] for _ in range(n_samples)) for _ in range(trials)) / trials


def compare(
    label: str, slug: str, root: Path, common: list[str], staleness: int, pipe_gen_s: float | None,
    steps: int = 0,
) -> dict[str, float]:
    """Run sync and async; ``pipe_gen_s`` is the rollout side's time when never blocked (None: the
    synchronous generation time, i.e. the plain overlap bound, and a real model whose rewards
    count). Returns the speed-up and % of bound, the final rewards where they count, and with
    ``steps`` (replay part) the % of the staleness rules' own bound (:mod:`ideal_pipe`)."""
    sync = run_job(root, f"{slug}-sync", [*common, "rollout.max_head_offpolicyness=0"])
    asyn = run_job(root, f"{slug}-async", [*common, f"rollout.max_head_offpolicyness={staleness}"])
    gen = sync["gen"] if pipe_gen_s is None else pipe_gen_s
    bound = sync["loop"] / max(gen, sync["train"])
    speedup = sync["loop"] / asyn["loop"]
    print(f"\n== {label} ==")
    print(f"{'':26}{'sync (0)':>12}{f'async ({staleness})':>14}")
    print(f"{'training loop wall s':26}{sync['loop']:>12.1f}{asyn['loop']:>14.1f}")
    print(f"{'tokens/s':26}{sync['tokens_per_s']:>12.0f}{asyn['tokens_per_s']:>14.0f}")
    print(f"{'final reward (last 5)':26}{sync['reward']:>12.3f}{asyn['reward']:>14.3f}")
    print(f"{'sum gen wait / train s':26}{sync['gen']:>7.1f} /{sync['train']:>4.1f}{asyn['gen']:>9.1f} /{asyn['train']:>4.1f}")
    print(f"{'max version lag':26}{sync['max_lag']:>12.0f}{asyn['max_lag']:>14.0f}")
    kind = "overlap bound: sync wall / max(sum gen, sum train)" if pipe_gen_s is None else (
        f"bound: sync wall / max(sum train, unblocked rollout time {pipe_gen_s:.1f}s)")
    print(f"async/sync speedup {speedup:.2f}x   ideal {bound:.2f}x ({kind})   async reaches {100 * speedup / bound:.0f}% of it")
    figures = {"speed-up": speedup, "% of bound": 100 * speedup / bound}
    if pipe_gen_s is None:
        figures.update({"sync final reward": sync["reward"], "async final reward": asyn["reward"]})
    if steps:
        rules_s = ideal_async_median(
            steps=steps, train_s=sync["train"] / steps, episode_s=lambda rng: max(rng.choice(RECORDED)[0] for _ in range(N_SAMPLES)),
            batch_size=BATCH, staleness=staleness, max_concurrent=MAX_CONCURRENT,
        )
        rules_bound = sync["loop"] / rules_s
        figures["% of rules' bound"] = rules_share = 100 * speedup / rules_bound
        print(f"the staleness rules' own bound {rules_bound:.2f}x (sync wall / {rules_s:.1f}s, the simulated async run with "
              f"no cost but latencies and train steps: bench/ideal_pipe.py)   async reaches {rules_share:.0f}% of it")
        engine = REPLAY_ENGINES[-1]  # the async run's: an abort pause loses what the rules' bound does not charge
        print(f"async run's aborts: {engine.aborted_segments} running requests ended by a pause, "
              f"{engine.abort_lost_s:.1f}s of their decoding lost (the token in progress of each)")
    record = load(asyn["run_dir"])
    split = wait_breakdown(record)
    print(f"async rollout waits {split.pop('total'):.2f}s: " + ", ".join(f"{k} {v:.2f}s" for k, v in split.items()))
    print("async run's largest idle gaps (areal timeline):")
    for gap in find_gaps(record):
        print(f"  {gap.seconds:6.2f}s at {gap.start:6.2f}s step {gap.step}: {gap.cause}")
    sys.stdout.flush()
    return figures


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=40)
    parser.add_argument("--staleness", type=int, default=2)
    parser.add_argument("--pause-mode", choices=("abort", "keep"), default="abort", help="rollout.pause_mode")
    parser.add_argument("--repeats", type=int, default=1)
    parser.add_argument("--keep", type=Path, default=None, help="keep the run directories under this directory")
    args = parser.parse_args()
    if args.repeats < 1:
        parser.error(f"--repeats {args.repeats}: give at least 1")
    common = [
        f"total_train_steps={args.steps}",
        f"train_dataset.batch_size={BATCH}",
        f"gconfig.n_samples={N_SAMPLES}",
        "gconfig.max_new_tokens=24",  # a random-init model stops at eos by chance: long-tail lengths
        f"rollout.max_concurrent_rollouts={MAX_CONCURRENT}",
        f"rollout.pause_mode={args.pause_mode}",
        "stats.progress=false",
        "stats.eval_every=0",
        "stats.tensorboard=false",
    ]
    results: dict[str, list[dict[str, float]]] = {"real": [], "replay": []}
    with tempfile.TemporaryDirectory(prefix="areal-bench-") as tmp:
        for repeat in range(args.repeats):
            root = (args.keep or Path(tmp)) / f"repeat{repeat}"
            if args.repeats > 1:
                print(f"\n######## repeat {repeat + 1} of {args.repeats}")
            seeded = [*common, f"seed={3 + repeat}"]
            results["real"].append(one_round(root, seeded, args))
            results["replay"].append(replay_round(root, seeded, args))
    if args.repeats > 1:
        print(f"\n== {args.repeats} repeats: min / median / max ==")
        for part, rows in results.items():
            for what in rows[0]:
                values = sorted(row[what] for row in rows)
                print(f"{part:7} {what:18} {values[0]:8.3f} / {statistics.median(values):8.3f} / {values[-1]:8.3f}")


def one_round(root: Path, common: list[str], args: argparse.Namespace) -> dict[str, float]:
    """Part 1: the real engine, recording every request for part 2."""
    RECORDED.clear()
    return compare("real hf engine + FSDP2 worker (2 CPU cores shared)", "hf", root,
                   [*common, "rollout.engine=hf-recording"], args.staleness, None)


def replay_round(root: Path, common: list[str], args: argparse.Namespace) -> dict[str, float]:
    """Part 2: the replay engine on part 1's recording."""
    lengths = sorted(n for _, n in RECORDED)
    lat = sorted(t for t, _ in RECORDED)
    print(f"recorded {len(RECORDED)} requests: length p50 {lengths[len(lengths) // 2]} p99 {lengths[int(len(lengths) * 0.99)]} "
          f"max {lengths[-1]}; latency p50 {lat[len(lat) // 2]:.2f}s p99 {lat[int(len(lat) * 0.99)]:.2f}s")
    # A latency-only engine has no compute limit: with C episodes always in flight it yields
    # N episodes in N * E[episode latency] / C seconds.
    in_flight = min(MAX_CONCURRENT, (args.staleness + 1) * BATCH)
    pipe = args.steps * BATCH * episode_latency(N_SAMPLES) / in_flight
    return compare("ReplayLatencyEngine (replays recorded latencies; no model) + FSDP2 worker", "replay", root,
                   [*common, "rollout.engine=replay-latency"], args.staleness, pipe, args.steps)


if __name__ == "__main__":
    main()
