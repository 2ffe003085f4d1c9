"""The ledger: append-only events, restarts, and the exactly-once audit the fault tests rely on."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

from hypothesis import given, settings
from hypothesis import strategies as st
from rollout_doubles import ScriptedEngine
from test_rollout_controller import GroupWorkflow, _bump, _controller, _items

from areal_core.rollout.dataloader import PromptLoader
from areal_core.rollout.ledger import EPISODE_UID, Ledger, audit, episode_uid, json_value, read_ledger


def test_events_are_appended_flushed_and_survive_a_reopen(tmp_path: Path) -> None:
    path = tmp_path / "run" / "ledger.jsonl"
    first = Ledger(path)
    first.record("start", version=0, dataset_size=2)
    first.record("submitted", uid="0:a", item_id="a", epoch=0)
    assert len(path.read_text().splitlines()) == 2  # flushed at once, before close
    first.close()
    first.record("late", uid="x")  # after close: dropped, not an error
    with Ledger(path) as second:  # a restarted controller appends
        second.record("consumed", uid="0:a", version=0)
        second.record_each("consumed", "uid", map(json_value, ['0:"b"\n', "0:c"]), version=1)  # quoted and escaped
    with path.open("a") as f:
        f.write('{"event": "torn')  # a writer killed mid-line
    rows = read_ledger(path)
    assert [r["event"] for r in rows] == ["start", "submitted", "consumed", "consumed", "consumed"]
    assert [(r.get("uid"), r.get("version")) for r in rows[2:]] == [("0:a", 0), ('0:"b"\n', 1), ("0:c", 1)]
    assert all(isinstance(r["t"], float) for r in rows)


def test_uid_comes_from_the_running_episode(tmp_path: Path) -> None:
    ledger = Ledger(tmp_path / "l.jsonl")

    async def episode(uid: str) -> None:
        EPISODE_UID.set(uid)
        await asyncio.sleep(0)
        ledger.record("resubmitted", request_id=uid + "-r")

    async def both() -> None:
        await asyncio.gather(episode("0:a"), episode("0:b"))  # each task has its own context

    asyncio.run(both())
    ledger.record("server_lost", address="h:1")  # outside any episode: no uid
    ledger.close()
    rows = read_ledger(tmp_path / "l.jsonl")
    assert {(r["uid"], r["request_id"]) for r in rows[:2]} == {("0:a", "0:a-r"), ("0:b", "0:b-r")}
    assert "uid" not in rows[2]


def test_rollout_controller_records_every_episode(tmp_path: Path) -> None:
    path = tmp_path / "ledger.jsonl"
    loader = PromptLoader(_items(5), seed=1)
    with Ledger(path) as ledger:
        ledger.record("start", version=0, dataset_size=5)
        ctl = _controller(ScriptedEngine(), batch_size=2, eta=1)
        ctl.ledger = ledger
        with ctl:
            for _ in range(4):
                ctl.prepare_batch(loader, GroupWorkflow(fail={"p3"}), timeout=60)
                _bump(ctl)
    rows = read_ledger(path)
    result = audit(rows)
    consumed = [r for r in rows if r["event"] == "consumed"]
    assert len(consumed) == 8 and result.duplicates == []
    assert [r["version"] for r in consumed] == [0, 0, 1, 1, 2, 2, 3, 3]
    submitted = {r["uid"]: r for r in rows if r["event"] == "submitted"}
    assert submitted["0:p0"]["item_id"] == "p0" and submitted["0:p0"]["epoch"] == 0
    assert result.outcomes["failed"] >= 1  # p3 raised: recorded, never consumed ...
    assert any(p.startswith("lost") and p.endswith(":p3") for p in result.problems())  # ... and the audit says so
    (stop,) = [r for r in rows if r["event"] == "stop"]  # episodes still running may end after it
    assert set(stop["in_flight"]) == result.in_flight


def _simulated_run(
    rows: list[dict], n_items: int, batch: int, steps: int, recover_every: int, crash_at: int | None
) -> None:
    """The trainer's ledger traffic: batches in loader order, recover points, one crash and recovery.
    ``rows`` gets what a real run appends (start, submitted, consumed, stop)."""
    loader = PromptLoader(_items(n_items), seed=0)
    saved = (0, loader.state_dict())
    rows.append({"event": "start", "version": 0, "dataset_size": n_items, "recovered": False})
    step = 0
    while step < steps:
        step += 1
        items = [next(loader) for _ in range(batch)]
        rows += [{"event": "submitted", "uid": episode_uid(d)} for d in items]
        rows += [{"event": "consumed", "uid": episode_uid(d), "version": step - 1} for d in items]
        if step % recover_every == 0:
            saved = (step, loader.state_dict())
        if step == crash_at:  # killed after consuming: restart from the last recover point
            crash_at = None
            step = saved[0]
            loader.load_state_dict(saved[1])
            rows.append({"event": "start", "version": step, "dataset_size": n_items, "recovered": True})
    rows.append({"event": "stop", "in_flight": []})


@settings(max_examples=60, deadline=None)
@given(
    n_items=st.integers(2, 9),
    batch=st.integers(1, 4),
    steps=st.integers(1, 12),
    recover_every=st.integers(1, 4),
    crash=st.integers(0, 12),
)
def test_audit_proves_exactly_once_across_a_recovery(n_items, batch, steps, recover_every, crash) -> None:
    rows: list[dict] = []
    _simulated_run(rows, n_items, batch, steps, recover_every, crash if 0 < crash <= steps else None)
    result = audit(rows)
    assert result.problems() == []
    assert sum(result.consumed.values()) == steps * batch  # the rolled-back steps do not count
    assert sum(n for epoch, n in result.per_epoch.items() if epoch < max(result.per_epoch)) % n_items == 0

    # The audit can fail: a consumption repeated outside any rollback is reported ...
    consumed = [r for r in rows if r["event"] == "consumed"]
    twice = rows[:-1] + [consumed[-1], rows[-1]]
    assert audit(twice).duplicates == [consumed[-1]["uid"]]
    # ... and so is an episode that was submitted and then vanished.
    vanished = rows[:-1] + [{"event": "submitted", "uid": "99:ghost"}, rows[-1]]
    assert audit(vanished).lost == ["99:ghost"]
    # A fresh run in the same directory starts the account anew.
    assert audit(vanished + rows).problems() == []


def test_an_incomplete_epoch_is_reported() -> None:
    rows = [{"event": "start", "version": 0, "dataset_size": 3}]
    for uid in ("0:a", "0:b", "1:a"):  # epoch 0 lacks c, yet epoch 1 began
        rows += [{"event": "submitted", "uid": uid}, {"event": "consumed", "uid": uid, "version": 0}]
    rows.append({"event": "stop", "in_flight": []})
    assert audit(rows).problems() == ["epoch 0: 2 of 3 items accounted for"]
    rows[-1] = {"event": "stop", "in_flight": ["0:c"]}  # still running at the end: accounted for
    rows.insert(-1, {"event": "submitted", "uid": "0:c"})
    assert audit(rows).problems() == []
    assert json.dumps(rows)  # the rows are plain JSON, as the file holds them
