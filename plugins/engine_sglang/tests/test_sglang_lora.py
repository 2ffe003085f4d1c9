"""LoRA adapters on the sglang engine (``actor.lora``) against FakeSGLangServer (SGLang's native
``/load_lora_adapter`` / ``/unload_lora_adapter`` and ``lora_path`` in ``/generate``): one adapter per
version, requests name it, the previous one unloaded, an update mid-generation; checked against
transformers with the adapter merged into the base weights."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import attrs
import pytest

pytest.importorskip("peft", reason="peft is not installed: pip install 'areal-core[lora]'")

from peft import PeftModel  # noqa: E402

from areal_core.config import Config, LoraConfig, ModelConfig, RolloutConfig, TinyModelSpec  # noqa: E402
from areal_core.api.errors import ArealError  # noqa: E402
from areal_core.builtin.platform_cpu.platform import CpuPlatform
from areal_core.scheduler.local import LocalScheduler  # noqa: E402
from areal_core.testing import (  # noqa: E402
    check_adapter_updates,
    check_update_mid_generation,
    load_model,
    perturbed_model,
    random_adapter,
    sglang_requests_running,
)
from areal_core.tiny_model import ensure_tiny_model  # noqa: E402
from areal_engine_sglang.client import SGLangEngine  # noqa: E402
from areal_engine_sglang.launch import server_command  # noqa: E402

from test_sglang_engine import post, start_fake  # noqa: E402

PROMPTS = [[3, 4, 5], [7, 8, 9, 10, 11, 12, 13], [12], [5, 6, 7, 8, 9]]
LORA = LoraConfig(rank=4, alpha=8, target_modules=["q_proj", "v_proj", "down_proj"])
LOGPROB_ATOL = 1e-4  # fp32 transformers on both sides


def test_lora_flags() -> None:
    config = Config(model=ModelConfig(path="m"), actor=attrs.evolve(Config().actor, lora=LORA))
    cmd = server_command(config, port=1, seed=1, token="t")
    assert "--enable-lora" in cmd and cmd[cmd.index("--max-lora-rank") + 1] == "4"
    assert cmd[cmd.index("--lora-target-modules") + 1 :] == ["q_proj", "v_proj", "down_proj"]
    assert "--enable-lora" not in server_command(Config(model=ModelConfig(path="m")), port=1, seed=1, token="t")


@pytest.mark.slow
def test_adapter_updates_follow_transformers_with_merged_weights(tmp_path: Path) -> None:
    base = ensure_tiny_model(TinyModelSpec(), ["abcdefghij0123456789+-= "], tmp_path / "models", seed=0)
    base_model = perturbed_model(base, seed=0)
    base_model.save_pretrained(tmp_path / "base")
    config = Config(fileroot=str(tmp_path), model=ModelConfig(path=str(tmp_path / "base")),
                    rollout=RolloutConfig(engine="sglang"), actor=attrs.evolve(Config().actor, lora=LORA))
    engine = SGLangEngine(config, CpuPlatform())
    with LocalScheduler(CpuPlatform()) as scheduler:
        start_fake(scheduler, engine, tmp_path / "fake.log")
        (address,) = engine.addresses
        check_adapter_updates(engine, tmp_path / "base", tmp_path, LORA, PROMPTS, LOGPROB_ATOL, lambda e: e.adapter)
        # v1 was unloaded: naming it fails as in SGLang
        status, reply = post(address, "/generate", {"input_ids": PROMPTS[0], "lora_path": "areal-lora-v1"}, engine.token)
        assert status == 400 and "not loaded: areal-lora-v1" in reply["error"]["message"]
        with pytest.raises(ArealError, match="does not exist"):
            engine._broadcast("/unload_lora_adapter", {"lora_name": "areal-lora-v1"})
        # an adapter update while a request decodes: it finishes under the new adapter
        merged2 = PeftModel.from_pretrained(load_model(tmp_path / "base"), str(tmp_path / "v2")).merge_and_unload()

        def update() -> Any:
            merged3 = random_adapter(tmp_path / "base", tmp_path / "v3", LORA, seed=3)
            engine.load_weights_from_disk(str(tmp_path / "v3"), 3)
            return merged3

        check_update_mid_generation(engine, PROMPTS[0], lambda: sglang_requests_running(engine) >= 1, (2, 3),
                                    merged2.eval(), update, tol=LOGPROB_ATOL)
        assert engine.adapter == "areal-lora-v3"
