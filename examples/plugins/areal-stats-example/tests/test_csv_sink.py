"""The csv sink writes a row per training step and keeps the rows up to the recover point on a resume."""

import csv

from areal_stats_example.csv_sink import CsvSink

from areal_core.api import SinkRun


def _sink(tmp_path, resume_step=0):
    return CsvSink(SinkRun(run_dir=tmp_path, experiment_name="e", trial_name="t", config={}, options={},
                           resume_step=resume_step))  # fmt: skip


def test_rows_per_step_and_a_resume_keeps_them_up_to_the_recover_point(tmp_path):
    sink = _sink(tmp_path)
    for step in range(0, 5):
        sink.log_scalars(step, {"reward/mean": step / 4, "eval/accuracy": 0.5})
    sink.close()
    resumed = _sink(tmp_path, resume_step=2)
    resumed.log_scalars(3, {"reward/mean": 0.9, "eval/accuracy": 0.5})
    resumed.close()
    rows = list(csv.DictReader((tmp_path / "scalars.csv").open()))
    assert [(row["step"], float(row["reward/mean"])) for row in rows] == [("1", 0.25), ("2", 0.5), ("3", 0.9)]
