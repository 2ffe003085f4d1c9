"""Start-up: the inference servers and the training workers load at the same time.

``InferenceEngine.start_servers`` starts the server processes and hands back the wait for them;
``Planes`` starts the training workers and loads the controller's tokenizer in between (on the real
job, in the split layout, a compiled vLLM server takes about 36 s to answer and those about 10 s).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from areal_core.api.http_engine import HTTPServerEngine
from areal_core.builtin.engine_hf.client import HFEngine
from areal_core.builtin.platform_cpu.platform import CpuPlatform
from areal_core.config import Config, ModelConfig, RolloutConfig, TinyModelSpec, load_config
from areal_core.plugins import load_plugins
from areal_core.scheduler.local import LocalScheduler
from areal_core.tiny_model import ensure_tiny_model
from areal_core.train.worker_group import TrainWorkerGroup
from areal_core.trainer import Planes

REPO = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def tiny_model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return ensure_tiny_model(TinyModelSpec(), ["0123456789+= "], tmp_path_factory.mktemp("models"), seed=0)


def test_start_servers_returns_before_the_servers_answer_and_its_wait_attaches_them(
    tmp_path: Path, tiny_model: Path
) -> None:
    config = Config(
        fileroot=str(tmp_path), model=ModelConfig(path=str(tiny_model)), rollout=RolloutConfig(server_startup_timeout=120)
    )
    with LocalScheduler(CpuPlatform()) as scheduler:
        engine = HFEngine(config, CpuPlatform())
        wait_until_up = engine.start_servers(scheduler)
        (started,) = engine._processes
        assert started.alive() and engine.members() == ()  # started, not yet attached
        addresses = wait_until_up()
        assert engine.members() == tuple(addresses) and len(addresses) == 1
        assert engine.health() == [True]


class TrainerStarted(Exception):
    """Raised in place of starting the training workers: the test only needs the order."""


def test_the_training_workers_start_while_the_servers_load_and_a_failed_start_stops_them(
    tmp_path: Path, tiny_model: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    events: list[str] = []
    engines: list[HTTPServerEngine] = []
    start_servers = HTTPServerEngine.start_servers

    def recording_start(engine: HTTPServerEngine, scheduler: Any) -> Any:
        events.append("servers started")
        engines.append(engine)
        wait = start_servers(engine, scheduler)

        def recording_wait() -> list[str]:
            events.append("waited for the servers")
            return wait()

        return recording_wait

    def recording_trainer(group: TrainWorkerGroup) -> TrainWorkerGroup:
        events.append("training workers started")
        raise TrainerStarted

    monkeypatch.setattr(HTTPServerEngine, "start_servers", recording_start)
    monkeypatch.setattr(TrainWorkerGroup, "__enter__", recording_trainer)
    config = load_config(
        REPO / "examples" / "quickstart" / "config.yaml",
        [f"fileroot={tmp_path}", f"model.path={tiny_model}", "reward.workers=1"],
    )
    with pytest.raises(TrainerStarted):
        Planes(config, load_plugins(), CpuPlatform()).__enter__()
    assert events == ["servers started", "training workers started"]
    assert not any(handle.alive() for handle in engines[0]._processes)  # stopped with the failed start
