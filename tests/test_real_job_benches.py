"""The real-model benches' bookkeeping (bench/vs_trl_smollm2.py, bench/async_vs_sync_real.py): a
run's evaluations read back at their wall times, and the first one to reach a target."""

from __future__ import annotations

import json
import math
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "bench"))
from async_vs_sync_real import time_to_target  # noqa: E402
from real_job import first_reaching  # noqa: E402
from vs_trl_smollm2 import curve_summary, ours_points  # noqa: E402


def _write_run(run_dir: Path, start_unix: float) -> None:
    run_dir.mkdir(parents=True)
    samples = [(0, 0.0), (0, 1.0), (0, 0.0), (0, 0.0), (2, 1.0), (2, 1.0), (2, 0.0), (2, 1.0)]
    (run_dir / "eval_samples.jsonl").write_text("".join(json.dumps({"step": s, "reward": r}) + "\n" for s, r in samples))
    events = [{"ev": "start", "unix": start_unix}, {"ev": "span", "name": "train", "step": 1, "t0": 5.0, "t1": 9.0},
              {"ev": "span", "name": "eval", "step": 0, "t0": 0.1, "t1": 4.0},
              {"ev": "span", "name": "eval", "step": 2, "t0": 20.0, "t1": 26.5}]  # fmt: skip
    (run_dir / "timeline.jsonl").write_text("".join(json.dumps(e) + "\n" for e in events))
    (run_dir / "stats.jsonl").write_text("".join(json.dumps({"time/step_s": s}) + "\n" for s in (7.0, 9.0)))


def test_a_runs_evaluations_are_read_at_their_wall_time_from_launch(tmp_path):
    _write_run(tmp_path / "run", start_unix=1000.0)
    points, per_step = ours_points(tmp_path / "run", launched=960.0)  # 40 s of start-up before the timeline
    assert sorted(points) == [(0, 44.0, 0.25), (2, 66.5, 0.75)]
    assert per_step == 8.0


def test_the_target_is_the_start_plus_the_gain_and_the_first_evaluation_reaching_it_counts():
    points = [(0, 40.0, 0.25), (15, 400.0, 0.375), (30, 700.0, 0.40), (45, 1000.0, 0.45), (60, 1300.0, 0.38)]
    hit = curve_summary(points, 0.15, 20.0)
    assert (hit["before"], hit["after"], hit["steps_to_target"], hit["seconds_to_target"]) == (0.25, 0.38, 30, 700.0)
    missed = curve_summary(points, 0.25, 20.0)
    assert missed["steps_to_target"] is None and missed["seconds_to_target"] is None
    assert first_reaching([list(p) for p in points], 0.45) == (45, 1000.0)
    assert first_reaching([list(p) for p in points], 0.25) == (15, 400.0)  # step 0 never counts
    assert first_reaching([list(p) for p in points], 0.9) is None


def test_the_time_to_a_target_counts_from_launch_and_from_the_evaluation_before_training():
    curve = [[0, 40.0, 0.25], [15, 400.0, 0.375], [30, 700.0, 0.40]]
    assert time_to_target(curve, 0.39) == (700.0, 660.0)
    assert all(math.isnan(t) for t in time_to_target(curve, 0.5) + time_to_target([], 0.3))
