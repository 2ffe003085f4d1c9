"""``areal timeline RUN_DIR``: read ``timeline.jsonl``, find the trainer's idle gaps, draw them.

The trainer is *busy* inside a top-level phase other than ``rollout_wait`` (train, weight update,
eval, checkpoint, recover point); every other moment between its first and last phase is *idle*,
cut into gaps at the rollout waits' edges. Each gap gets a cause from the rollout controller's
state over it (time-weighted means).
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any, Iterable

import attrs

from areal_core.api.errors import ArealError
from areal_core.timeline import ROLLOUT_FIELDS, TIMELINE_FILE

WAIT = "rollout_wait"
LANES = ("rollout_wait", "train", "weight_update", "eval", "checkpoint", "recover_point")


@attrs.frozen
class SpanRow:
    name: str
    step: int
    t0: float
    t1: float
    parent: str | None = None


@attrs.frozen
class Sample:
    t: float
    values: dict[str, int]


@attrs.frozen
class Record:
    spans: list[SpanRow]
    samples: list[Sample]  # sorted by time
    batch_size: int | None = None  # episodes per batch (from the start line)
    start_unix: float | None = None  # wall clock of the first start line: span times count from it


@attrs.frozen
class Gap:
    start: float
    end: float
    step: int | None  # the step whose rollout wait the gap falls in, if any
    cause: str

    @property
    def seconds(self) -> float:
        return self.end - self.start


def load(run_dir: Path) -> Record:
    """The run's timeline; attempts of a recovered run are placed by their start's wall clock."""
    path = run_dir / TIMELINE_FILE
    if not run_dir.is_dir():
        raise ArealError(f"{run_dir}: not a directory; give the run directory (it holds {TIMELINE_FILE})")
    if not path.is_file():
        raise ArealError(f"{run_dir}: no {TIMELINE_FILE}; runs write it unless stats.timeline=false")
    lines = path.read_text().splitlines()
    spans: list[SpanRow] = []
    samples: list[Sample] = []
    first_unix = offset = batch_size = None
    for number, line in enumerate(lines, start=1):
        try:
            row = json.loads(line)
        except json.JSONDecodeError:
            if number == len(lines):  # a run killed mid-write leaves a partial last line
                break
            raise ArealError(f"{path}:{number}: not a JSON line; the file is damaged") from None
        if row.get("ev") == "start":
            first_unix = row["unix"] if first_unix is None else first_unix
            offset = row["unix"] - first_unix
            batch_size = row.get("batch_size", batch_size)
        elif offset is None:
            raise ArealError(f"{path}:{number}: an event before the first start line; the file is damaged")
        elif row.get("ev") == "span":
            spans.append(SpanRow(row["name"], row["step"], row["t0"] + offset, row["t1"] + offset, row.get("parent")))
        elif row.get("ev") == "rollout":
            samples.append(Sample(row["t"] + offset, {k: row[k] for k in ROLLOUT_FIELDS}))
    if not spans:
        raise ArealError(f"{path}: no trainer phase recorded yet; run at least one step")
    samples.sort(key=lambda s: s.t)
    return Record(spans, samples, batch_size, first_unix)


def idle_intervals(busy: Iterable[tuple[float, float]], lo: float, hi: float) -> list[tuple[float, float]]:
    """The parts of ``[lo, hi]`` that no ``busy`` interval covers, in time order."""
    out, t = [], lo
    for a, b in sorted(busy):
        if a > t:
            out.append((t, min(a, hi)))
        t = max(t, b)
        if t >= hi:
            break
    if t < hi:
        out.append((t, hi))
    return [(a, b) for a, b in out if b > a]


def mean_state(samples: list[Sample], start: float, end: float) -> dict[str, float]:
    """Time-weighted mean of each rollout field over ``[start, end]`` (a sample holds until the next)."""
    means = dict.fromkeys(ROLLOUT_FIELDS, 0.0)
    if end <= start:
        return means
    current: dict[str, int] = dict.fromkeys(ROLLOUT_FIELDS, 0)
    t = start
    for sample in samples:
        if sample.t <= start:
            current = sample.values
            continue
        if sample.t >= end:
            break
        for key in ROLLOUT_FIELDS:
            means[key] += current[key] * (sample.t - t)
        current, t = sample.values, sample.t
    for key in ROLLOUT_FIELDS:
        means[key] = (means[key] + current[key] * (end - t)) / (end - start)
    return means


def time_ready(samples: list[Sample], start: float, end: float, at_least: int) -> float:
    """Seconds of ``[start, end]`` during which ``at_least`` episodes were ready."""
    total, t, ready = 0.0, start, 0
    for sample in samples:
        if sample.t <= start:
            ready = sample.values["ready"]
            continue
        if sample.t >= end:
            break
        total += (sample.t - t) * (ready >= at_least)
        t, ready = sample.t, sample.values["ready"]
    return total + (end - t) * (ready >= at_least)


def wait_breakdown(record: Record) -> dict[str, float]:
    """The trainer's rollout waits in seconds: the first batch, the later waits while a batch's worth
    was ready (the staleness deadline holds the batch for an older episode), and the rest."""
    waits = sorted((s for s in record.spans if s.name == WAIT), key=lambda s: s.t0)
    total = sum(s.t1 - s.t0 for s in waits)
    first = waits[0].t1 - waits[0].t0 if waits else 0.0
    deadline = 0.0
    if record.batch_size is not None:
        deadline = sum(time_ready(record.samples, s.t0, s.t1, record.batch_size) for s in waits[1:])
    return {"total": total, "first batch": first, "staleness deadline": deadline, "generation": total - first - deadline}


def _cause(record: Record, start: float, end: float, first_step: int) -> tuple[int | None, str]:
    waits = [s for s in record.spans if s.name == WAIT and s.t0 < end and s.t1 > start]
    overlap = sum(min(s.t1, end) - max(s.t0, start) for s in waits)
    if overlap < 0.5 * (end - start):
        return None, "controller between phases (stats, logging, scheduling)"
    step = waits[0].step
    state = mean_state(record.samples, start, end)
    counts = f"{state['in_flight']:.1f} episodes in flight, {state['ready']:.1f} ready on average"
    return step, f"waiting for rollouts: {_reason(state, step == first_step, record.batch_size)}; {counts}"


def _reason(state: dict[str, float], first: bool, batch_size: int | None) -> str:
    if state["paused"] > 0.5:
        return "generation paused"
    if batch_size is not None and state["ready"] >= batch_size:
        return ("staleness deadline: a batch's worth is ready, but an episode this batch must take "
                "(started rollout.max_head_offpolicyness versions ago) is still decoding")
    if first:
        return "first batch: the pipe fills from empty"
    if state["blocked_concurrency"] >= 0.5:
        return f"rollout.max_concurrent_rollouts held back {state['blocked_concurrency']:.1f} episodes the staleness bound admits"
    if state["blocked_staleness"] >= 0.5:
        return (f"staleness bound (rollout.max_head_offpolicyness) held back {state['blocked_staleness']:.1f} "
                "episodes max_concurrent_rollouts admits")
    return "generation: the batch's last episodes still decoding"


def _split(a: float, b: float, cuts: list[float]) -> list[tuple[float, float]]:
    """``[a, b]`` cut at the ``cuts`` inside it (a gap is either a rollout wait or not)."""
    points = [a, *(t for t in cuts if a < t < b), b]
    return list(zip(points, points[1:]))


def find_gaps(record: Record, top: int = 3) -> list[Gap]:
    """The ``top`` longest idle gaps of the trainer, longest first, each with its cause."""
    roots = [s for s in record.spans if s.parent is None]
    lo, hi = min(s.t0 for s in roots), max(s.t1 for s in roots)
    busy = [(s.t0, s.t1) for s in roots if s.name != WAIT]
    first_step = min(s.step for s in roots)
    cuts = sorted({t for s in roots if s.name == WAIT for t in (s.t0, s.t1)})
    pieces = [piece for a, b in idle_intervals(busy, lo, hi) for piece in _split(a, b, cuts)]
    gaps = [Gap(a, b, *_cause(record, a, b, first_step)) for a, b in pieces]
    return sorted(gaps, key=lambda g: -g.seconds)[:top]


def chrome_trace(record: Record) -> dict[str, Any]:
    """Chrome trace format (open in https://ui.perfetto.dev): one thread per lane, a counter track."""
    events: list[dict[str, Any]] = []
    for lane, name in enumerate(LANES):
        events.append({"ph": "M", "name": "thread_name", "pid": 1, "tid": lane, "args": {"name": name}})
    lane_of = {name: i for i, name in enumerate(LANES)}
    for s in record.spans:
        tid = lane_of.get(s.parent or s.name, len(LANES))
        events.append({"ph": "X", "name": s.name, "pid": 1, "tid": tid, "ts": s.t0 * 1e6, "dur": (s.t1 - s.t0) * 1e6,
                       "args": {"step": s.step}})
    for sample in record.samples:
        args = {k: sample.values[k] for k in ("in_flight", "ready", "blocked_staleness", "blocked_concurrency")}
        events.append({"ph": "C", "name": "rollouts", "pid": 1, "ts": sample.t * 1e6, "args": args})
    return {"traceEvents": events, "displayTimeUnit": "ms"}


def plot(record: Record, gaps: list[Gap], out: Path) -> None:
    """Gantt of the trainer's phases above the rollout concurrency; the ``gaps`` shaded."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (top, bottom) = plt.subplots(2, 1, sharex=True, figsize=(12, 6), gridspec_kw={"height_ratios": [3, 2]})
    colors = plt.get_cmap("tab10")
    names = sorted({s.name for s in record.spans})
    color_of = {name: colors(i % 10) for i, name in enumerate(names)}
    lane_of = {name: i for i, name in enumerate(LANES)}
    for s in sorted(record.spans, key=lambda s: s.parent is not None):  # phases under their parts
        lane = lane_of.get(s.parent or s.name, len(LANES))
        height = 0.8 if s.parent is None else 0.5
        top.barh(lane, s.t1 - s.t0, left=s.t0, height=height, color=color_of[s.name], edgecolor="none")
    for gap in gaps:
        top.axvspan(gap.start, gap.end, color="red", alpha=0.15)
    top.set_yticks(range(len(LANES)), LANES)
    top.invert_yaxis()
    handles = [matplotlib.patches.Patch(color=color_of[n], label=n) for n in names]
    top.legend(handles=handles, loc="upper left", bbox_to_anchor=(1.0, 1.0), fontsize=8)
    top.set_title("trainer phases (red: the largest idle gaps)")
    if record.samples:
        ts = [s.t for s in record.samples]
        for key in ("in_flight", "ready", "blocked_staleness", "blocked_concurrency"):
            bottom.step(ts, [s.values[key] for s in record.samples], where="post", label=key)
        bottom.legend(loc="upper left", bbox_to_anchor=(1.0, 1.0), fontsize=8)
    bottom.set_ylabel("episodes")
    bottom.set_xlabel("seconds")
    bottom.grid(alpha=0.3)
    fig.tight_layout()
    _replace(out, lambda tmp: fig.savefig(tmp, dpi=110, format="png"))
    plt.close(fig)


def _replace(out: Path, write: Any) -> None:
    """Write through a temporary file so a failure leaves no half-written ``out``."""
    tmp = out.with_name(f".{out.name}.tmp")
    try:
        write(tmp)
        os.replace(tmp, out)
    finally:
        tmp.unlink(missing_ok=True)


def report(run_dir: Path, top: int = 3) -> list[str]:
    """Write ``timeline.png`` and ``timeline.trace.json`` next to the timeline; the lines to print."""
    record = load(run_dir)
    gaps = find_gaps(record, top)
    plot(record, gaps, run_dir / "timeline.png")
    trace = chrome_trace(record)
    _replace(run_dir / "timeline.trace.json", lambda tmp: tmp.write_text(json.dumps(trace)))
    lines = [f"wrote {run_dir / 'timeline.png'} and {run_dir / 'timeline.trace.json'} (Perfetto)"]
    split = wait_breakdown(record)
    lines.append(f"rollout waits {split.pop('total'):.2f}s: " + ", ".join(f"{k} {v:.2f}s" for k, v in split.items()))
    lines.append(f"largest idle gaps of the trainer ({len(gaps)}):")
    for gap in gaps:
        where = f"step {gap.step}" if gap.step is not None else "between steps"
        lines.append(f"  {gap.seconds:7.2f}s  at {gap.start:8.2f}s  {where}: {gap.cause}")
    return lines
