"""RewardRunner with real worker processes: results, failures that score 0, timeouts, shutdown."""

from __future__ import annotations

import asyncio
import logging
import os
import signal
import time
from pathlib import Path

import pytest

import reward_fns_for_tests as fns
from areal_core.rollout.failures import FailureTracker
from areal_core.rollout.reward_runner import RewardRunner, RewardStats


def _alive(pid: int) -> bool:
    try:
        os.kill(int(pid), 0)
    except ProcessLookupError:
        return False
    return True


@pytest.fixture
def make_runner():
    runners: list[RewardRunner] = []

    def make(fn, workers: int = 1, timeout: float = 30.0) -> RewardRunner:
        failures = FailureTracker("reward calls", "reward.max_failure_rate", max_rate=1.0, window=1)
        runners.append(RewardRunner(fn, workers=workers, timeout=timeout, failures=failures))
        return runners[-1]

    yield make
    for runner in runners:
        runner.close()


def score(runner: RewardRunner, completion: str, **data) -> float:
    return asyncio.run(runner.score("p", completion, data))


def test_scores_in_a_separate_process(make_runner):
    runner = make_runner(fns.worker_pid)
    pid = score(runner, "x")
    assert pid != os.getpid()
    assert score(runner, "y") == pid  # the worker is reused
    assert runner.stats == RewardStats(calls=2, errors=0, timeouts=0)


def test_sync_and_async_rewards_get_prompt_completion_and_data(make_runner):
    assert score(make_runner(fns.completion_length), "abcd", answer="4") == 4.0
    assert score(make_runner(fns.async_length), "abc") == 3.0


def _reported(runner: RewardRunner) -> str:
    """The failures' one report line (each failure is counted there, not logged one by one)."""
    return runner.failures.report()[1] or ""


def test_exception_scores_zero_is_counted_and_reported(make_runner, caplog):
    runner = make_runner(fns.raises_on_bad)
    pid = score(runner, "good")
    with caplog.at_level(logging.INFO):
        assert score(runner, "bad") == 0.0
        assert score(runner, "bad") == 0.0
    assert caplog.records == []  # no line per failure
    assert _reported(runner) == "2 of 3 reward calls failed: ValueError: bad completion (x2)"
    assert score(runner, "good") == pid  # an exception does not cost the worker
    assert runner.stats == RewardStats(calls=4, errors=2, timeouts=0)


def test_non_finite_result_is_an_error(make_runner):
    runner = make_runner(fns.returns_nan)
    assert score(runner, "x") == 0.0
    assert runner.stats.errors == 1


def test_worker_crash_scores_zero_and_is_replaced(make_runner):
    runner = make_runner(fns.exits_on_bad)
    pid = score(runner, "good")
    assert score(runner, "bad") == 0.0
    assert "worker process died (exit code 3)" in _reported(runner)
    new_pid = score(runner, "good")
    assert new_pid != pid and not _alive(pid)
    assert runner.stats == RewardStats(calls=3, errors=1, timeouts=0)


def test_timeout_kills_the_stuck_worker_and_later_calls_proceed(make_runner, tmp_path: Path):
    runner = make_runner(fns.hangs_on_bad, workers=1, timeout=2.0)
    pid_file = tmp_path / "pid"
    assert score(runner, "bad", pid_file=str(pid_file)) == 0.0
    assert "no result within 2s" in _reported(runner)
    stuck = int(pid_file.read_text())
    assert not _alive(stuck)  # killed, so the single worker slot is free again
    assert score(runner, "good") not in (0.0, float(stuck))
    assert runner.stats == RewardStats(calls=2, errors=0, timeouts=1)


def test_a_hung_call_does_not_stop_concurrent_ones(make_runner, tmp_path: Path):
    runner = make_runner(fns.hangs_on_bad, workers=2, timeout=2.0)

    async def main():
        bad = runner.score("p", "bad", {"pid_file": str(tmp_path / "pid")})
        goods = [runner.score("p", "good", {}) for _ in range(6)]
        return await asyncio.gather(bad, *goods)

    bad, *goods = asyncio.run(main())
    stuck = int((tmp_path / "pid").read_text())
    assert bad == 0.0 and not _alive(stuck)
    assert 0.0 not in goods and float(stuck) not in goods
    assert len(set(goods)) <= 2  # never more than `workers` processes served them
    assert runner.stats == RewardStats(calls=7, errors=0, timeouts=1)


def test_unpicklable_reward_is_rejected_up_front():
    with pytest.raises(ValueError, match="module-level function"):
        RewardRunner(lambda prompt, completion, **_: 1.0, workers=1, timeout=1.0)


def test_start_reports_a_reward_that_workers_cannot_load(make_runner):
    runner = make_runner(fns.BrokenInWorkers())
    with pytest.raises(RuntimeError, match="failed to start.*cannot be loaded in a worker"):
        runner.start()


def test_close_stops_workers_and_refuses_more_calls(tmp_path: Path):
    with RewardRunner(fns.worker_pid, workers=2, timeout=30.0) as runner:
        runner.start()
        pids = {int(score(runner, "x")) for _ in range(3)}
    assert pids and not any(_alive(pid) for pid in pids)
    with pytest.raises(RuntimeError, match="closed"):
        score(runner, "x")


def test_a_worker_that_died_while_idle_is_replaced(make_runner):
    runner = make_runner(fns.worker_pid)
    pid = int(score(runner, "x"))
    os.kill(pid, signal.SIGKILL)
    deadline = time.monotonic() + 60
    while _alive(pid) and time.monotonic() < deadline:  # wait until its parent has reaped it
        time.sleep(0.01)
    assert score(runner, "x") not in (0.0, float(pid))
    assert runner.stats == RewardStats(calls=2, errors=0, timeouts=0)


def test_a_batch_keeps_per_item_failures_and_timeouts(make_runner, tmp_path: Path):
    """One message for the batch; an item that raises, kills or hangs its worker scores 0 alone,
    and the items after it run on a fresh worker."""
    runner = make_runner(fns.fails_by_completion, workers=1, timeout=2.0)
    pid_file = str(tmp_path / "pid")
    jobs = [("p", c, {"pid_file": pid_file}) for c in ("good", "raise", "good", "exit", "good", "hang", "good")]
    values = asyncio.run(runner.score_many(jobs))
    assert values[1] == values[3] == values[5] == 0.0
    first, after_exit, after_hang = values[0], values[4], values[6]
    assert values[2] == first  # an exception does not cost the worker
    assert len({first, after_exit, after_hang}) == 3 and not _alive(int(Path(pid_file).read_text()))
    assert runner.stats == RewardStats(calls=7, errors=2, timeouts=1)
    assert "3 of 7 reward calls failed" in _reported(runner)


def test_a_batch_is_split_over_the_workers_and_keeps_its_order(make_runner):
    runner = make_runner(fns.pid_and_length, workers=2)
    completions = ["a" * k for k in range(1, 8)]
    values = asyncio.run(runner.score_many([("p", c, {}) for c in completions]))
    assert [v % 1000 for v in values] == list(range(1, 8))
    assert len({v // 1000 for v in values}) <= 2  # never more than `workers` processes
    assert asyncio.run(runner.score_many([])) == []


def test_an_unpicklable_item_scores_zero_alone(make_runner):
    runner = make_runner(fns.completion_length)
    values = asyncio.run(runner.score_many([("p", "ab", {}), ("p", "abc", {"x": lambda: 0}), ("p", "abcd", {})]))
    assert values == [2.0, 0.0, 4.0]
    assert "arguments cannot be pickled" in _reported(runner)
    assert runner.stats == RewardStats(calls=3, errors=1, timeouts=0)
