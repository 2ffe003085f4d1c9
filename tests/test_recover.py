"""Recover points are published atomically: a crash while writing keeps the previous one."""

from __future__ import annotations

from pathlib import Path

import attrs
import pytest

from areal_core.recover import RecoverInfo, RecoverStore


def _info(step: int) -> RecoverInfo:
    return RecoverInfo(step=step, version=step, loader_state={"epoch": 0, "index": step, "seed": 1},
                       in_flight=[{"id": f"p{step}", "prompt": "1+1="}], checkpoint=Path())


def _write(marker: str):
    def write(path: Path) -> None:
        path.mkdir(parents=True)
        (path / "state").write_text(marker)

    return write


def test_save_then_latest_round_trips(tmp_path):
    store = RecoverStore(tmp_path / "recover")
    assert store.latest() is None
    store.save(_info(2), _write("two"))
    store.save(_info(4), _write("four"))
    latest = store.latest()
    assert latest == attrs.evolve(_info(4), checkpoint=tmp_path / "recover" / "step4")
    assert (latest.checkpoint / "state").read_text() == "four"
    assert sorted(p.name for p in (tmp_path / "recover").iterdir()) == ["latest.json", "step4"]


def test_crash_while_writing_keeps_the_previous_point(tmp_path):
    store = RecoverStore(tmp_path / "recover")
    store.save(_info(2), _write("two"))

    def crash(path: Path) -> None:
        path.mkdir(parents=True)
        (path / "partial").write_text("x")
        raise RuntimeError("killed mid-write")

    with pytest.raises(RuntimeError):
        store.save(_info(4), crash)
    latest = store.latest()
    assert latest.step == 2 and (latest.checkpoint / "state").read_text() == "two"
    store.save(_info(4), _write("four"))  # the leftover temp dir does not get in the way
    assert store.latest().step == 4


# --------------------------------------------------------------------------- fingerprint (BAD 6)


@pytest.mark.slow
def test_resuming_after_changing_a_fixed_key_exits_2_listing_the_keys(tmp_path: Path) -> None:
    """A real 1-step run writes a recover point; resuming it with another model shape or dataset size
    stops before anything starts, in one line, exit 2, and the launcher does not retry it."""
    import subprocess

    from quickstart_runs import LAUNCHER, run_args

    base = ["recover.mode=auto", "recover.freq_steps=1", "recover.retries=2"]
    first = subprocess.run(LAUNCHER + run_args(tmp_path, "t", *base, "total_train_steps=1"),
                           capture_output=True, text=True, timeout=600)  # fmt: skip
    assert first.returncode == 0, first.stdout[-2000:] + first.stderr[-2000:]
    changed = ["total_train_steps=2", "model.tiny.hidden_size=64", "train_dataset.size=8"]
    again = subprocess.run(LAUNCHER + run_args(tmp_path, "t", *base, *changed), capture_output=True, text=True, timeout=600)
    assert again.returncode == 2, again.stdout[-2000:] + again.stderr[-2000:]
    assert "restarting" not in again.stderr and "Traceback" not in again.stderr
    lines = again.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("areal: error: recover: ")
    assert "model.tiny.hidden_size (128 -> 64)" in lines[0] and "train_dataset.size (12 -> 8)" in lines[0]
