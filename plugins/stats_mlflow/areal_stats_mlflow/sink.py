"""The ``mlflow`` sink: one MLflow run per areal run, continued by a recovered run."""

from __future__ import annotations

import json
import os
import time
from collections.abc import Iterator, Mapping, Sequence
from typing import Any

from areal_core.api import SampleRow, SinkRun, StatsSink

MAX_PARAMS_PER_BATCH = 100  # MLflow's limit for one log_batch call
MAX_PARAM_CHARS = 6000  # and for one parameter's value


def flat_params(config: Mapping[str, Any], prefix: str = "") -> Iterator[tuple[str, str]]:
    """The config as MLflow parameters: dotted keys, values as text (lists as JSON)."""
    for key, value in config.items():
        if isinstance(value, Mapping) and value:
            yield from flat_params(value, f"{prefix}{key}.")
        else:
            text = value if isinstance(value, str) else json.dumps(value)
            yield f"{prefix}{key}", text[:MAX_PARAM_CHARS]


def samples_artifact(step: int, split: str) -> str:
    return f"samples/{split}/step_{step:06d}.jsonl"


class MlflowSink(StatsSink):
    """Logs each step's metrics at ``step``, the resolved config as parameters (dotted keys) and
    each sample table as a JSONL artifact ``samples/<split>/step_NNNNNN.jsonl``. The tracking URI
    is ``MLFLOW_TRACKING_URI``, then ``plugins.mlflow.tracking_uri``, then a file store in
    ``RUN_DIR/mlruns`` (MLflow 3 keeps its file store behind ``MLFLOW_ALLOW_FILE_STORE``, which this
    sink sets for a ``file:`` URI it is given)."""

    rewrites_history = False

    def __init__(self, run: SinkRun) -> None:
        from mlflow import MlflowClient

        options = run.options
        self.tracking_uri = (
            os.environ.get("MLFLOW_TRACKING_URI") or options.get("tracking_uri") or (run.run_dir / "mlruns").as_uri()
        )
        if self.tracking_uri.startswith("file:"):
            os.environ.setdefault("MLFLOW_ALLOW_FILE_STORE", "true")
        self._client = client = MlflowClient(tracking_uri=self.tracking_uri)
        if run.resume_id:
            self.run_id = run.resume_id
            client.update_run(self.run_id, status="RUNNING")
            return
        name = options.get("experiment", run.experiment_name)
        experiment = client.get_experiment_by_name(name)
        experiment_id = experiment.experiment_id if experiment else client.create_experiment(name)
        self.run_id = client.create_run(
            experiment_id, run_name=options.get("name", run.trial_name), tags=options.get("tags")
        ).info.run_id
        self._log_params(run.config)

    def _log_params(self, config: Mapping[str, Any]) -> None:
        from mlflow.entities import Param

        params = [Param(key, value) for key, value in flat_params(config)]
        for start in range(0, len(params), MAX_PARAMS_PER_BATCH):
            self._client.log_batch(self.run_id, params=params[start : start + MAX_PARAMS_PER_BATCH])

    def log_scalars(self, step: int, scalars: Mapping[str, float]) -> None:
        from mlflow.entities import Metric

        now = int(time.time() * 1000)
        metrics = [Metric(key, float(value), now, step) for key, value in scalars.items()]
        self._client.log_batch(self.run_id, metrics=metrics)

    def log_samples(self, step: int, rows: Sequence[SampleRow]) -> None:
        for split in sorted({row.split for row in rows}):
            lines = "".join(json.dumps(row.as_dict()) + "\n" for row in rows if row.split == split)
            self._client.log_text(self.run_id, lines, samples_artifact(step, split))

    def close(self) -> None:
        self._client.set_terminated(self.run_id)

    def local_copy(self) -> str | None:
        return self.tracking_uri if self.tracking_uri.startswith("file:") else None
