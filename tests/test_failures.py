"""FailureTracker: the per-step report line, the run's counts and the sliding-window abort."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from areal_core.rollout.failures import FailureCounts, FailureRateError, FailureTracker, short_reason


def _tracker(max_rate: float = 0.5, window: int = 4) -> FailureTracker:
    return FailureTracker("reward calls", "reward.max_failure_rate", max_rate=max_rate, window=window)


def test_report_aggregates_reasons_and_resets_per_step():
    tracker = _tracker(max_rate=1.0)
    for reason in [None, "ValueError: x", "ValueError: x", "KeyError: 'a'", None]:
        tracker.record(reason)
    counts, line = tracker.report()
    assert (counts.failed, counts.total) == (3, 5)
    assert line == "3 of 5 reward calls failed: ValueError: x (x2); KeyError: 'a' (x1)"
    tracker.record(None)
    assert tracker.report() == (FailureCounts(0, 1), None)
    assert (tracker.run.failed, tracker.run.total) == (3, 6) and tracker.run.rate == 0.5


def test_many_kinds_of_failure_still_make_one_short_line():
    tracker = _tracker(max_rate=1.0)
    for i in range(50):
        tracker.record(f"E{i}: " + "long message " * 50)
    _, line = tracker.report()
    assert line.count("(x1)") == 3 and line.endswith("; 47 more kinds") and len(line) < 700


@given(st.lists(st.booleans(), max_size=30), st.sampled_from([0.0, 0.25, 0.5, 1.0]), st.integers(1, 6))
def test_aborts_exactly_when_the_full_window_fails_too_often(outcomes, max_rate, window):
    tracker = _tracker(max_rate, window)
    for failed in outcomes:
        tracker.record("E" if failed else None)
    last = outcomes[-window:]
    expect = len(last) == window and sum(last) > max_rate * window
    if expect:
        with pytest.raises(FailureRateError, match=r"^reward\.max_failure_rate: \d+ of the last"):
            tracker.check()
    else:
        tracker.check()


def test_the_abort_line_names_the_key_the_count_and_the_last_reason():
    tracker = _tracker(max_rate=0.5, window=2)
    tracker.record("ZeroDivisionError: division by zero")
    tracker.record("ZeroDivisionError: division by zero")
    with pytest.raises(FailureRateError) as info:
        tracker.check()
    assert str(info.value) == (
        "reward.max_failure_rate: 2 of the last 2 reward calls failed, above the limit of 50% "
        "(last: ZeroDivisionError: division by zero); fix the cause or raise reward.max_failure_rate"
    )
    assert info.value.exit_code == 2


def test_short_reason():
    assert short_reason(TimeoutError()) == "TimeoutError"
    assert short_reason(ValueError("first\nsecond")) == "ValueError: first"
