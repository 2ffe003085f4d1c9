"""Faults injected in the middle of a weight update (real hf servers, the xccl channel over gloo).

Each test starts two servers on the same weights, publishes version 1, then injects its fault
while version 2's buckets are on their way (the trainer double's tensor source fires it once the
first bucket is out). For every fault: the update finishes (on the survivor) or aborts within 2x
``actor.weight_update_timeout_s``, every live server then serves identical weights under the same
version, and generation goes on. ``python -m pytest -s tests/test_update_faults.py`` prints the
detect and recovery times (docs/elastic.md has a copy).
"""

from __future__ import annotations

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
from areal_core.api.errors import ArealError, ProcessFailedError
from areal_core.builtin.engine_hf.client import HFEngine
from areal_core.builtin.engine_hf.server import FAIL_COMMIT_ENV
from areal_core.builtin.platform_cpu.platform import CpuPlatform
from areal_core.plugins import load_plugins
from areal_core.rollout.fleet import ServerFleet
from areal_core.scheduler.local import LocalScheduler
from areal_core.testing import generate_all, greedy_request, perturbed_model
from areal_core.tiny_model import ensure_tiny_model
from areal_core.api.weight_channel import ChannelSpec, WeightChannel, open_channel
from areal_core.api.weights import WeightUpdateError

DEADLINE_S = 10.0
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
        self._channel: WeightChannel | None = None

    def save_hf(self, path: str) -> None:
        self.model.save_pretrained(path)

    def specs(self) -> list[tuple[str, str, tuple[int, ...]]]:
        return [(name, "float32", tuple(p.shape)) for name, p in self.model.named_parameters()]

    def __iter__(self) -> Iterator[tuple[str, torch.Tensor]]:
        named = list(self.model.named_parameters())
        for i, (name, param) in enumerate(named):
            if i == len(named) // 2 and self.fault is not None:
                fault, self.fault = self.fault, None
                fault()
            yield name, param.detach()

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


@attrs.define
class Rig:
    config: Config
    engine: HFEngine
    scheduler: LocalScheduler
    fleet: ServerFleet
    trainer: FaultyTrainer
    updater: Any

    def update(self, version: int) -> None:
        """As the trainer loop does: paused, through the fleet (which retries on survivors)."""
        self.engine.pause()
        try:
            self.fleet.update_weights(self.updater.update, self.engine.set_version, version)
        finally:
            self.engine.resume()

    def handle(self, index: int) -> Any:
        address = self.engine.addresses[index]
        return self.engine._handles[address]

    def assert_consistent(self) -> None:
        """Every live server: the same weights, the same version, and generation works."""
        digests = self.engine.weights_digest()
        assert len(digests) >= 1 and all(d == digests[0] for d in digests)
        versions = {h.version for h in self.engine.server_health()}
        assert len(versions) == 1
        (response,) = generate_all(self.engine, [greedy_request([3, 4, 5], 8)])
        assert response.versions == [versions.pop()] * 8


@pytest.fixture(scope="module")
def base_model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return ensure_tiny_model(TinyModelSpec(), ["abcdefghij0123456789+-= "], tmp_path_factory.mktemp("models"), seed=0)


@pytest.fixture
def rig(tmp_path: Path, base_model: Path, request: pytest.FixtureRequest) -> Iterator[Rig]:
    """Two hf servers on ``base_model``, a fleet watching them, version 1 published to both."""
    env = getattr(request, "param", {})
    config = load_config(None, [
        f"fileroot={tmp_path}", f"model.path={base_model}", "rollout.servers=2", "actor.weight_update=xccl",
        "actor.weight_chunked_mem_mb=1", f"actor.weight_update_timeout_s={DEADLINE_S}",
        "rollout.health_check_interval=0.5", "rollout.health_timeout_s=3", "rollout.server_startup_timeout=120",
    ])  # fmt: skip
    scheduler = LocalScheduler(CpuPlatform())
    saved = {k: os.environ.get(k) for k in env}
    os.environ.update(env)  # the servers inherit it
    try:
        engine = HFEngine(config, CpuPlatform())
        engine.launch_servers(scheduler)
        for key, value in saved.items():
            os.environ.pop(key) if value is None else os.environ.__setitem__(key, value)
        trainer = FaultyTrainer(base_model, seed=1)
        updater = load_plugins().get("weight_updater", "xccl")(config, CpuPlatform())
        updater.connect(trainer, engine)
        with ServerFleet(engine, config) as fleet:
            r = Rig(config, engine, scheduler, fleet, trainer, updater)
            r.update(1)
            r.assert_consistent()
            yield r
        updater.close()
    finally:
        scheduler.stop_all()


def run_fault(r: Rig, name: str, fault: Callable[[], None]) -> str:
    """Update to version 2 with ``fault`` fired mid-update; then recover with version 3."""
    r.trainer.fault = fault
    r.trainer.model = perturbed_model_like(r.trainer.model, seed=2)
    start = time.monotonic()
    try:
        r.update(2)
        outcome = "finished on the survivor"
    except WeightUpdateError:
        outcome = "aborted"
    detect = time.monotonic() - start
    assert detect < 2 * DEADLINE_S + 5.0  # + the fleet's 5 s grace for a lost server
    r.assert_consistent()
    start = time.monotonic()
    r.update(3)
    recover = time.monotonic() - start
    r.assert_consistent()
    assert {h.version for h in r.engine.server_health()} == {3}
    TIMES.append((name, outcome, detect, recover))
    return outcome


def perturbed_model_like(model: Any, seed: int) -> Any:
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for param in model.parameters():
            param.add_(torch.randn(param.shape, generator=gen) * 0.1)
    return model


@pytest.mark.slow
def test_sigkill_of_one_of_two_servers_mid_bucket(rig: Rig) -> None:
    victim = rig.handle(1)
    outcome = run_fault(rig, "SIGKILL one of two servers", lambda: os.kill(victim.pid, signal.SIGKILL))
    assert outcome == "finished on the survivor" and len(rig.engine.addresses) == 1


@pytest.mark.slow
def test_sigstop_of_one_of_two_servers_mid_bucket(rig: Rig) -> None:
    victim = rig.handle(1)
    outcome = run_fault(rig, "SIGSTOP one of two servers", lambda: os.kill(victim.pid, signal.SIGSTOP))
    assert outcome == "finished on the survivor" and len(rig.engine.addresses) == 1
    assert not victim.alive()  # found hung and stopped for good


@pytest.mark.slow
@pytest.mark.parametrize("rig", [{FAIL_COMMIT_ENV: "2"}], indirect=True)
def test_a_commit_that_raises_on_one_server(rig: Rig) -> None:
    outcome = run_fault(rig, "a commit raises (test hook)", lambda: None)
    assert outcome == "aborted" and len(rig.engine.addresses) == 2


@pytest.mark.slow
def test_trainer_rank0_failing_mid_bucket_stops_the_run_and_leaves_the_servers_consistent(rig: Rig) -> None:
    """SIMULATED: the double raises the error the train controller raises when rank 0's process
    dies (a real SIGKILL of a worker is covered by tests/test_trainer_kill.py). The update is not
    swallowed as an aborted one: the run must stop (and recover); the servers keep version 1."""

    def rank0_dies() -> None:
        raise ProcessFailedError("trainer0 exited (code -9) during SendWeights")

    rig.trainer.fault = rank0_dies
    start = time.monotonic()
    with pytest.raises(ProcessFailedError, match="trainer0 exited"):
        rig.update(2)
    TIMES.append(("trainer rank 0 fails (simulated)", "run stops (exit 3)", time.monotonic() - start, 0.0))
    rig.assert_consistent()
    assert {h.version for h in rig.engine.server_health()} == {1}
