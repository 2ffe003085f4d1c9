"""The run's timeline: recording, the idle-gap analysis, ``areal timeline`` on real and bad inputs."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from areal_core.timeline import ROLLOUT_FIELDS, TIMELINE_FILE, Timeline
from areal_core.timeline_report import (
    Record, Sample, SpanRow, find_gaps, idle_intervals, load, mean_state, wait_breakdown,
)

AREAL = [sys.executable, "-m", "areal_core.cli"]

intervals = st.lists(
    st.tuples(st.floats(0, 100, allow_nan=False), st.floats(0, 20, allow_nan=False)).map(lambda p: (p[0], p[0] + p[1])),
    max_size=12,
)


@settings(max_examples=200, deadline=None)
@given(busy=intervals, lo=st.floats(0, 50), length=st.floats(0, 80))
def test_idle_intervals_are_exactly_the_uncovered_time(busy, lo, length):
    hi = lo + length
    idle = idle_intervals(busy, lo, hi)
    assert all(lo <= a < b <= hi for a, b in idle)
    assert all(b1 <= a2 for (_, b1), (a2, _) in zip(idle, idle[1:]))  # disjoint, in time order
    assert not any(a < d and c < b for a, b in idle for c, d in busy)  # no busy moment inside a gap
    # idle + covered = the whole range (the covered part: the busy union clipped to [lo, hi])
    covered, end = 0.0, lo
    for a, b in sorted(busy):
        a, b = max(a, end), min(b, hi)
        if b > a:
            covered, end = covered + b - a, b
    assert sum(b - a for a, b in idle) + covered == pytest.approx(hi - lo, abs=1e-6)


def _sample(t: float, **values: int) -> Sample:
    return Sample(t, {**dict.fromkeys(ROLLOUT_FIELDS, 0), **values})


def test_mean_state_weights_each_value_by_how_long_it_held():
    samples = [_sample(0, in_flight=4), _sample(1, in_flight=8), _sample(3, in_flight=0)]
    assert mean_state(samples, 0, 4)["in_flight"] == pytest.approx((4 * 1 + 8 * 2 + 0 * 1) / 4)
    assert mean_state(samples, 1.5, 2.5)["in_flight"] == pytest.approx(8)


def test_gaps_longest_first_with_their_cause():
    spans = [
        SpanRow("rollout_wait", 1, 0.0, 3.0), SpanRow("train", 1, 3.0, 4.0), SpanRow("minibatch", 1, 3.0, 3.9, "train"),
        SpanRow("weight_update", 1, 4.0, 4.2),
        SpanRow("rollout_wait", 2, 4.5, 5.5), SpanRow("train", 2, 5.5, 6.0),
        SpanRow("rollout_wait", 3, 6.0, 6.8), SpanRow("train", 3, 6.8, 7.0),
    ]
    samples = [_sample(0, in_flight=8), _sample(4.5, in_flight=2, blocked_staleness=6), _sample(6.0, ready=5)]
    gaps = find_gaps(Record(spans, samples, batch_size=4), top=4)
    assert [(g.start, g.end) for g in gaps] == [(0.0, 3.0), (4.5, 5.5), (6.0, 6.8), (4.2, 4.5)]
    first, stale, deadline, between = gaps
    assert first.step == 1 and "first batch" in first.cause and "8.0 episodes in flight" in first.cause
    assert stale.step == 2 and "staleness bound" in stale.cause and "held back 6.0 episodes" in stale.cause
    assert deadline.step == 3 and "staleness deadline" in deadline.cause and "5.0 ready" in deadline.cause
    assert between.step is None and "between phases" in between.cause
    assert len(find_gaps(Record(spans, samples, batch_size=4), top=2)) == 2


def test_recorder_writes_spans_and_samples_that_load_back(tmp_path):
    timeline = Timeline(tmp_path / TIMELINE_FILE)
    with timeline.span("rollout_wait", 1) as wait:
        timeline.rollout((3, 1, 1, 0, 0, 0, 0))
    with timeline.span("train", 1):
        pass
    timeline.flush()
    with (tmp_path / TIMELINE_FILE).open("a") as f:
        f.write('{"ev": "span", "na')  # a run killed mid-write
    record = load(tmp_path)
    assert [(s.name, s.step) for s in record.spans] == [("rollout_wait", 1), ("train", 1)]
    assert record.spans[0].t1 - record.spans[0].t0 == pytest.approx(wait.seconds, abs=2e-6)
    assert record.samples[0].values["in_flight"] == 3


def test_disabled_recorder_times_but_writes_nothing(tmp_path):
    timeline = Timeline(None)
    with timeline.span("train", 1) as span:
        timeline.rollout((1,) * len(ROLLOUT_FIELDS))
    timeline.flush()
    assert span.seconds >= 0 and not list(tmp_path.iterdir())


@pytest.mark.parametrize(
    "setup, message",
    [
        (lambda d: None, "no timeline.jsonl; runs write it unless stats.timeline=false"),
        (lambda d: (d / TIMELINE_FILE).write_text('{"ev": "start", "unix": 1}\n'), "no trainer phase recorded yet"),
        (lambda d: (d / TIMELINE_FILE).write_text('{"ev": "start", "unix": 1}\nnot json\n{}\n'), ":2: not a JSON line"),
    ],
)
def test_bad_run_dir_is_one_line_exit_2(tmp_path, setup, message):
    setup(tmp_path)
    proc = subprocess.run([*AREAL, "timeline", str(tmp_path)], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2 and proc.stdout == ""
    assert proc.stderr.count("\n") == 1 and message in proc.stderr, proc.stderr
    assert sorted(p.name for p in tmp_path.iterdir()) == ([TIMELINE_FILE] if (tmp_path / TIMELINE_FILE).exists() else [])


@pytest.mark.slow
def test_a_real_run_records_its_timeline_and_areal_timeline_draws_it(uninterrupted_run):
    run_dir = uninterrupted_run.run_dir  # 4 synchronous steps, eval before step 1 and at steps 2 and 4 (tests/quickstart_runs.py)
    rows = [json.loads(line) for line in (run_dir / TIMELINE_FILE).read_text().splitlines()]
    spans = [r for r in rows if r["ev"] == "span"]
    names = {(s["name"], s["step"]) for s in spans}
    for step in range(1, 5):
        for name in ("rollout_wait", "train", "minibatch", "rpc", "weight_update", "weight_stage", "pause", "weight_load", "resume"):
            assert (name, step) in names, (name, step)
    assert {s["step"] for s in spans if s["name"] == "eval"} == {0, 2, 4}  # 0: stats.eval_at_start
    assert ("checkpoint", 4) in names
    assert all(s["t1"] >= s["t0"] for s in spans)
    # the time/* stats are the spans' lengths
    stats = [json.loads(line) for line in (run_dir / "stats.jsonl").read_text().splitlines()]
    for key, name in (("time/rollout_wait_s", "rollout_wait"), ("time/train_s", "train"), ("time/weight_update_s", "weight_update")):
        lengths = [s["t1"] - s["t0"] for s in sorted(spans, key=lambda s: s["step"]) if s["name"] == name]
        assert [row[key] for row in stats] == pytest.approx(lengths, abs=1e-5)
    samples = [r for r in rows if r["ev"] == "rollout"]
    assert max(r["in_flight"] for r in samples) == 4  # synchronous: one batch of 4 episodes at a time
    assert samples[-1]["accepted"] >= 16 and any(r["paused"] for r in samples)

    proc = subprocess.run([*AREAL, "timeline", str(run_dir)], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert "largest idle gaps of the trainer (3):" in proc.stdout and "waiting for rollouts" in proc.stdout
    assert (run_dir / "timeline.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    trace = json.loads((run_dir / "timeline.trace.json").read_text())["traceEvents"]
    assert {e["name"] for e in trace if e["ph"] == "X"} >= {"rollout_wait", "minibatch", "weight_load"}
    assert any(e["ph"] == "C" for e in trace)


def test_wait_breakdown_splits_first_batch_deadline_and_generation():
    spans = [SpanRow("rollout_wait", 1, 0.0, 1.0), SpanRow("rollout_wait", 2, 2.0, 3.0)]
    samples = [_sample(0.0), _sample(2.5, ready=4)]  # step 2: a batch's worth ready from 2.5 s on
    split = wait_breakdown(Record(spans, samples, batch_size=4))
    assert split == pytest.approx({"total": 2.0, "first batch": 1.0, "staleness deadline": 0.5, "generation": 0.5})


@pytest.mark.parametrize("eta, max_concurrent", [(0, 8), (1, 3), (2, 5)])
def test_rollout_gauge_follows_the_limits_through_steps_and_pauses(tmp_path, eta, max_concurrent):
    from rollout_doubles import ScriptedEngine
    from test_rollout_controller import GroupWorkflow, _items

    from areal_core.rollout.runner import RolloutRunner
    from areal_core.rollout.dataloader import PromptLoader
    from areal_core.rollout.staleness import StalenessManager

    batch = 2
    timeline = Timeline(tmp_path / TIMELINE_FILE, batch_size=batch)
    staleness = StalenessManager(batch_size=batch, max_head_offpolicyness=eta, max_concurrent=max_concurrent)
    loader = PromptLoader(_items(20), shuffle=False)
    with RolloutRunner(ScriptedEngine(delay=lambda r: 0.002), staleness, timeline=timeline) as ctl:
        for version in range(1, 5):
            ctl.prepare_batch(loader, GroupWorkflow(), timeout=60)
            ctl.pause()
            ctl.set_version(version)
            ctl.resume()
    timeline.flush()
    with (tmp_path / TIMELINE_FILE).open("a") as f:  # `load` wants a trainer phase; a controller records none
        f.write(json.dumps({"ev": "span", "name": "train", "step": 1, "t0": 0, "t1": 0}) + "\n")
    samples = [s.values for s in load(tmp_path).samples]
    window = (eta + 1) * batch  # unconsumed episodes one version admits
    for s in samples:
        assert s["in_flight"] <= max_concurrent and s["in_flight"] + s["ready"] <= window
        assert s["blocked_staleness"] * s["blocked_concurrency"] == 0  # one limit binds at a time
        assert s["blocked_concurrency"] <= max(0, window - max_concurrent)
        assert s["blocked_staleness"] <= max_concurrent - s["in_flight"]
    assert max(s["in_flight"] for s in samples) == min(max_concurrent, window)
    assert [s["accepted"] for s in samples] == sorted(s["accepted"] for s in samples)
    assert any(s["paused"] for s in samples) and not samples[-1]["paused"]
    assert [s["aborted"] for s in samples] == sorted(s["aborted"] for s in samples)  # cumulative


def test_a_recovered_runs_attempts_follow_each_other_by_wall_clock(tmp_path):
    rows = [
        {"ev": "start", "unix": 1000.0, "batch_size": 2},
        {"ev": "span", "name": "train", "step": 1, "t0": 1.0, "t1": 2.0},
        {"ev": "start", "unix": 1010.0, "batch_size": 2},  # restarted 10 s later, its clock from 0
        {"ev": "span", "name": "train", "step": 2, "t0": 1.0, "t1": 2.0},
        {"ev": "rollout", "t": 0.5, **dict.fromkeys(ROLLOUT_FIELDS, 1)},
    ]
    (tmp_path / TIMELINE_FILE).write_text("".join(json.dumps(r) + "\n" for r in rows))
    record = load(tmp_path)
    assert [(s.step, s.t0, s.t1) for s in record.spans] == [(1, 1.0, 2.0), (2, 11.0, 12.0)]
    assert [s.t for s in record.samples] == [10.5] and record.batch_size == 2
