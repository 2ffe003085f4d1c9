"""Short quickstart runs whose rollouts or rewards fail: bounded output, counted failures, one-line abort."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest
from quickstart_runs import LAUNCHER, run_args, start

pytestmark = pytest.mark.slow

HANG_GUARD_S = 400  # only guards a hang: a run whose episodes all fail must stop by itself
WITH_TEST_REWARDS = [sys.executable, str(Path(__file__).with_name("train_with_test_rewards.py"))]


def _finish(proc) -> str:
    out, _ = proc.communicate(timeout=HANG_GUARD_S)
    assert "Traceback" not in out, out[-3000:]
    return out


def _stats(run_dir: Path) -> list[dict]:
    return [json.loads(line) for line in (run_dir / "stats.jsonl").read_text().splitlines()]


def test_every_request_timing_out_aborts_with_one_line(tmp_path, marks):
    proc = start([*LAUNCHER, *run_args(tmp_path, "timeout", "rollout.request_timeout=0.01")], marks())
    out = _finish(proc)
    assert proc.returncode == 2, out[-3000:]
    errors = [line for line in out.splitlines() if line.startswith("areal: error:")]
    assert len(errors) == 1 and "rollout.max_failure_rate" in errors[0], out[-3000:]
    assert len(out.splitlines()) < 60, out[-3000:]  # aggregated: not one line per failure


def test_a_reward_that_always_raises_is_one_line_per_step_then_aborts(tmp_path, marks):
    run_dir = tmp_path / "quickstart" / "raises"
    proc = start([*WITH_TEST_REWARDS, *run_args(tmp_path, "raises", "reward.name=always_raises")], marks())
    out = _finish(proc)
    assert proc.returncode == 2, out[-3000:]
    (error,) = [line for line in out.splitlines() if line.startswith("areal: error:")]
    assert error.startswith("areal: error: reward.max_failure_rate: ") and "ZeroDivisionError" in error
    reported = [line for line in out.splitlines() if "reward calls failed: ZeroDivisionError" in line]
    rows = _stats(run_dir)
    assert len(reported) == len(rows) and all(row["reward/error_rate"] == 1.0 for row in rows), out[-3000:]


def test_a_reward_that_cannot_load_in_its_workers_stops_the_run_before_any_server_starts(tmp_path, marks):
    proc = start([*WITH_TEST_REWARDS, *run_args(tmp_path, "broken", "reward.name=broken_in_workers")], marks())
    out = _finish(proc)
    assert proc.returncode == 2, out[-3000:]
    (error,) = [line for line in out.splitlines() if line.startswith("areal: error:")]
    assert error.startswith("areal: error: reward.name 'broken_in_workers': reward worker ") and "ImportError" in error, out
    assert "areal: starting " not in out and not (tmp_path / "quickstart" / "broken" / "stats.jsonl").exists(), out


def test_a_reward_that_kills_its_worker_is_counted_and_the_output_reads_well(tmp_path, marks):
    """Also the output without a TTY: start-up lines, a plain line per step, the summary's paths unwrapped."""
    run_dir = tmp_path / "quickstart" / "exits"
    args = run_args(tmp_path, "exits", "reward.name=always_exits", "reward.max_failure_rate=1.0",
                    "total_train_steps=2", "stats.progress=true")
    proc = start([*WITH_TEST_REWARDS, *args], marks())
    out = _finish(proc)
    assert proc.returncode == 0, out[-3000:]
    lines = out.splitlines()
    assert [line for line in lines if line.startswith("areal: starting ")], out
    assert [line for line in lines if line.startswith("areal: start-up took ")], out
    assert [line.split()[2] for line in lines if line.startswith("areal: step ")] == ["1/2", "2/2"], out
    assert "Writing model shards" not in out
    assert f"stats        {run_dir / 'stats.jsonl'} (TensorBoard: {run_dir / 'tensorboard'})" in lines, out
    assert any(line.startswith("wall ") and " start-up " in line and " training " in line for line in lines), out
    (failures,) = [line for line in lines if line.startswith("failures ")]
    # a reward that fails scores 0: the held-out episodes themselves did not fail
    assert "reward calls (100%)   " in failures and failures.endswith(" held-out episodes (0%)"), out
    assert failures.startswith("failures     0 of "), out
    assert [row["reward/error_rate"] for row in _stats(run_dir)] == [1.0, 1.0]
