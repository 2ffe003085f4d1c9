"""The swanlab sink in SwanLab's local mode, read back with SwanLab's own record reader: every step
once with the values logged (after a resume too), the samples' texts, one run id. (Offline mode,
which writes the same files, runs in tests/test_trackers_e2e.py through SWANLAB_MODE.)"""

from __future__ import annotations

import json

import pytest

pytest.importorskip("swanlab", reason="pip install -e plugins/stats_swanlab")

from areal_stats_swanlab.sink import row_text  # noqa: E402

from areal_core.testing import drive_sink, sink_test_rows  # noqa: E402

OPTIONS = {"mode": "local"}


def _records(log_dir):
    from swanlab.proto.swanlab.record.v1.record_pb2 import Record
    from swanlab.sdk.internal.core_python.store import DataStoreReader

    for path in sorted(log_dir.glob("run-*/run-*.swanlab")):
        reader = DataStoreReader()
        reader.open(path)
        for raw in reader:
            record = Record()
            record.ParseFromString(raw)
            yield path.parent, record


def test_local_run_reads_back_and_a_resume_continues_it_without_repeating_steps(tmp_path, monkeypatch):
    monkeypatch.delenv("SWANLAB_MODE", raising=False)
    rows = sink_test_rows()
    assert drive_sink("swanlab", tmp_path, range(0, 5), options=OPTIONS, samples=rows) == []
    # recovered at step 3: step 4 was already sent
    assert drive_sink("swanlab", tmp_path, range(4, 7), resume_step=3, options=OPTIONS) == []
    records = list(_records(tmp_path / "swanlog"))
    rewards = [r.scalar for _, r in records if r.HasField("scalar") and r.scalar.key == "reward/mean"]
    expected = [(s, s / 8) for s in range(0, 5)] + [(s, s / 8 + 3) for s in (5, 6)]
    assert [(r.step, r.value.number) for r in rewards] == expected
    media = {r.media.key: (run_dir, r.media) for run_dir, r in records if r.HasField("media")}
    assert sorted(media) == ["samples/eval", "samples/train"]
    for split in ("eval", "train"):
        run_dir, table = media[f"samples/{split}"]
        texts = [((run_dir / "media" / "text" / item.filename).read_text(), item.caption) for item in table.value.items]
        assert table.step == 2 and texts == [row_text(row) for row in rows if row.split == split]
    state = json.loads((tmp_path / "trackers" / "swanlab.json").read_text())
    assert state["last_step"] == 6 and {d.name.rsplit("-", 1)[-1] for d, _ in records} == {state["run_id"]}
