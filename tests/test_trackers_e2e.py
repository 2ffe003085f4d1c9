"""Trackers in a real run: the quickstart, shortened, logs to W&B, SwanLab, MLflow and the example
plugin's csv sink at once (each offline or on a local store), and each one's own files read back
equal stats.jsonl; a tracker that breaks mid-run costs one line and the run goes on."""

from __future__ import annotations

import csv
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from quickstart_runs import SCRIPT, run_args, start, wait_until

pytest.importorskip("areal_stats_wandb", reason="pip install -e plugins/stats_wandb")
pytest.importorskip("areal_stats_swanlab", reason="pip install -e plugins/stats_swanlab")
pytest.importorskip("areal_stats_mlflow", reason="pip install -e plugins/stats_mlflow")

pytestmark = pytest.mark.slow

TRACKER_ENV = ("WANDB_MODE", "SWANLAB_MODE", "MLFLOW_TRACKING_URI")
EXAMPLE = Path(__file__).resolve().parents[1] / "examples" / "plugins" / "areal-stats-example"


@pytest.fixture(scope="module")
def example_site(tmp_path_factory) -> Path:
    """The example sink plugin (``csv``) installed as its own distribution into a directory of its own."""
    source = tmp_path_factory.mktemp("src") / EXAMPLE.name  # a copy: the build writes next to its sources
    shutil.copytree(EXAMPLE, source, ignore=shutil.ignore_patterns("build", "*.egg-info", "__pycache__", ".*"))
    target = tmp_path_factory.mktemp("site")
    subprocess.run([sys.executable, "-m", "pip", "install", "-q", "--no-deps", "--no-build-isolation", "--target",
                    str(target), str(source)], check=True, capture_output=True, text=True, timeout=300)  # fmt: skip
    return target


def _env(site: Path | None = None) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in TRACKER_ENV}
    if site is not None:
        env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(site), os.environ.get("PYTHONPATH")]))
    return env


def _run(tmp_path, trial: str, *extra: str, site: Path, env: dict[str, str]) -> subprocess.CompletedProcess:
    proc = subprocess.run([sys.executable, str(SCRIPT), *run_args(tmp_path, trial, *extra)], capture_output=True,
                          text=True, timeout=600, env={**_env(site), **env})  # fmt: skip
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    return proc


def _jsonl(path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines()]


def test_one_run_logs_the_same_steps_to_every_tracker(tmp_path, monkeypatch, example_site):
    from areal_stats_wandb.offline_files import history
    from mlflow import MlflowClient
    from swanlab.proto.swanlab.record.v1.record_pb2 import Record
    from swanlab.sdk.internal.core_python.store import DataStoreReader

    proc = _run(
        tmp_path, "trackers", "stats.sinks=[jsonl, wandb, swanlab, mlflow, csv]", "stats.samples=3",
        "stats.samples_every=2", site=example_site, env={"WANDB_MODE": "offline", "SWANLAB_MODE": "offline"},
    )  # fmt: skip
    assert "stats sink" not in proc.stdout + proc.stderr
    run_dir = tmp_path / "quickstart" / "trackers"
    rows = _jsonl(run_dir / "stats.jsonl")
    expected = [(row["step"], row["reward/mean"]) for row in rows]
    assert [step for step, _ in expected] == [1, 2, 3, 4]
    with (run_dir / "scalars.csv").open(newline="") as f:
        assert [(int(row["step"]), float(row["reward/mean"])) for row in csv.DictReader(f)] == expected

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


def test_a_tracker_that_breaks_mid_run_costs_one_line(tmp_path, marks, monkeypatch):
    """MLflow's file store is replaced by a file after the first step: its next call fails."""
    for key in TRACKER_ENV:
        monkeypatch.delenv(key, raising=False)
    run_dir = tmp_path / "quickstart" / "broken"
    # 30 steps (about 8 s): under the full suite's load this process once noticed step 1 only after 8 steps had run
    args = run_args(tmp_path, "broken", "total_train_steps=30", "stats.sinks=[jsonl, mlflow]")
    proc = start([sys.executable, str(SCRIPT), *args], marks())
    store, state = run_dir / "mlruns", run_dir / "trackers" / "mlflow.json"

    def took_step_1() -> bool:
        return state.exists() and json.loads(state.read_text())["last_step"] >= 1

    wait_until(lambda: took_step_1() or proc.poll() is not None, 300, "the tracker's first step")
    store.rename(run_dir / "mlruns.moved")  # atomic: the sink's next call finds a file where its store was
    store.write_text("not a directory any more\n")
    out, _ = proc.communicate(timeout=600)
    assert proc.returncode == 0, out[-3000:]
    lines = [line for line in out.splitlines() if "stats sink 'mlflow'" in line]
    assert len(lines) == 1, out[-3000:]
    assert lines[0].startswith("areal: stats sink 'mlflow' failed in log_s"), lines[0]
    assert lines[0].endswith("; the run goes on without it (its data so far: " + (run_dir / "mlruns").as_uri() + ")")
    assert [row["step"] for row in _jsonl(run_dir / "stats.jsonl")] == list(range(1, 31))
