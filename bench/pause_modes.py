"""What a weight update does to requests in flight: ``rollout.pause_mode`` abort vs keep, side by side.

    python bench/pause_modes.py [--engine vllm] [--steps 30] [--repeats 3]

The quickstart job (asynchronous, ``max_head_offpolicyness`` 2, disk updates after every step; up
to 32 new tokens instead of 3, so that updates meet requests mid-decode) runs with ``abort``
(running requests end at the pause; prompt + partial output is sent again, to be prefilled again,
after the update) and ``keep`` (the servers hold them and decode on over their KV cache),
alternating, ``--repeats`` times each. Each run prints its training-loop wall time, output
tokens/s, the trainer's summed rollout wait and weight-update time, and how many episodes the
pauses cut short. The last line gives min / median / max of keep's wall time over abort's, pair
by pair (2 shared CPU cores: read the spread before the median).
"""

from __future__ import annotations

import argparse
import json
import tempfile
from pathlib import Path
from typing import Any

from spread import spread

from areal_core.config import load_config
from areal_core.timeline import TIMELINE_FILE
from areal_core.trainer import Trainer

CONFIG = Path(__file__).resolve().parents[1] / "examples" / "quickstart" / "config.yaml"
MODES = ("abort", "keep")


def run(root: Path, trial: str, engine: str, mode: str, steps: int) -> dict[str, Any]:
    overrides = [
        f"fileroot={root}", f"trial_name={trial}", f"total_train_steps={steps}", f"rollout.engine={engine}",
        f"rollout.pause_mode={mode}", "rollout.max_head_offpolicyness=2", "gconfig.max_new_tokens=32",
        "stats.eval_every=0", "stats.progress=false", "stats.sinks=[jsonl]",
    ]
    summary = Trainer(load_config(str(CONFIG), overrides)).run()
    rows = [json.loads(line) for line in (summary.run_dir / "stats.jsonl").read_text().splitlines()]
    samples = [json.loads(line) for line in (summary.run_dir / TIMELINE_FILE).read_text().splitlines()]
    return {
        "wall": summary.wall_seconds,
        "tokens_per_s": summary.output_tokens / summary.wall_seconds,
        "wait": sum(r["time/rollout_wait_s"] for r in rows),
        "update": sum(r["time/weight_update_s"] for r in rows),
        "cut_short": max((s["aborted"] for s in samples if s.get("ev") == "rollout"), default=0),
        "reward": summary.reward_last,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--engine", default="hf", help="rollout.engine (one with pause_mode keep: hf, vllm, sglang)")
    parser.add_argument("--steps", type=int, default=30)
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
    if args.repeats < 1 or args.steps < 1:
        parser.error("--steps and --repeats take at least 1")
    ratios = []
    print(f"{'repeat':>6} {'mode':>6} {'wall s':>8} {'tokens/s':>9} {'wait s':>7} {'update s':>9} {'cut short':>10} {'reward':>7}")
    with tempfile.TemporaryDirectory(prefix="areal-bench-") as tmp:
        for repeat in range(args.repeats):
            walls = {}
            for mode in MODES:
                r = run(Path(tmp), f"{mode}-{repeat}", args.engine, mode, args.steps)
                walls[mode] = r["wall"]
                print(f"{repeat + 1:>6} {mode:>6} {r['wall']:>8.1f} {r['tokens_per_s']:>9.0f} {r['wait']:>7.2f} "
                      f"{r['update']:>9.2f} {r['cut_short']:>10} {r['reward']:>7.3f}", flush=True)
            ratios.append(walls["keep"] / walls["abort"])
    print(f"\n{args.engine}: keep wall / abort wall, min / median / max of {args.repeats}: {spread(ratios, '{:.2f}', ' / ')}")


if __name__ == "__main__":
    main()
