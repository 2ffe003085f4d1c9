"""The elastic inference plane with real hf server processes: a server killed mid-request, servers
added at run time (API and ``areal servers``), replacements, and the control endpoint; then the
acceptance runs: the quickstart with a server killed, added, or replaced mid-run, its ledger
audited for exactly-once consumption.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import attrs
import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st
from quickstart_runs import SCRIPT, marked_pids, rewards, run_args, start, wait_until

from areal_core.config import Config, ModelConfig, RolloutConfig, TinyModelSpec
from areal_core.control_endpoint import CONTROL_FILE, ControlServer, control_call
from areal_core.api.engine import GenerationRequest, SamplingParams
from areal_core.api.http_engine import PauseGate, Router
from areal_core.api.errors import ArealError
from areal_core.builtin.engine_hf.client import HFEngine
from areal_core.builtin.platform_cpu.platform import CpuPlatform
from areal_core.rollout.fleet import ServerFleet
from areal_core.rollout.ledger import Ledger, audit, read_ledger
from areal_core.api.scheduler import ProcessDiedError
from areal_core.scheduler.local import LocalScheduler
from areal_core.testing import LoopThread, generate_all, hf_greedy, perturbed_model, wait_for
from areal_core.tiny_model import ensure_tiny_model

PROMPT = [3, 4, 5, 6]


# --------------------------------------------------------------------------- router (pure logic)


@settings(max_examples=30, deadline=None)
@given(ids=st.lists(st.text("abcdef", min_size=1, max_size=2), min_size=1, max_size=30), closed=st.integers(0, 2))
def test_router_never_routes_to_a_closed_slot(ids: list[str], closed: int) -> None:
    router = Router(3)
    first = {rid: router.acquire(rid) for rid in ids}
    router.set_open(closed, False)
    for rid in ids:
        slot = router.acquire(rid)
        assert slot != closed
        assert slot == first[rid] or first[rid] == closed  # only ids pinned to the closed slot move
    new = router.add(open_=False)
    assert all(router.acquire(f"x{i}") != new for i in range(6))
    router.set_open(new, True)
    assert new in {router.acquire(f"y{i}") for i in range(6)}  # least loaded: the new slot fills first
    for slot in range(4):
        router.set_open(slot, False)
    assert router.acquire("z") is None


@settings(max_examples=60, deadline=None)
@example(ops=[("acquire", 0), ("acquire", 0), ("release", 0), ("release", 0), ("acquire", 0)])  # a tie after slot 1
@given(ops=st.lists(st.tuples(st.sampled_from(["acquire", "release", "close", "open", "add"]), st.integers(0, 7)), max_size=80))
def test_router_picks_the_least_loaded_open_slot_round_robin(ops: list[tuple[str, int]]) -> None:
    """Against the rule itself: least load, ties from the slot after the last one chosen."""
    router, load, open_, nxt, held = Router(3), [0, 0, 0], [True, True, True], 0, []
    for i, (op, k) in enumerate(ops):
        if op == "acquire":
            candidates = [s for s in range(len(load)) if open_[s]]
            expected = min(candidates, key=lambda s: (load[s], (s - nxt) % len(load))) if candidates else None
            assert router.acquire(f"r{i}") == expected
            if expected is not None:
                load[expected], nxt = load[expected] + 1, (expected + 1) % len(load)
                held.append(expected)
        elif op == "release" and held:
            slot = held.pop(k % len(held))
            router.release(slot)
            load[slot] -= 1
        elif op in ("close", "open"):
            router.set_open(k % len(load), op == "open")
            open_[k % len(load)] = op == "open"
        elif op == "add":
            assert router.add(open_=k % 2 == 0) == len(load)
            load.append(0)
            open_.append(k % 2 == 0)


def test_pause_gate_holds_callers_on_every_loop_until_open() -> None:
    gate, loops = PauseGate(), [LoopThread(), LoopThread()]
    try:
        gate.close()
        held = [loop.submit(gate.wait()) for loop in loops for _ in range(50)]
        wait_for(lambda: sum(map(len, gate._waiters.values())) == len(held), "every caller held")
        assert not any(f.done() for f in held)
        gate.open()
        for future in held:
            future.result(timeout=60)
        assert loops[0].submit(gate.wait()).result(timeout=60) is None  # open: passes at once
    finally:
        for loop in loops:
            loop.close()


# --------------------------------------------------------------------------- real servers


@attrs.frozen
class Fleet:
    engine: HFEngine
    scheduler: LocalScheduler
    run_dir: Path
    weights: dict[int, Path]  # version -> weights dir inside the run dir (servers may load it)
    models: dict[int, Any]  # version -> the reference model


@pytest.fixture(scope="module")
def base_model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return ensure_tiny_model(TinyModelSpec(), ["abcdefghij0123456789+-= "], tmp_path_factory.mktemp("models"), seed=0)


def _fleet(root: Path, base: Path, servers: int, **rollout: Any) -> Iterator[Fleet]:
    run_dir = Config(fileroot=str(root)).run_dir
    weights, models = {}, {}
    for version in (0, 1):
        models[version] = perturbed_model(base, seed=version)
        weights[version] = run_dir / "weights" / f"v{version}"
        models[version].save_pretrained(weights[version])
    config = Config(
        fileroot=str(root),
        model=ModelConfig(path=str(weights[0])),
        rollout=RolloutConfig(
            servers=servers,
            server_startup_timeout=120,
            request_timeout=120,
            engine_args={"max_batch_size": 1},  # one request at a time: batch-invariant numerics
            **rollout,
        ),
    )
    scheduler = LocalScheduler(CpuPlatform())
    try:
        engine = HFEngine(config, CpuPlatform())
        engine.launch_servers(scheduler)
        yield Fleet(engine, scheduler, run_dir, weights, models)
    finally:
        scheduler.stop_all()


@pytest.fixture
def two_servers(tmp_path: Path, base_model: Path) -> Iterator[Fleet]:
    yield from _fleet(tmp_path, base_model, servers=2)


def _sampled(n: int, tokens: int) -> list[GenerationRequest]:
    return [
        GenerationRequest(input_ids=PROMPT + [i % 7], sampling=SamplingParams(max_new_tokens=tokens, seed=1000 + i))
        for i in range(n)
    ]


def _kill(engine: HFEngine, address: str) -> None:
    (handle,) = [h for h in engine.server_handles() if h is engine._handles.get(address)]
    os.kill(handle.pid, signal.SIGKILL)


@pytest.mark.slow
def test_requests_on_a_killed_server_finish_on_the_survivor_with_the_same_samples(two_servers: Fleet) -> None:
    engine, scheduler = two_servers.engine, two_servers.scheduler
    events: list[tuple[str, dict]] = []
    engine.on_event = lambda kind, fields: events.append((kind, fields))
    expected = generate_all(engine, _sampled(8, 40))  # the same seeds, uninterrupted
    survivor, victim = engine.addresses

    loop = LoopThread()
    try:
        again = _sampled(8, 40)  # new request ids, same seeds
        futures = [loop.submit(engine.agenerate(r)) for r in again]
        wait_for(lambda: (h := engine.server_health()[1]) is not None and h.running + h.queued >= 2, "work on the victim")
        _kill(engine, victim)
        responses = [f.result(timeout=300) for f in futures]
    finally:
        loop.close()

    # Every request completed; seeded sampling makes the re-run segments reproduce the lost tokens.
    assert [r.output_ids for r in responses] == [r.output_ids for r in expected]
    assert all(len(r.output_ids) == 40 for r in responses)
    assert engine.addresses == [survivor]
    moved = [f for kind, f in events if kind == "resubmitted"]
    assert moved and all(f["from_server"] == victim and f["to_server"] == survivor for f in moved)
    assert [kind for kind, _ in events].count("server_lost") == 1

    engine.set_version(3)  # control calls reach the survivor only
    assert [h.version for h in engine.server_health()] == [3]
    with pytest.raises(ProcessDiedError):
        scheduler.check_alive()
    scheduler.check_alive(exclude=engine.server_handles())  # the trainer ignores servers' deaths


@pytest.mark.slow
def test_a_stopped_server_is_found_hung_stopped_for_good_and_its_requests_move(tmp_path: Path, base_model: Path) -> None:
    """SIGSTOP, not SIGKILL: the process lives but never answers. After ``health_timeout_s`` of
    silence the fleet's health check finds it lost, stops its process, and its requests finish on
    the survivor with the samples an uninterrupted run gives."""
    for fleet_ in _fleet(tmp_path, base_model, servers=2, health_check_interval=0.5, health_timeout_s=3):
        engine = fleet_.engine
        expected = generate_all(engine, _sampled(8, 40))
        survivor, victim = engine.addresses
        (handle,) = [h for h in engine.server_handles() if h is engine._handles.get(victim)]
        with ServerFleet(engine, engine.config):
            loop = LoopThread()
            try:
                futures = [loop.submit(engine.agenerate(r)) for r in _sampled(8, 40)]
                wait_for(lambda: (h := engine.server_health()[1]) is not None and h.running + h.queued >= 2, "work on the victim")
                os.kill(handle.pid, signal.SIGSTOP)
                wait_for(lambda: engine.addresses == [survivor], "the health check to find the hung server", timeout=120)
                responses = [f.result(timeout=300) for f in futures]
            finally:
                loop.close()
        assert not handle.alive()  # stopped for good, not left hanging
        assert [r.output_ids for r in responses] == [r.output_ids for r in expected]


@pytest.mark.slow
def test_an_update_that_fails_because_a_server_died_is_retried_on_the_survivor(two_servers: Fleet) -> None:
    engine = two_servers.engine
    survivor, victim = engine.addresses
    attempts: list[tuple[str, ...]] = []

    def publish(version: int) -> None:
        """The first attempt fails the way a collective (xccl) update does when a member dies."""
        attempts.append(engine.members())
        if len(attempts) == 1:
            _kill(engine, victim)
            raise ArealError("weight broadcast failed: connection reset by a peer")
        engine.load_weights_from_disk(str(two_servers.weights[version]), version)

    fleet = ServerFleet(engine, engine.config)
    fleet.update_weights(publish, engine.set_version, 1)
    assert attempts == [(survivor, victim), (survivor,)]
    assert [h.version for h in engine.server_health()] == [1]

    def broken(version: int) -> None:
        raise ArealError("the trainer failed to save")

    with pytest.raises(ArealError, match="failed to save"):  # nobody was lost: no retry, the error stands
        fleet.update_weights(broken, engine.set_version, 2)


def _cli(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "areal_core.cli", *args], capture_output=True, text=True, timeout=300)


def _publish(fleet: Fleet) -> Any:
    """The disk weight path without a trainer: every member loads the saved weights of ``version``."""
    return lambda version: fleet.engine.load_weights_from_disk(str(fleet.weights[version]), version)


@pytest.mark.slow
def test_a_server_added_through_the_cli_serves_the_current_weights(tmp_path: Path, base_model: Path) -> None:
    for fleet_ in _fleet(tmp_path, base_model, servers=1):
        engine = fleet_.engine
        with Ledger(fleet_.run_dir / "ledger.jsonl") as ledger, ServerFleet(engine, engine.config, ledger) as fleet:
            fleet.update_weights(_publish(fleet_), engine.set_version, 1)
            with ControlServer(fleet, fleet_.run_dir) as control:
                info = fleet_.run_dir / CONTROL_FILE
                assert info.stat().st_mode & 0o777 == 0o600
                added = _cli("servers", "add", str(fleet_.run_dir))
                assert added.returncode == 0, added.stderr
                new = added.stdout.split()[0]
                listed = _cli("servers", "list", str(fleet_.run_dir), "--json")
                assert {r["address"]: r["state"] for r in json.loads(listed.stdout)["servers"]}[new] == "pending"
                assert engine.server_health() and new not in engine.addresses  # no traffic before it joins

                fleet.update_weights(_publish(fleet_), engine.set_version, 1)  # the next weight sync
                reference = hf_greedy(fleet_.models[1], PROMPT, 8)
                results = control_call(fleet_.run_dir, "POST", "/servers/probe", {"input_ids": PROMPT, "max_new_tokens": 8})
                assert [r["address"] for r in results["results"]] == engine.addresses
                for row in results["results"]:
                    assert row["output_ids"] == reference and row["versions"] == [1] * 8, row["address"]
                old, joined = results["results"]
                assert joined["logprobs"] == pytest.approx(old["logprobs"], abs=1e-5)
                served = generate_all(engine, _sampled(6, 4))  # new work is spread over both
                assert all(set(r.versions) == {1} for r in served)
                assert all(h.served >= 2 for h in engine.server_health())

                wrong = urllib.request.Request(f"http://{control.address}/servers", headers={"Authorization": "Bearer x"})
                with pytest.raises(urllib.error.HTTPError) as denied:
                    urllib.request.urlopen(wrong, timeout=10)
                assert denied.value.code == 401
                removed = _cli("servers", "remove", str(fleet_.run_dir), new)
                assert removed.returncode == 0 and "removed" in removed.stdout
                assert engine.addresses == [engine.addresses[0]] and new not in engine.addresses
                last = _cli("servers", "remove", str(fleet_.run_dir), engine.addresses[0])
                assert last.returncode == 2 and "last serving server" in last.stderr
            assert not info.exists()  # removed when the job stops
            gone = _cli("servers", "list", str(fleet_.run_dir))
            assert gone.returncode == 2 and gone.stderr.startswith("areal: error: no running job")
        events = [r["event"] for r in read_ledger(fleet_.run_dir / "ledger.jsonl")]
        assert events == ["server_added", "server_joined", "server_removed"]


@pytest.mark.slow
def test_losing_every_server_stops_the_run_unless_one_is_added(tmp_path: Path, base_model: Path) -> None:
    """Without ``restart_failed``: an idle server's death is found by the health check, the fleet
    reports that none is left, and a server added through the API joins with the current weights."""
    for fleet_ in _fleet(tmp_path, base_model, servers=1, health_check_interval=0.5):
        engine = fleet_.engine
        with ServerFleet(engine, engine.config) as fleet:
            (victim,) = engine.addresses
            _kill(engine, victim)
            wait_for(lambda: not engine.addresses, "the health check to drop the server", timeout=60)
            with pytest.raises(ArealError, match="every inference server is lost.*restart_failed: true"):
                fleet.ensure_serving()
            added = fleet.add_server()
            fleet.ensure_serving()  # one on its way: not an error
            assert engine.pending_servers() == (added,) and engine.addresses == []
            fleet.update_weights(_publish(fleet_), engine.set_version, 1)
            assert engine.addresses == [added] != [victim]
            request = GenerationRequest(input_ids=PROMPT, sampling=SamplingParams(max_new_tokens=8, greedy=True))
            (response,) = generate_all(engine, [request])
            assert response.output_ids == hf_greedy(fleet_.models[1], PROMPT, 8) and response.versions == [1] * 8


# --------------------------------------------------------------------------- quickstart runs


ELASTIC_RUN = [
    "rollout.max_head_offpolicyness=2",  # asynchronous: requests are in flight at any moment
    "train_dataset.size=25",
    "train_dataset.batch_size=8",
    "stats.eval_every=0",
]


def _server_pids(mark: str) -> list[int]:
    return sorted(
        pid for pid in marked_pids(mark) if b"areal_core.builtin.engine_hf.server" in Path(f"/proc/{pid}/cmdline").read_bytes()
    )


def _steps_done(run_dir: Path) -> int:
    stats = run_dir / "stats.jsonl"
    return len(stats.read_text().splitlines()) if stats.exists() else 0


def _events(run_dir: Path, kind: str) -> list[dict]:
    path = run_dir / "ledger.jsonl"
    return [r for r in read_ledger(path) if r["event"] == kind] if path.exists() else []


def _probe_until_agreed(run_dir: Path, n: int = 8) -> list[dict]:
    """Greedy outputs of every serving server once all of them report one weight version
    (a probe that straddles a weight update is repeated)."""
    for _ in range(50):
        results = control_call(run_dir, "POST", "/servers/probe", {"input_ids": PROMPT, "max_new_tokens": n})["results"]
        if len({v for r in results for v in r["versions"]}) == 1:
            return results
    raise AssertionError(f"servers never agreed on one version: {results}")


def _finish(proc: subprocess.Popen, mark: str) -> str:
    out, _ = proc.communicate(timeout=600)
    assert proc.returncode == 0, out[-4000:]
    wait_until(lambda: not marked_pids(mark), 30, "every process of the run to exit")
    return out


@pytest.mark.slow
def test_killing_one_of_two_servers_loses_no_sample_and_reward_still_rises(tmp_path: Path, marks) -> None:
    mark = marks()
    run_dir = tmp_path / "quickstart" / "kill"
    args = run_args(tmp_path, "kill", *ELASTIC_RUN, "rollout.servers=2", "total_train_steps=80")
    proc = start([sys.executable, str(SCRIPT), *args], mark)
    wait_until(lambda: _steps_done(run_dir) >= 3 or proc.poll() is not None, 300, "step 3")
    assert proc.poll() is None, proc.stdout.read()[-3000:]
    victim = _server_pids(mark)[1]
    os.kill(victim, signal.SIGKILL)
    killed_at = time.time()
    _finish(proc, mark)

    rows = read_ledger(run_dir / "ledger.jsonl")
    result = audit(rows)
    assert result.problems() == []
    assert sum(result.consumed.values()) == 80 * 8  # every step got a full batch
    assert result.outcomes.get("failed", 0) == 0 and result.outcomes.get("rejected", 0) == 0
    (lost,) = _events(run_dir, "server_lost")
    moved = _events(run_dir, "resubmitted")
    assert all(m["from_server"] == lost["address"] and m["uid"] for m in moved)
    curve = rewards(run_dir)
    early, late = sum(curve[:10]) / 10, sum(curve[-10:]) / 10
    assert late > early + 0.05, curve
    moved_uids = {m["uid"] for m in moved}
    done = [r["t"] for r in rows if r["event"] == "accepted" and r["uid"] in moved_uids and r["t"] > killed_at]
    timing = {
        "server_lost_s": round(lost["t"] - killed_at, 3),
        "first_resubmit_s": round(moved[0]["t"] - killed_at, 3) if moved else None,
        "moved_episodes_done_s": round(max(done) - killed_at, 3) if done else None,
        "resubmitted": len(moved),
        "consumed": sum(result.consumed.values()),
        "reward_first10": round(early, 3),
        "reward_last10": round(late, 3),
    }
    print("elastic kill:", json.dumps(timing))


@pytest.mark.slow
def test_a_server_added_mid_run_serves_the_current_weights(tmp_path: Path, marks) -> None:
    """Over xccl: the weight group is re-formed with the new server (world size 2 -> 3)."""
    mark = marks()
    run_dir = tmp_path / "quickstart" / "add"
    args = run_args(tmp_path, "add", *ELASTIC_RUN, "total_train_steps=500", "actor.weight_update=xccl")
    proc = start([sys.executable, str(SCRIPT), *args], mark)
    wait_until(lambda: _steps_done(run_dir) >= 2 or proc.poll() is not None, 300, "step 2")
    assert proc.poll() is None, proc.stdout.read()[-3000:]
    added = _cli("servers", "add", str(run_dir))
    assert added.returncode == 0, added.stderr
    new = added.stdout.split()[0]
    wait_until(lambda: any(e["address"] == new for e in _events(run_dir, "server_joined")), 120, "the new server to join")
    (joined,) = [e for e in _events(run_dir, "server_joined") if e["address"] == new]
    listed = json.loads(_cli("servers", "list", str(run_dir), "--json").stdout)["servers"]
    assert sorted(r["state"] for r in listed) == ["serving", "serving"]

    results = _probe_until_agreed(run_dir)
    assert {r["address"] for r in results} == {r["address"] for r in listed}
    first, second = results
    assert first["output_ids"] == second["output_ids"]  # the same weights ...
    assert first["logprobs"] == pytest.approx(second["logprobs"], abs=1e-5)
    assert first["versions"][0] >= joined["version"] >= 1  # ... of the trainer's current version
    with urllib.request.urlopen(f"http://{new}/health", timeout=10) as resp:
        assert json.loads(resp.read())["served"] > 1  # rollout traffic, not only the probe

    proc.send_signal(signal.SIGINT)
    proc.communicate(timeout=120)
    wait_until(lambda: not marked_pids(mark), 30, "every process of the run to exit")
    assert not (run_dir / CONTROL_FILE).exists()


@pytest.mark.slow
def test_restart_failed_replaces_a_killed_server_mid_run(tmp_path: Path, marks) -> None:
    mark = marks()
    run_dir = tmp_path / "quickstart" / "replace"
    extra = ("rollout.restart_failed=true", "rollout.health_check_interval=1", "total_train_steps=12")
    proc = start([sys.executable, str(SCRIPT), *run_args(tmp_path, "replace", *ELASTIC_RUN, *extra)], mark)
    wait_until(lambda: _steps_done(run_dir) >= 2 or proc.poll() is not None, 300, "step 2")
    assert proc.poll() is None, proc.stdout.read()[-3000:]
    (victim,) = _server_pids(mark)
    os.kill(victim, signal.SIGKILL)  # the only server: nothing is generated until the replacement joins
    killed_at = time.time()
    _finish(proc, mark)

    result = audit(read_ledger(run_dir / "ledger.jsonl"))
    assert result.problems() == [] and sum(result.consumed.values()) == 12 * 8
    (lost,) = _events(run_dir, "server_lost")
    (added,) = _events(run_dir, "server_added")
    (joined,) = _events(run_dir, "server_joined")
    assert added["address"] == joined["address"] != lost["address"]
    print("elastic replace:", json.dumps({"server_lost_s": round(lost["t"] - killed_at, 3), "replacement_serving_s": round(joined["t"] - killed_at, 3)}))
