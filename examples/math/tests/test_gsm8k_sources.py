"""Where GSM8K comes from: JSONL, parquet (file, directory, hub layout) or a hub id via the cache."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from areal_core.config import DatasetConfig
from areal_core.builtin.datasets.gsm8k import load_gsm8k
from areal_core.api.errors import ConfigError

SHARED = Path(__file__).resolve().parents[3] / ".." / "shared" / "data" / "gsm8k"
ROWS = [{"question": f"What is {i} + {i}?", "answer": f"{i} + {i} = {2 * i}\n#### {2 * i}"} for i in range(5)]


def _write_parquet(path: Path, rows: list[dict]) -> None:
    pa = pytest.importorskip("pyarrow", reason="pyarrow is not installed: pip install -e '.[test]'")
    import pyarrow.parquet as pq

    path.parent.mkdir(parents=True, exist_ok=True)
    pq.write_table(pa.Table.from_pylist(rows), path)


def test_parquet_file_directory_and_hub_layout_give_the_jsonl_items(tmp_path: Path) -> None:
    jsonl = tmp_path / "j" / "train.jsonl"
    jsonl.parent.mkdir()
    jsonl.write_text("".join(json.dumps(r) + "\n" for r in ROWS))
    _write_parquet(tmp_path / "p" / "train.parquet", ROWS)
    _write_parquet(tmp_path / "hub" / "main" / "test-00000-of-00001.parquet", ROWS[:2])
    from_jsonl = load_gsm8k(DatasetConfig(name="gsm8k", path=str(jsonl)), "train")
    from_parquet = load_gsm8k(DatasetConfig(name="gsm8k", path=str(tmp_path / "p")), "train")
    strip = lambda items: [(i["prompt"], i["answer"]) for i in items]
    assert strip(from_parquet) == strip(from_jsonl) and len(from_parquet) == 5
    valid = load_gsm8k(DatasetConfig(name="gsm8k", path=str(tmp_path / "hub")), "valid")
    assert [i["id"] for i in valid] == ["test-00000-of-00001-1", "test-00000-of-00001-2"]


def test_a_parquet_row_without_answer_names_its_row(tmp_path: Path) -> None:
    _write_parquet(tmp_path / "train.parquet", [{"question": "q", "answer": "#### 1"}, {"question": "q", "other": "x"}])
    with pytest.raises(ConfigError, match=r"train.parquet:2\b.*answer"):
        load_gsm8k(DatasetConfig(name="gsm8k", path=str(tmp_path / "train.parquet")), "train")


def test_a_hub_id_offline_and_uncached_is_one_clear_line(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "empty-cache"))
    with pytest.raises(ConfigError) as err:
        load_gsm8k(DatasetConfig(name="gsm8k", path="openai/gsm8k"), "train")
    message = str(err.value)
    assert message.startswith("train_dataset.path: 'openai/gsm8k' is no local path and could not be fetched")
    assert "\n" not in message and "or give a local path" in message


def test_a_hub_id_offline_reads_the_cached_snapshot(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The hub cache layout huggingface_hub reads offline: refs/main -> snapshots/<commit>/."""
    cache = tmp_path / "hub-cache"
    commit = "0" * 40
    repo = cache / "datasets--openai--gsm8k"
    (repo / "refs").mkdir(parents=True)
    (repo / "refs" / "main").write_text(commit)
    _write_parquet(repo / "snapshots" / commit / "main" / "train-00000-of-00001.parquet", ROWS)
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("HF_HUB_CACHE", str(cache))
    import huggingface_hub.constants as hub_constants

    monkeypatch.setattr(hub_constants, "HF_HUB_OFFLINE", True)
    monkeypatch.setattr(hub_constants, "HF_HUB_CACHE", str(cache))
    items = load_gsm8k(DatasetConfig(name="gsm8k", path="openai/gsm8k", size=3), "train")
    assert [i["answer"] for i in items] == [r["answer"] for r in ROWS[:3]]


@pytest.mark.skipif(not SHARED.is_dir(), reason=f"shared GSM8K data not found at {SHARED}: put the shared/data directory beside the clone, as CI has it")
def test_the_shared_copy_is_the_full_dataset() -> None:
    assert len(load_gsm8k(DatasetConfig(name="gsm8k", path=str(SHARED)), "train")) == 7473
