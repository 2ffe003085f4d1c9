"""Off-policy corrections side by side: none / TIS / MIS / IcePop / M2PO on the quickstart task.

    python bench/offpolicy.py [--steps 250] [--staleness 8] [--seeds 3] [--engines hf,vllm]
        [--corrections none,tis,mis,icepop,m2po] [--keep DIR]

Every (engine, correction, seed) is one real ``areal run`` of ``examples/quickstart/config.yaml``
with ``rollout.max_head_offpolicyness`` raised to ``--staleness`` (the quickstart ships 2), so the
trainer sees tokens up to that many versions old as well as the engine's own numerics. Each
correction runs with the defaults of its config block (``actor.offpolicy.<name>``); ``none`` is
``actor.offpolicy.corrections=[]``. Seeds are 1, 2, 3, ...: a seed fixes the model's init, the
data and the sampling, so two corrections of one seed differ only by the correction (and by what
asynchrony's timing changes).

Per engine and correction it prints min/median/max over seeds of: the final held-out greedy
accuracy, the mean sampled reward over the steps up to 25%, 50% and 100% of the run, the mean
staleness of the batches, and over the run's steps the share of loss tokens a correction set to
0 (``masked``) or truncated, and the engine/trainer gap (``train/mismatch/*``: mean |d| over all
and over fresh tokens, the largest |d|, the k3 estimate of KL(engine || trainer)).
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
from pathlib import Path

from real_job import REPO, run_job
from spread import spread

from areal_core.builtin.stats_sinks.jsonl import STATS_FILE, read_rows

QUICKSTART = REPO / "examples" / "quickstart" / "config.yaml"
CORRECTIONS = ("none", "tis", "mis", "icepop", "m2po")


def correction_override(name: str) -> str:
    return f"actor.offpolicy.corrections=[{'' if name == 'none' else name}]"


def summarise(rows: list[dict[str, float]]) -> dict[str, float]:
    """One run's figures from its ``stats.jsonl`` rows."""
    steps = [r for r in rows if r["step"] > 0]
    n = len(steps)

    def mean(key: str, upto: int = n) -> float:
        values = [r[key] for r in steps[:upto] if key in r]
        return statistics.fmean(values) if values else float("nan")

    evals = [r["eval/accuracy"] for r in steps if "eval/accuracy" in r]
    return {
        "final_acc": evals[-1] if evals else float("nan"),
        "reward_25": mean("reward/mean", max(1, n // 4)),
        "reward_50": mean("reward/mean", max(1, n // 2)),
        "reward_100": mean("reward/mean"),
        "lag": mean("rollout/mean_lag"),
        "masked": mean("train/masked_frac"),
        "truncated": mean("train/truncated_frac"),
        "gap_mean": mean("train/mismatch/abs_mean"),
        "gap_fresh": mean("train/mismatch/fresh_abs_mean"),
        "gap_max": max((r.get("train/mismatch/abs_max", float("nan")) for r in steps), default=float("nan")),
        "kl_k3": mean("train/mismatch/kl_k3"),
    }


COLUMNS = [  # (key, header, format)
    ("final_acc", "final acc", "{:.2f}"),
    ("reward_25", "reward 0-25%", "{:.3f}"),
    ("reward_50", "reward 0-50%", "{:.3f}"),
    ("reward_100", "reward all", "{:.3f}"),
    ("lag", "mean lag", "{:.2f}"),
    ("masked", "masked", "{:.4f}"),
    ("truncated", "truncated", "{:.4f}"),
    ("gap_mean", "mean |d|", "{:.2e}"),
    ("gap_fresh", "fresh |d|", "{:.2e}"),
    ("gap_max", "max |d|", "{:.2f}"),
    ("kl_k3", "KL k3", "{:.2e}"),
]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--steps", type=int, default=250)
    parser.add_argument("--staleness", type=int, default=8)
    parser.add_argument("--seeds", type=int, default=3)
    parser.add_argument("--engines", default="hf,vllm")
    parser.add_argument("--corrections", default=",".join(CORRECTIONS))
    parser.add_argument("--keep", type=Path, default=None, help="keep the run directories under this directory")
    args = parser.parse_args(argv)
    engines = args.engines.split(",")
    corrections = args.corrections.split(",")
    unknown = sorted(set(corrections) - set(CORRECTIONS))
    if unknown:
        parser.error(f"--corrections: unknown {unknown[0]!r}; choose from {','.join(CORRECTIONS)}")
    root = args.keep or Path(tempfile.mkdtemp(prefix="offpolicy-"))
    results: dict[tuple[str, str], list[dict[str, float]]] = {}
    for engine in engines:
        for seed in range(1, args.seeds + 1):
            for name in corrections:
                trial = f"{engine}-{name}-s{seed}"
                overrides = [f"total_train_steps={args.steps}", f"seed={seed}", f"rollout.engine={engine}",
                             f"rollout.max_head_offpolicyness={args.staleness}", correction_override(name)]  # fmt: skip
                run_dir, _ = run_job(root, "offpolicy", trial, overrides, config=QUICKSTART)
                figures = summarise(read_rows(run_dir / STATS_FILE))
                results.setdefault((engine, name), []).append(figures)
                print(f"{trial}: final acc {figures['final_acc']:.2f}, reward {figures['reward_100']:.3f}, "
                      f"masked {figures['masked']:.4f}, mean |d| {figures['gap_mean']:.2e}", flush=True)  # fmt: skip
    print(f"\n{args.steps} steps, staleness {args.staleness}, seeds 1-{args.seeds} (min/median/max over seeds)")
    header = ["engine", "correction", *(h for _, h, _ in COLUMNS)]
    print("| " + " | ".join(header) + " |")
    print("|" + "---|" * len(header))
    for (engine, name), runs in results.items():
        cells = [spread([r[key] for r in runs], fmt) for key, _, fmt in COLUMNS]
        print("| " + " | ".join([engine, name, *cells]) + " |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
