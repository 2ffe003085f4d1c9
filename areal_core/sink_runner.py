"""The run's side of ``stats.sinks``: every sink in a thread of its own, failures contained.

Training never waits on a sink. Each event goes onto the sink's queue; its thread builds the sink
and calls it in order. A sink that raises is reported in one line and dropped; one that stays in a
call longer than ``stats.sink_timeout`` is reported once, and at the end it is left behind instead
of holding up the run's exit. Where a sink keeps its data on disk, the line says where.

A tracker that only appends (``rewrites_history = False``) has its run id and last step kept in
``RUN_DIR/trackers/<name>.json``: a recovered run continues the same tracker run and skips the steps
it had already sent, so none appears twice.
"""

from __future__ import annotations

import json
import os
import queue
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

import attrs

from areal_core.api.stats_sink import SampleRow, SinkRun, StatsSink

TRACKERS_DIR = "trackers"
_CLOSE = object()


@attrs.frozen
class _State:
    """What an appending tracker left in the run directory: its run id and the last step it took."""

    run_id: str | None = None
    last_step: int = 0

    @staticmethod
    def load(path: Path) -> _State:
        if not path.exists():
            return _State()
        data = json.loads(path.read_text())
        return _State(data.get("run_id"), int(data.get("last_step", 0)))

    def save(self, path: Path) -> None:
        tmp = path.with_name(f".{path.name}.tmp")
        tmp.write_text(json.dumps(attrs.asdict(self)))
        os.replace(tmp, path)


class SinkWorker:
    """One sink behind a queue and a daemon thread; reports its first failure and goes quiet."""

    def __init__(
        self,
        name: str,
        cls: type[StatsSink],
        run: SinkRun,
        *,
        timeout: float,
        report: Callable[[str], None],
        jsonl_beside: bool = False,
    ) -> None:
        self.name, self.cls, self.timeout, self._report = name, cls, timeout, report
        self.jsonl_beside = jsonl_beside  # whether the jsonl sink runs too: then every step is in stats.jsonl
        self.state_path = run.run_dir / TRACKERS_DIR / f"{name}.json"
        resumed = run.resume_step > 0 and not cls.rewrites_history
        state = _State.load(self.state_path) if resumed else _State()
        self.run = attrs.evolve(run, resume_id=state.run_id)
        self.skip_through = state.last_step if resumed else -1  # steps the earlier attempt sent
        self.sink: StatsSink | None = None
        self.failed = False
        self._stuck_reported = False
        self._busy: tuple[float, str] | None = None  # (since, what) while a call runs
        self._queue: queue.SimpleQueue = queue.SimpleQueue()
        self._thread = threading.Thread(target=self._serve, name=f"stats-sink-{name}", daemon=True)
        self._thread.start()

    # ------------------------------------------------------------------ the run's side
    def put(self, method: str, step: int, payload: Any) -> None:
        if self.failed:
            return
        if step <= self.skip_through:
            return  # sent by the earlier attempt of this run; the tracker cannot take it twice
        self._queue.put((method, step, payload))
        self.check_stuck()

    def check_stuck(self) -> None:
        busy = self._busy
        if busy is None or self._stuck_reported or self.failed:
            return
        since, what = busy
        if time.monotonic() - since > self.timeout:
            self._stuck_reported = True
            self._report(f"stats sink {self.name!r} has not returned from {what} for over {self.timeout:g}s; "
                         f"the run goes on and leaves it behind at the end if it stays stuck{self._where()}")  # fmt: skip

    def close(self) -> None:
        """Ask the thread to finish what is queued and close the sink; wait up to ``timeout``, then
        leave it behind (reported here unless its hang was reported already)."""
        self._queue.put(_CLOSE)
        self._thread.join(self.timeout)
        if self._thread.is_alive() and not (self.failed or self._stuck_reported):
            busy = self._busy
            doing = f" (stuck in {busy[1]})" if busy else ""
            self._report(f"stats sink {self.name!r} did not finish within {self.timeout:g}s{doing}; "
                         f"left behind{self._where()}")  # fmt: skip

    # ------------------------------------------------------------------ the sink's thread
    def _serve(self) -> None:
        if not self._call("starting", lambda: self._build()):
            return
        while (event := self._queue.get()) is not _CLOSE:
            method, step, payload = event
            if not self._call(f"{method} at step {step}", lambda: getattr(self.sink, method)(step, payload)):
                return
            if method == "log_scalars" and not self.cls.rewrites_history:
                _State(self.sink.run_id, step).save(self.state_path)
        self._call("close", lambda: self.sink.close())

    def _build(self) -> None:
        self.sink = self.cls(self.run)
        if not self.cls.rewrites_history:
            self.state_path.parent.mkdir(exist_ok=True)
            _State(self.sink.run_id, max(self.skip_through, 0)).save(self.state_path)

    def _call(self, what: str, fn: Callable[[], None]) -> bool:
        self._busy = (time.monotonic(), what)
        try:
            fn()
        except Exception as exc:  # noqa: BLE001 - a tracker's failure must not stop training
            self.failed = True
            self._report(f"stats sink {self.name!r} failed in {what}: {type(exc).__name__}: {exc}; "
                         f"the run goes on without it{self._where()}")  # fmt: skip
            return False
        finally:
            self._busy = None
        return True

    def _where(self) -> str:
        copy = self.sink.local_copy() if self.sink is not None else None
        if copy:
            return f" (its data so far: {copy})"
        return " (every step stays in stats.jsonl)" if self.jsonl_beside else ""


class RunStats:
    """The run's stats: the history it summarises and plots, and the selected sinks (each with its
    ``options``: the config's ``plugins.<name>`` section)."""

    def __init__(
        self,
        sinks: Mapping[str, type[StatsSink]],
        run: SinkRun,
        *,
        options: Mapping[str, Any],
        history: list[dict[str, Any]],
        timeout: float,
        report: Callable[[str], None],
    ) -> None:
        self.history = history
        self.workers = [
            SinkWorker(name, cls, attrs.evolve(run, options=dict(options.get(name) or {})), timeout=timeout,
                       report=report, jsonl_beside="jsonl" in sinks and name != "jsonl")
            for name, cls in sinks.items()
        ]  # fmt: skip
        self.takes_tables = any(cls.takes_tables for cls in sinks.values())

    def log_scalars(self, step: int, scalars: Mapping[str, float]) -> None:
        """Step ``step``'s scalars to every sink; steps from 1 are the history's rows."""
        if step > 0:
            self.history.append({"step": step, **scalars})
        for worker in self.workers:
            worker.put("log_scalars", step, dict(scalars))

    def log_samples(self, step: int, rows: Sequence[SampleRow]) -> None:
        if rows:
            for worker in self.workers:
                if worker.cls.takes_tables:
                    worker.put("log_samples", step, list(rows))

    def close(self) -> None:
        for worker in self.workers:
            worker.close()
