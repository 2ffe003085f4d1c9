"""The ``jsonl`` sink: one JSON line per training step in ``stats.jsonl``, sample rows in ``samples.jsonl``."""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from areal_core.api.stats_sink import SampleRow, SinkRun, StatsSink

STATS_FILE = "stats.jsonl"
SAMPLES_FILE = "samples.jsonl"


class JsonlSink(StatsSink):
    """Appends to the run directory's files; a recovered run first drops the rows after its
    resume step, so each step appears once. Step 0 (the accuracy before training) has no row in
    ``stats.jsonl``, which holds training steps only; the summary and ``eval_samples.jsonl`` have it."""

    rewrites_history = True

    def __init__(self, run: SinkRun) -> None:
        self.stats_path = run.run_dir / STATS_FILE
        self.samples_path = run.run_dir / SAMPLES_FILE
        for path in (self.stats_path, self.samples_path):
            _truncate(path, run.resume_step)

    def log_scalars(self, step: int, scalars: Mapping[str, float]) -> None:
        if step > 0:
            _append(self.stats_path, [{"step": step, **scalars}])

    def log_samples(self, step: int, rows: Sequence[SampleRow]) -> None:
        _append(self.samples_path, [row.as_dict() for row in rows])


def read_rows(path: Path, up_to_step: int | None = None) -> list[dict[str, Any]]:
    """The rows of a jsonl file with a ``step`` key, those up to ``up_to_step`` where given."""
    if not path.exists():
        return []
    rows = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    return rows if up_to_step is None else [row for row in rows if row["step"] <= up_to_step]


def _truncate(path: Path, resume_step: int) -> None:
    kept = read_rows(path, resume_step) if resume_step > 0 else []
    path.write_text("".join(json.dumps(row) + "\n" for row in kept))


def _append(path: Path, rows: list[dict[str, Any]]) -> None:
    with path.open("a") as f:
        f.write("".join(json.dumps(row) + "\n" for row in rows))
