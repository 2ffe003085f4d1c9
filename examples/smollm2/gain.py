"""Where a run's held-out accuracy came from: arithmetic (the gold number computed at all) or
format (the computed number being the one the reward reads: the last ``\\boxed{}``, else the
last number).

    python examples/smollm2/gain.py runs/smollm2-word-problems/trial0

Per evaluation step of ``eval_samples.jsonl``: accuracy; "computed", the share of answers where
the gold number appears anywhere; "read right", accuracy / computed (how often a computed answer is
the one read); answers with a non-empty ``\\boxed{}``; mean tokens. The gain from the first to the
last evaluation splits into the change in "computed" (arithmetic) and the change in the misses
among computed answers (format): accuracy = computed - missed.
"""

from __future__ import annotations

import argparse
import json
import re
from collections import defaultdict
from pathlib import Path

_NUMBER = re.compile(r"-?\d[\d,]*(?:\.\d+)?")
_FILLED_BOX = re.compile(r"\\boxed\{\s*[^}\s]")  # the model often writes an empty \boxed{}


def step_figures(rows: list[dict]) -> dict[str, float]:
    n = len(rows)
    computed = sum(1 for r in rows if r["answer"] in {m.replace(",", "") for m in _NUMBER.findall(r["completion"] or "")})
    boxed = sum(1 for r in rows if _FILLED_BOX.search(r["completion"] or ""))
    accuracy = sum(r["reward"] for r in rows) / n
    return {
        "accuracy": accuracy,
        "computed": computed / n,
        "missed": computed / n - accuracy,
        "boxed": boxed / n,
        "tokens": sum(r.get("output_tokens", 0) for r in rows) / n,  # a failed episode has none
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("run_dir", type=Path)
    rows = [json.loads(line) for line in (parser.parse_args().run_dir / "eval_samples.jsonl").read_text().splitlines()]
    by_step: dict[int, list[dict]] = defaultdict(list)
    for row in rows:
        by_step[row["step"]].append(row)
    figures = {step: step_figures(group) for step, group in sorted(by_step.items())}
    print(f"{'step':>5} {'accuracy':>9} {'computed':>9} {'read right':>11} {'boxed':>6} {'tokens':>7}")
    for step, f in figures.items():
        print(f"{step:>5} {f['accuracy']:>9.3f} {f['computed']:>9.3f} {f['accuracy'] / max(f['computed'], 1e-9):>11.2f} "
              f"{f['boxed']:>6.2f} {f['tokens']:>7.0f}")
    (first, a), (last, b) = next(iter(figures.items())), list(figures.items())[-1]
    gain = b["accuracy"] - a["accuracy"]
    print(f"\ngain step {first} -> {last}: {100 * gain:+.1f} points = arithmetic {100 * (b['computed'] - a['computed']):+.1f}"
          f" + format {100 * (a['missed'] - b['missed']):+.1f}")


if __name__ == "__main__":
    main()
