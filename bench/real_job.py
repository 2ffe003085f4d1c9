"""The real-model job (``examples/smollm2/config.yaml``) as the real-model benches run it: one
``areal run`` command, then its held-out evaluations read back at their wall times, and the first
to reach a target."""

from __future__ import annotations

import json
import subprocess
import time
from collections.abc import Sequence
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
CONFIG = REPO / "examples" / "smollm2" / "config.yaml"


def run_job(
    fileroot: Path, experiment: str, trial: str, overrides: list[str], config: Path = CONFIG
) -> tuple[Path, float]:
    """``areal run config`` with ``overrides``; its run directory and the wall clock it was launched at."""
    cmd = ["areal", "run", str(config), f"fileroot={fileroot}", f"experiment_name={experiment}",
           f"trial_name={trial}", "stats.progress=false", *overrides]  # fmt: skip
    launched = time.time()
    proc = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True)
    if proc.returncode != 0:
        raise RuntimeError(f"{trial} failed with code {proc.returncode}:\n{proc.stderr[-3000:]}")
    return fileroot / experiment / trial, launched


def eval_points(run_dir: Path, launched: float) -> list[tuple[int, float, float]]:
    """Each evaluation of a finished run, by step: (step, seconds from ``launched`` to its end,
    accuracy); none where the run did not evaluate (``stats.eval_every=0``)."""
    from areal_core.timeline_report import load

    samples = run_dir / "eval_samples.jsonl"
    if not samples.exists():
        return []
    rewards: dict[int, list[float]] = {}
    for line in samples.read_text().splitlines():
        row = json.loads(line)
        rewards.setdefault(row["step"], []).append(row["reward"])
    record = load(run_dir)
    ends = {s.step: record.start_unix + s.t1 - launched for s in record.spans if s.name == "eval"}
    return sorted((step, ends[step], sum(r) / len(r)) for step, r in rewards.items())


def first_reaching(points: Sequence[Sequence[float]], accuracy: float) -> tuple[int, float] | None:
    """(step, wall seconds) of the first evaluation after training starts whose held-out accuracy
    reaches ``accuracy``, in ``points`` of (step, seconds, accuracy) in step order (as ``eval_points``
    gives them); None where none did."""
    return next(((step, t) for step, t, acc in points if step > 0 and acc >= accuracy - 1e-9), None)
