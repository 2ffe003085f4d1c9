"""Stats sinks: the built-in jsonl and TensorBoard writers read back, the runner's failure
containment and resume rule (each step reaches a tracker once), and the reward plot."""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Mapping, Sequence

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from areal_core.api.stats_sink import SampleRow, SinkRun, StatsSink
from areal_core.builtin.stats_sinks.jsonl import JsonlSink
from areal_core.builtin.stats_sinks.tensorboard import TensorBoardSink
from areal_core.sink_runner import RunStats
from areal_core.stats import plot_reward_curve


def _run(tmp_path, resume_step: int = 0, **options) -> SinkRun:
    return SinkRun(run_dir=tmp_path, experiment_name="e", trial_name="t", config={"seed": 1}, options=options,
                   resume_step=resume_step)  # fmt: skip


def _row(step: int, split: str = "eval", i: int = 0) -> SampleRow:
    return SampleRow(step=step, split=split, id=str(i), prompt=f"What is {i} + 1? | x", response=f"{i + 1}\nyes",
                     reward=1.0, output_tokens=3, version=step)  # fmt: skip


def _jsonl(path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines()]


def test_jsonl_resume_drops_rows_after_the_recover_point(tmp_path):
    sink = JsonlSink(_run(tmp_path))
    sink.log_scalars(0, {"eval/accuracy": 0.2})  # before training: no training row
    for step in range(1, 6):
        sink.log_scalars(step, {"reward/mean": step / 10})
        sink.log_samples(step, [_row(step)])
    resumed = JsonlSink(_run(tmp_path, resume_step=3))
    resumed.log_scalars(4, {"reward/mean": 0.9})
    resumed.log_samples(4, [_row(4, "train")])
    stats, samples = _jsonl(tmp_path / "stats.jsonl"), _jsonl(tmp_path / "samples.jsonl")
    assert [(r["step"], r["reward/mean"]) for r in stats] == [(1, 0.1), (2, 0.2), (3, 0.3), (4, 0.9)]
    assert [(r["step"], r["split"]) for r in samples] == [(1, "eval"), (2, "eval"), (3, "eval"), (4, "train")]
    assert _jsonl(tmp_path / "samples.jsonl")[0] == _row(1).as_dict()


def _tensorboard(path):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    events = EventAccumulator(str(path), size_guidance={"scalars": 0, "tensors": 0})
    events.Reload()
    return events


def test_tensorboard_scalars_and_sample_tables_read_back_and_a_resume_purges(tmp_path):
    sink = TensorBoardSink(_run(tmp_path))
    for step in range(0, 5):
        sink.log_scalars(step, {"eval/accuracy": step / 10})
    sink.log_samples(4, [_row(4, i=0), _row(4, i=1), _row(4, "train", i=2)])
    sink.close()
    resumed = TensorBoardSink(_run(tmp_path, resume_step=2))
    resumed.log_scalars(3, {"eval/accuracy": 0.9})
    resumed.close()
    events = _tensorboard(tmp_path / "tensorboard")
    scalars = [(e.step, round(e.value, 6)) for e in events.Scalars("eval/accuracy")]
    assert scalars == [(0, 0.0), (1, 0.1), (2, 0.2), (3, 0.9)]


def test_tensorboard_sample_table_is_markdown_with_every_row(tmp_path):
    sink = TensorBoardSink(_run(tmp_path))
    sink.log_samples(2, [_row(2, i=0), _row(2, i=1), _row(2, "train", i=2)])
    sink.close()
    events = _tensorboard(tmp_path / "tensorboard")
    (evals,) = events.Tensors("samples/eval/text_summary")
    table = evals.tensor_proto.string_val[0].decode()
    assert evals.step == 2 and table.count("\n| ") == 3  # header rule + two rows
    assert "What is 1 + 1? \\| x" in table and "2<br>yes" in table
    assert len(events.Tensors("samples/train/text_summary")) == 1


class Recording(StatsSink):
    """An appending tracker kept in memory: what the runner delivers, attempt by attempt."""

    rewrites_history = False
    delivered: dict[str, list[tuple[int, dict]]] = {}
    resume_ids: list[str | None] = []

    def __init__(self, run: SinkRun) -> None:
        self.run_id = run.resume_id or f"run-{len(self.delivered)}"
        self.resume_ids.append(run.resume_id)
        self.delivered.setdefault(self.run_id, [])

    def log_scalars(self, step: int, scalars: Mapping[str, float]) -> None:
        self.delivered[self.run_id].append((step, dict(scalars)))

    def log_samples(self, step: int, rows: Sequence[SampleRow]) -> None:
        self.delivered[self.run_id].append((step, {"rows": len(rows)}))


@pytest.fixture
def recording():
    Recording.delivered, Recording.resume_ids = {}, []
    return Recording


def _attempt(tmp_path, sinks, resume_step: int, steps, report=print, timeout: float = 5.0) -> RunStats:
    stats = RunStats(sinks, _run(tmp_path, resume_step), options={}, history=[], timeout=timeout, report=report)
    for step in steps:
        stats.log_scalars(step, {"reward/mean": step / 10})
    stats.close()
    return stats


def test_a_resumed_tracker_continues_its_run_and_gets_each_step_once(tmp_path, recording):
    _attempt(tmp_path, {"rec": recording}, 0, range(0, 6))
    _attempt(tmp_path, {"rec": recording}, 3, range(4, 9))  # the recover point was step 3; 4 and 5 were sent
    assert recording.resume_ids == [None, "run-0"]
    assert [step for step, _ in recording.delivered["run-0"]] == list(range(0, 9))
    assert json.loads((tmp_path / "trackers" / "rec.json").read_text()) == {"run_id": "run-0", "last_step": 8}
    _attempt(tmp_path, {"rec": recording}, 0, range(0, 2))  # a fresh run in the same directory: a new tracker run
    assert recording.resume_ids[-1] is None and [s for s, _ in recording.delivered["run-1"]] == [0, 1]


@settings(max_examples=30, deadline=None)
@given(st.lists(st.integers(min_value=1, max_value=12), min_size=1, max_size=4))
def test_any_chain_of_recoveries_delivers_increasing_steps_once(tmp_path_factory, resume_points):
    """Attempt k resumes from the recover point ``resume_points[k]`` and runs to step 12 again:
    the tracker has one run, and it sees steps 0..12 once each, in order."""
    Recording.delivered, Recording.resume_ids = {}, []
    tmp_path = tmp_path_factory.mktemp("chain")
    _attempt(tmp_path, {"rec": Recording}, 0, range(0, 13))
    for point in resume_points:
        _attempt(tmp_path, {"rec": Recording}, point, range(point + 1, 13))
    (steps,) = [[step for step, _ in rows] for rows in Recording.delivered.values()]
    assert steps == list(range(0, 13))


class Failing(StatsSink):
    """A tracker whose server goes away at step 2."""

    def __init__(self, run: SinkRun) -> None:
        pass

    def log_scalars(self, step: int, scalars: Mapping[str, float]) -> None:
        if step == 2:
            raise ConnectionError("tracker.example unreachable")

    def local_copy(self) -> str | None:
        return "offline files in RUN_DIR/x"


class Hanging(StatsSink):
    """A tracker whose call at step 1 does not return (until the test releases it)."""

    release = threading.Event()

    def __init__(self, run: SinkRun) -> None:
        pass

    def log_scalars(self, step: int, scalars: Mapping[str, float]) -> None:
        if step == 1:
            self.release.wait(30)


def test_a_failing_sink_is_reported_once_and_the_others_keep_every_step(tmp_path, recording):
    lines: list[str] = []
    sinks = {"bad": Failing, "jsonl": JsonlSink, "rec": recording}
    stats = _attempt(tmp_path, sinks, 0, range(0, 6), report=lines.append)
    assert lines == [
        "stats sink 'bad' failed in log_scalars at step 2: ConnectionError: tracker.example unreachable; "
        "the run goes on without it (its data so far: offline files in RUN_DIR/x)"
    ]
    assert [r["step"] for r in _jsonl(tmp_path / "stats.jsonl")] == [1, 2, 3, 4, 5]
    assert [step for step, _ in recording.delivered["run-0"]] == list(range(0, 6))
    assert [row["step"] for row in stats.history] == [1, 2, 3, 4, 5]


def test_a_hanging_sink_never_holds_up_the_run_and_is_left_behind(tmp_path):
    lines: list[str] = []
    Hanging.release.clear()
    stats = RunStats({"slow": Hanging, "jsonl": JsonlSink}, _run(tmp_path), options={}, history=[], timeout=0.3,
                     report=lines.append)  # fmt: skip
    start = time.monotonic()
    stats.log_scalars(1, {"reward/mean": 0.1})
    time.sleep(0.5)
    stats.log_scalars(2, {"reward/mean": 0.2})  # the next step notices the stuck call
    stats.close()
    try:
        assert time.monotonic() - start < 3
        assert lines == [
            "stats sink 'slow' has not returned from log_scalars at step 1 for over 0.3s; the run goes on and leaves "
            "it behind at the end if it stays stuck (every step stays in stats.jsonl)",
        ]
        assert [r["step"] for r in _jsonl(tmp_path / "stats.jsonl")] == [1, 2]
    finally:
        Hanging.release.set()


def test_a_sink_that_hangs_at_the_end_costs_one_line_there(tmp_path):
    lines: list[str] = []
    Hanging.release.clear()
    stats = RunStats({"slow": Hanging}, _run(tmp_path), options={}, history=[], timeout=0.3, report=lines.append)
    start = time.monotonic()
    stats.log_scalars(1, {"reward/mean": 0.1})
    stats.close()
    try:
        assert time.monotonic() - start < 2
        assert lines == ["stats sink 'slow' did not finish within 0.3s (stuck in log_scalars at step 1); left behind"]
    finally:
        Hanging.release.set()


def test_reward_curve_png(tmp_path):
    history = [{"step": 1, "reward/mean": 0.1}, {"step": 2, "reward/mean": 0.5, "eval/accuracy": 0.4}]
    plot_reward_curve(history, tmp_path / "curve.png", "t", eval_at_start=0.2)
    assert (tmp_path / "curve.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
