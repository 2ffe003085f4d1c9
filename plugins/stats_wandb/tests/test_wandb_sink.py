"""The wandb sink in wandb's offline mode, read back from the run files it wrote: every step once
with the values logged (after a resume too), the sample tables' rows, the config, one run id."""

from __future__ import annotations

import json

import pytest

pytest.importorskip("wandb", reason="pip install -e plugins/stats_wandb")

from areal_stats_wandb.offline_files import config, history  # noqa: E402

from areal_core.plugins import load_plugins  # noqa: E402
from areal_core.testing import drive_sink, sink_test_rows  # noqa: E402

OPTIONS = {"mode": "offline", "tags": ["ci"]}


def test_offline_run_reads_back_and_a_resume_continues_it_without_repeating_steps(tmp_path, monkeypatch):
    monkeypatch.delenv("WANDB_MODE", raising=False)
    rows = sink_test_rows()
    assert drive_sink("wandb", tmp_path, range(0, 5), options=OPTIONS, samples=rows) == []
    # recovered at step 3: step 4 was already sent
    assert drive_sink("wandb", tmp_path, range(4, 7), resume_step=3, options=OPTIONS) == []
    ids, logged = history(tmp_path / "wandb")
    assert len(ids) == 2 and len(set(ids)) == 1  # the same W&B run, continued
    scalars = [(row["_step"], row["reward/mean"]) for row in logged if "reward/mean" in row]
    assert scalars == [(s, s / 8) for s in range(0, 5)] + [(s, s / 8 + 3) for s in (5, 6)]
    for split in ("eval", "train"):
        (table_row,) = [row for row in logged if f"samples/{split}/path" in row]
        assert table_row["_step"] == 2
        (table_file,) = tmp_path.glob(f"wandb/offline-run-*/files/{table_row[f'samples/{split}/path']}")
        table = json.loads(table_file.read_text())
        assert [dict(zip(table["columns"], data)) for data in table["data"]] == [
            row.as_dict() for row in rows if row.split == split
        ]
    assert config(tmp_path / "wandb")["seed"] == 7
    state = json.loads((tmp_path / "trackers" / "wandb.json").read_text())
    assert state == {"run_id": ids[0], "last_step": 6}


def test_unknown_option_and_bad_mode_are_config_errors():
    from areal_core.api import ConfigError
    from areal_core.config import load_config
    from areal_core.resolve import resolve_config

    plugins = load_plugins()
    for override, message in [
        ("plugins.wandb={projct: x}", "plugins.wandb.projct: unknown option of the wandb sink (options: project, "
                                      "entity, name, group, tags, mode)"),
        ("plugins.wandb={mode: cloud}", "plugins.wandb.mode: expected one of online, offline, disabled, got 'cloud'"),
        ("plugins.wandb={tags: ci}", "plugins.wandb.tags: expected list, got 'ci'"),
    ]:  # fmt: skip
        config = load_config(None, ["stats.sinks=[jsonl, wandb]", override])
        with pytest.raises(ConfigError) as caught:
            resolve_config(config, plugins)
        assert str(caught.value) == message
