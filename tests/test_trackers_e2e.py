"""Trackers in a real run: the quickstart, shortened, logs to W&B, SwanLab and MLflow at once (each
offline or on a local store), and each one's own files read back equal stats.jsonl; a tracker
whose server is down costs one line and the run goes on."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
from quickstart_runs import SCRIPT, run_args

pytest.importorskip("areal_stats_wandb", reason="pip install -e plugins/stats_wandb")
pytest.importorskip("areal_stats_swanlab", reason="pip install -e plugins/stats_swanlab")
pytest.importorskip("areal_stats_mlflow", reason="pip install -e plugins/stats_mlflow")

pytestmark = pytest.mark.slow

TRACKER_ENV = ("WANDB_MODE", "SWANLAB_MODE", "MLFLOW_TRACKING_URI")


def _run(tmp_path, trial: str, *extra: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
    clean = {k: v for k, v in os.environ.items() if k not in TRACKER_ENV}
    proc = subprocess.run([sys.executable, str(SCRIPT), *run_args(tmp_path, trial, *extra)], capture_output=True,
                          text=True, timeout=600, env={**clean, **(env or {})})  # fmt: skip
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    return proc


def _jsonl(path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines()]


def test_one_run_logs_the_same_steps_to_all_three_trackers(tmp_path, monkeypatch):
    from areal_stats_wandb.offline_files import history
    from mlflow import MlflowClient
    from swanlab.proto.swanlab.record.v1.record_pb2 import Record
    from swanlab.sdk.internal.core_python.store import DataStoreReader

    proc = _run(
        tmp_path, "trackers", "stats.sinks=[jsonl, wandb, swanlab, mlflow]", "stats.samples=3", "stats.samples_every=2",
        "plugins={wandb: {mode: offline}, swanlab: {mode: offline}}",
    )  # fmt: skip
    assert "stats sink" not in proc.stdout + proc.stderr
    run_dir = tmp_path / "quickstart" / "trackers"
    rows = _jsonl(run_dir / "stats.jsonl")
    expected = [(row["step"], row["reward/mean"]) for row in rows]
    assert [step for step, _ in expected] == [1, 2, 3, 4]

    _, wandb_rows = history(run_dir / "wandb")
    assert [(row["_step"], row["reward/mean"]) for row in wandb_rows if "reward/mean" in row] == expected
    wandb_evals = [row["_step"] for row in wandb_rows if "eval/accuracy" in row]
    assert wandb_evals == [0, 2, 4]  # before training, then stats.eval_every=2

    scalars = []
    for path in run_dir.glob("swanlog/run-*/run-*.swanlab"):
        reader = DataStoreReader()
        reader.open(path)
        for raw in reader:
            record = Record()
            record.ParseFromString(raw)
            if record.HasField("scalar") and record.scalar.key == "reward/mean":
                scalars.append((record.scalar.step, record.scalar.value.number))
    assert scalars == expected

    monkeypatch.setenv("MLFLOW_ALLOW_FILE_STORE", "true")  # MLflow 3 reads a file store only with it
    client = MlflowClient(tracking_uri=(run_dir / "mlruns").as_uri())
    (run,) = client.search_runs([client.get_experiment_by_name("quickstart").experiment_id])
    assert sorted((m.step, m.value) for m in client.get_metric_history(run.info.run_id, "reward/mean")) == expected
    assert run.data.params["trial_name"] == "trackers"

    samples = _jsonl(run_dir / "samples.jsonl")
    assert [(row["step"], row["split"]) for row in samples] == [
        (step, split) for step, splits in [(0, ["eval"]), (2, ["eval", "train"]), (4, ["eval", "train"])]
        for split in splits for _ in range(3)
    ]  # fmt: skip
    eval_answers = {(row["step"], row["id"]): row["reward"] for row in _jsonl(run_dir / "eval_samples.jsonl")}
    assert all(eval_answers[row["step"], row["id"]] == row["reward"] for row in samples if row["split"] == "eval")
    assert all(row["response"] and row["version"] == row["step"] for row in samples if row["split"] == "eval")


def test_a_tracker_whose_server_is_down_costs_one_line(tmp_path):
    proc = _run(
        tmp_path, "down", "stats.sinks=[jsonl, mlflow]", "plugins={mlflow: {tracking_uri: 'http://127.0.0.1:9'}}",
        env={"MLFLOW_HTTP_REQUEST_MAX_RETRIES": "0"},
    )  # fmt: skip
    lines = [line for line in (proc.stdout + proc.stderr).splitlines() if "stats sink 'mlflow'" in line]
    assert len(lines) == 1, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert "failed in starting" in lines[0]
    assert lines[0].endswith("the run goes on without it (every step stays in stats.jsonl)")
    assert [row["step"] for row in _jsonl(tmp_path / "quickstart" / "down" / "stats.jsonl")] == [1, 2, 3, 4]
