"""The mlflow sink on a file store, read back with ``mlflow.MlflowClient``: every step once with
the values logged (after a resume too), the config as parameters, the sample-table artifacts."""

from __future__ import annotations

import json

import pytest

pytest.importorskip("mlflow", reason="pip install -e plugins/stats_mlflow")

from areal_stats_mlflow.sink import samples_artifact  # noqa: E402

from areal_core.testing import drive_sink, sink_test_rows  # noqa: E402

CONFIG = {"seed": 7, "actor": {"optimizer": {"lr": 1e-5}}, "stats": {"sinks": ["jsonl", "mlflow"]}}
OPTIONS = {"tags": {"team": "rl"}}


def test_file_store_reads_back_and_a_resume_continues_the_run_without_repeating_steps(tmp_path, monkeypatch):
    from mlflow import MlflowClient

    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    rows = sink_test_rows()
    assert drive_sink("mlflow", tmp_path, range(0, 5), options=OPTIONS, samples=rows, config=CONFIG) == []
    # recovered at step 3: step 4 was already sent
    assert drive_sink("mlflow", tmp_path, range(4, 7), resume_step=3, options=OPTIONS, config=CONFIG) == []
    client = MlflowClient(tracking_uri=(tmp_path / "mlruns").as_uri())
    (run,) = client.search_runs([client.get_experiment_by_name("exp").experiment_id])
    assert run.info.run_name == "t1" and run.info.status == "FINISHED" and run.data.tags["team"] == "rl"
    history = [(m.step, m.value) for m in client.get_metric_history(run.info.run_id, "reward/mean")]
    assert sorted(history) == [(s, s / 8) for s in range(0, 5)] + [(s, s / 8 + 3) for s in (5, 6)]
    assert run.data.params["actor.optimizer.lr"] == "1e-05" and run.data.params["stats.sinks"] == '["jsonl", "mlflow"]'
    for split in ("eval", "train"):
        path = client.download_artifacts(run.info.run_id, samples_artifact(2, split), str(tmp_path / "dl"))
        logged = [json.loads(line) for line in open(path).read().splitlines()]
        assert logged == [row.as_dict() for row in rows if row.split == split]
    state = json.loads((tmp_path / "trackers" / "mlflow.json").read_text())
    assert state == {"run_id": run.info.run_id, "last_step": 6}
