"""The run's timeline: trainer phases and rollout concurrency over time, in ``RUN_DIR/timeline.jsonl``.

One JSON object per line, times in seconds since the recorder started (``perf_counter``):

- ``{"ev": "start", "unix": ..., "batch_size": ...}``: the first line of each attempt (a recovered
  run appends), with the run's facts the analysis needs;
- ``{"ev": "span", "name": ..., "step": ..., "t0": ..., "t1": ...}``: a trainer phase;
- ``{"ev": "rollout", "t": ..., "in_flight": ..., "ready": ..., "accepted": ...,
  "blocked_staleness": ..., "blocked_concurrency": ..., "paused": ..., "aborted": ...}``: the rollout
  controller's state after each change (see ``RolloutRunner._gauge`` for the fields).

Recording appends small tuples to a list under a lock; :meth:`Timeline.flush` (once per step, on
the trainer's thread) turns them into lines. ``areal timeline RUN_DIR`` draws and analyses the file
(:mod:`areal_core.timeline_report`). ``stats.timeline=false`` records nothing.
"""

from __future__ import annotations

import json
import threading
import time
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Iterator

TIMELINE_FILE = "timeline.jsonl"
ROLLOUT_FIELDS = ("in_flight", "ready", "accepted", "blocked_staleness", "blocked_concurrency", "paused", "aborted")


class Span:
    """A phase being timed; ``seconds`` is its length once the ``with`` block ends."""

    __slots__ = ("t0", "t1")

    def __init__(self, t0: float) -> None:
        self.t0, self.t1 = t0, t0

    @property
    def seconds(self) -> float:
        return self.t1 - self.t0


class Timeline:
    """Buffers events and appends them to ``path`` on :meth:`flush`; ``path=None`` keeps only the
    clock (spans are still timed, for the ``time/*`` stats, but nothing is recorded)."""

    def __init__(self, path: Path | None, **facts: Any) -> None:
        self.path = path
        self.origin = time.perf_counter()
        self._lock = threading.Lock()
        self._events: list[tuple] = []
        if path is not None:
            with path.open("a") as f:
                f.write(json.dumps({"ev": "start", "unix": time.time(), **facts}) + "\n")

    @property
    def enabled(self) -> bool:
        return self.path is not None

    @contextmanager
    def span(self, name: str, step: int, **fields: Any) -> Iterator[Span]:
        """Time the ``with`` block as phase ``name`` of ``step`` (recorded even if it raises)."""
        span = Span(time.perf_counter())
        try:
            yield span
        finally:
            span.t1 = time.perf_counter()
            self.add_span(name, step, span.t0, span.t1, **fields)

    def add_span(self, name: str, step: int, t0: float, t1: float, **fields: Any) -> None:
        """A phase measured elsewhere, from ``t0`` to ``t1`` (``perf_counter`` values)."""
        if self.path is not None:
            with self._lock:
                self._events.append(("span", name, step, t0, t1, fields))

    def rollout(self, counts: tuple[int, ...]) -> None:
        """The rollout controller's state now: one value per :data:`ROLLOUT_FIELDS` entry."""
        if self.path is not None:
            now = time.perf_counter()
            with self._lock:
                self._events.append(("rollout", now, counts))

    def flush(self) -> None:
        """Write the buffered events (call from one thread; the recorders may run meanwhile)."""
        if self.path is None:
            return
        with self._lock:
            events, self._events = self._events, []
        if not events:
            return
        origin, lines = self.origin, []
        for event in events:
            if event[0] == "span":
                _, name, step, t0, t1, fields = event
                row = {"ev": "span", "name": name, "step": step, "t0": round(t0 - origin, 6), "t1": round(t1 - origin, 6)}
                row.update(fields)
            else:
                row = {"ev": "rollout", "t": round(event[1] - origin, 6), **dict(zip(ROLLOUT_FIELDS, event[2]))}
            lines.append(json.dumps(row))
        with self.path.open("a") as f:
            f.write("\n".join(lines) + "\n")


def open_timeline(run_dir: Path, enabled: bool, batch_size: int) -> Timeline:
    """The run's recorder: appending to ``run_dir/timeline.jsonl``, or timing only when disabled."""
    return Timeline(run_dir / TIMELINE_FILE if enabled else None, batch_size=batch_size)
