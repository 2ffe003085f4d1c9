"""The disk weight path end to end: a trainer double writes, two real hf servers load.

``InProcessHFTrainer`` stands in for ``TrainWorkerGroup`` (only ``save_hf`` is used); its
``train_step`` adds noise to the weights so the greedy answer changes after an update.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import torch

from areal_core.config import Config, ModelConfig, RolloutConfig, TinyModelSpec
from areal_core.api.engine import GenerationRequest, GenerationResponse, SamplingParams
from areal_core.api.errors import ArealError
from areal_core.builtin.engine_hf.client import HFEngine
from areal_core.builtin.platform_cpu.platform import CpuPlatform
from areal_core.plugins import load_plugins
from areal_core.scheduler.local import LocalScheduler
from areal_core.tiny_model import ensure_tiny_model
from areal_core.api.weights import SupportsStaging, WeightUpdateError

PROMPT = [3, 4, 5, 6]
N_TOKENS = 24


class InProcessHFTrainer:
    """Test double for ``TrainWorkerGroup``: a transformers model in this process with ``save_hf``."""

    def __init__(self, model_dir: Path) -> None:
        from transformers import AutoModelForCausalLM, AutoTokenizer

        self.model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).eval()
        self.tokenizer = AutoTokenizer.from_pretrained(model_dir)

    def train_step(self, seed: int, scale: float = 0.3) -> None:
        """Stands in for an optimizer step: N(0, scale) noise on every parameter."""
        gen = torch.Generator().manual_seed(seed)
        with torch.no_grad():
            for param in self.model.parameters():
                param.add_(torch.randn(param.shape, generator=gen) * scale)

    def greedy(self, prompt: list[int], n: int) -> list[int]:
        out = self.model.generate(torch.tensor([prompt]), do_sample=False, max_new_tokens=n, pad_token_id=0)
        return out[0, len(prompt) :].tolist()

    def save_hf(self, path: str) -> None:
        self.model.save_pretrained(path)
        self.tokenizer.save_pretrained(path)


class CrashingTrainer(InProcessHFTrainer):
    """Writes part of a model directory, then fails (a trainer dying mid-save)."""

    def save_hf(self, path: str) -> None:
        self.tokenizer.save_pretrained(path)
        raise RuntimeError("trainer died while saving")


class CorruptingTrainer(InProcessHFTrainer):
    """Publishes a weights file no server can read (truncated safetensors)."""

    def save_hf(self, path: str) -> None:
        super().save_hf(path)
        weights = Path(path) / "model.safetensors"
        weights.write_bytes(weights.read_bytes()[:100])


@pytest.fixture(scope="module")
def setup(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Config, HFEngine, Path]]:
    root = tmp_path_factory.mktemp("disk")
    base = ensure_tiny_model(TinyModelSpec(), ["abcdefghij0123456789+-= "], root / "models", seed=0)
    trainer = InProcessHFTrainer(base)
    trainer.train_step(seed=0)  # varied greedy outputs instead of one repeated token
    trainer.model.generation_config.eos_token_id = trainer.model.config.eos_token_id = None  # fixed lengths
    trainer.save_hf(str(root / "model"))
    config = Config(
        fileroot=str(root / "runs"),
        model=ModelConfig(path=str(root / "model")),
        rollout=RolloutConfig(servers=2, server_startup_timeout=120, request_timeout=60),
    )
    scheduler = LocalScheduler(CpuPlatform())
    try:
        engine = HFEngine(config, CpuPlatform())
        engine.launch_servers(scheduler)
        yield config, engine, root / "model"
    finally:
        scheduler.stop_all()


def updater_for(config: Config) -> Any:
    return load_plugins().get("weight_updater", "disk")(config, CpuPlatform())


def greedy_on_every_server(engine: HFEngine) -> list[GenerationResponse]:
    """Two concurrent requests: the router sends one to each server."""

    async def run() -> list[GenerationResponse]:
        params = SamplingParams(max_new_tokens=N_TOKENS, greedy=True)
        requests = [GenerationRequest(input_ids=PROMPT, sampling=params) for _ in range(2)]  # fresh ids
        return await asyncio.gather(*(engine.agenerate(r) for r in requests))

    before = [h.served for h in engine.server_health()]
    responses = asyncio.run(run())
    assert [h.served - b for h, b in zip(engine.server_health(), before)] == [1, 1]
    return responses


@pytest.mark.slow
def test_update_makes_every_server_serve_the_trainers_weights(setup: tuple[Config, HFEngine, Path]) -> None:
    config, engine, model_dir = setup
    trainer = InProcessHFTrainer(model_dir)
    old = trainer.greedy(PROMPT, N_TOKENS)
    assert [r.output_ids for r in greedy_on_every_server(engine)] == [old, old]

    trainer.train_step(seed=1, scale=0.1)
    new = trainer.greedy(PROMPT, N_TOKENS)
    assert new != old
    updater = updater_for(config)
    updater.connect(trainer, engine)
    updater.update(1)
    for resp in greedy_on_every_server(engine):
        assert resp.output_ids == new and resp.versions == [1] * N_TOKENS
    assert [h.version for h in engine.server_health()] == [1, 1]

    trainer.train_step(seed=2, scale=0.1)
    updater.update(2)
    assert "v1" not in {p.name for p in updater.weights_dir.iterdir()}  # pruned at once (deleted in the background)
    updater.close()
    assert sorted(p.name for p in updater.weights_dir.iterdir()) == ["v2"]  # v1 deleted, no temp dirs
    assert [r.output_ids for r in greedy_on_every_server(engine)] == [trainer.greedy(PROMPT, N_TOKENS)] * 2


class CountingTrainer(InProcessHFTrainer):
    """Counts its saves."""

    saves = 0

    def save_hf(self, path: str) -> None:
        self.saves += 1
        super().save_hf(path)


@pytest.mark.slow
def test_staging_writes_the_version_while_the_servers_serve_the_old_one_and_the_update_only_loads_it(
    setup: tuple[Config, HFEngine, Path],
) -> None:
    config, engine, model_dir = setup
    trainer = CountingTrainer(model_dir)
    updater = updater_for(config)
    assert isinstance(updater, SupportsStaging)
    updater.connect(trainer, engine)
    updater.update(6)
    served = [r.output_ids for r in greedy_on_every_server(engine)]

    trainer.train_step(seed=6, scale=0.1)
    updater.stage(7)
    assert trainer.saves == 2 and updater.version_dir(7).is_dir()
    assert [h.version for h in engine.server_health()] == [6, 6]
    assert [r.output_ids for r in greedy_on_every_server(engine)] == served  # generation goes on, unchanged
    updater.update(7)
    assert trainer.saves == 2  # the staged files, not written again
    assert [r.output_ids for r in greedy_on_every_server(engine)] == [trainer.greedy(PROMPT, N_TOKENS)] * 2
    updater.close()
    assert sorted(p.name for p in updater.weights_dir.iterdir()) == ["v7"]

    updater.update(7)  # a re-publish (a server joining) writes the files again
    assert trainer.saves == 3


@pytest.mark.slow
def test_a_crash_mid_write_never_leaves_a_loadable_version(setup: tuple[Config, HFEngine, Path]) -> None:
    config, engine, model_dir = setup
    updater = updater_for(config)
    updater.connect(CrashingTrainer(model_dir), engine)
    served_before = [h.version for h in engine.server_health()]
    with pytest.raises(RuntimeError, match="died while saving"):
        updater.update(9)
    assert not updater.version_dir(9).exists()
    assert not [p for p in updater.weights_dir.iterdir() if p.name.startswith(".")]

    # a writer killed before the rename leaves a complete-looking temp dir: servers refuse it
    leftover = updater.weights_dir / ".tmp-v9-killed"
    InProcessHFTrainer(model_dir).save_hf(str(leftover))
    with pytest.raises(ArealError, match="starts with '.'"):
        engine.load_weights_from_disk(str(leftover), 9)
    assert [h.version for h in engine.server_health()] == served_before
    updater.connect(InProcessHFTrainer(model_dir), engine)  # the next run cleans it up
    assert not leftover.exists()


@pytest.mark.slow
def test_servers_refuse_weights_outside_the_run_dir(setup: tuple[Config, HFEngine, Path]) -> None:
    _, engine, model_dir = setup
    with pytest.raises(ArealError, match="outside the server's --allowed-root"):
        engine.load_weights_from_disk(str(model_dir), 5)


@pytest.mark.slow
def test_a_version_no_server_can_read_aborts_and_every_server_keeps_serving(setup: tuple[Config, HFEngine, Path]) -> None:
    config, engine, model_dir = setup
    good = InProcessHFTrainer(model_dir)
    updater = updater_for(config)
    updater.connect(good, engine)
    good.train_step(seed=3, scale=0.1)
    updater.update(3)
    served = [r.output_ids for r in greedy_on_every_server(engine)]

    corrupt = CorruptingTrainer(model_dir)
    corrupt.train_step(seed=4, scale=0.1)
    updater.connect(corrupt, engine)
    with pytest.raises(WeightUpdateError, match="could not load version 4, so every server serves version 3"):
        updater.update(4)
    assert [h.version for h in engine.server_health()] == [3, 3] and not updater.version_dir(4).exists()
    assert [r.output_ids for r in greedy_on_every_server(engine)] == served  # generation goes on, unchanged

    updater.connect(good, engine)
    good.train_step(seed=5, scale=0.1)
    updater.update(5)
    assert [r.output_ids for r in greedy_on_every_server(engine)] == [good.greedy(PROMPT, N_TOKENS)] * 2
