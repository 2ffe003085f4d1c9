"""LoRA adapters on the sglang engine (``actor.lora``) against FakeSGLangServer (SGLang's native
``/load_lora_adapter`` / ``/unload_lora_adapter`` and ``lora_path`` in ``/generate``): one adapter per
version, requests name it, the previous one unloaded; checked against transformers with the
adapter merged into the base weights."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import attrs
import pytest
import torch

pytest.importorskip("peft", reason="peft is not installed: pip install 'areal-core[lora]'")

from areal_core.config import Config, LoraConfig, ModelConfig, RolloutConfig, TinyModelSpec  # noqa: E402
from areal_core.engine import GenerationRequest, SamplingParams  # noqa: E402
from areal_core.errors import ArealError  # noqa: E402
from areal_core.platform import CpuPlatform  # noqa: E402
from areal_core.scheduler.base import ProcessSpec, free_port  # noqa: E402
from areal_core.scheduler.local import LocalScheduler  # noqa: E402
from areal_core.testing import generate_all, greedy_request, hf_greedy, load_model, perturbed_model  # noqa: E402
from areal_core.tiny_model import ensure_tiny_model  # noqa: E402
from areal_core.train.lora import peft_config  # noqa: E402
from areal_engine_sglang.client import SGLangEngine  # noqa: E402
from areal_engine_sglang.launch import server_command  # noqa: E402

from test_sglang_engine import FAKE_SGLANG, SGLANG_PYTHON, post  # noqa: E402

PROMPTS = [[3, 4, 5], [7, 8, 9, 10, 11, 12, 13], [12], [5, 6, 7, 8, 9]]
LORA = LoraConfig(rank=4, alpha=8, target_modules=["q_proj", "v_proj", "down_proj"])
LOGPROB_ATOL = 1e-4  # fp32 transformers on both sides


def adapter(base_dir: Path, out: Path, seed: int) -> Any:
    """A peft adapter with random weights on ``base_dir``, saved at ``out``; the merged model."""
    from peft import get_peft_model

    model = get_peft_model(load_model(base_dir), peft_config(LORA, str(base_dir)))
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, param in model.named_parameters():
            if ".lora_" in name:
                param.copy_(torch.randn(param.shape, generator=gen) * 0.3)
    model.save_pretrained(out)
    return model.merge_and_unload().eval()


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
    port = free_port()
    cmd = [SGLANG_PYTHON, str(FAKE_SGLANG), *server_command(config, port, seed=1, token=engine.token)[2:]]
    with LocalScheduler(CpuPlatform()) as scheduler:
        scheduler.start(ProcessSpec(name="fake_sglang", cmd=cmd, log_file=str(tmp_path / "fake.log")))
        address = f"127.0.0.1:{port}"
        deadline = time.monotonic() + 180
        while not engine.server_is_up(address):
            assert time.monotonic() < deadline, (tmp_path / "fake.log").read_text()[-2000:]
            time.sleep(0.2)
        engine.attach([address])
        greedy = [greedy_request(p, 12) for p in PROMPTS]
        assert [r.output_ids for r in generate_all(engine, greedy)] == [hf_greedy(base_model, p, 12) for p in PROMPTS]
        for version in (1, 2):
            merged = adapter(tmp_path / "base", tmp_path / f"v{version}", seed=version)
            engine.pause()
            engine.load_weights_from_disk(str(tmp_path / f"v{version}"), version)
            engine.resume()
            assert engine.adapter == f"areal-lora-v{version}"
            responses = generate_all(engine, greedy)
            assert [r.output_ids for r in responses] == [hf_greedy(merged, p, 12) for p in PROMPTS]
            assert all(r.versions == [version] * 12 for r in responses)
            sampled = [GenerationRequest(input_ids=p, sampling=SamplingParams(max_new_tokens=12, seed=i))
                       for i, p in enumerate(PROMPTS)]
            for resp in generate_all(engine, sampled):
                ids = torch.tensor([resp.input_ids + resp.output_ids])
                with torch.no_grad():
                    logits = merged(ids).logits[0, len(resp.input_ids) - 1 : -1]
                want = logits.log_softmax(-1).gather(-1, torch.tensor(resp.output_ids)[:, None])[:, 0]
                torch.testing.assert_close(torch.tensor(resp.logprobs), want, atol=LOGPROB_ATOL, rtol=0)
        assert [r.output_ids for r in responses] != [hf_greedy(base_model, p, 12) for p in PROMPTS]
        # v1 was unloaded: naming it fails as in SGLang
        status, reply = post(address, "/generate", {"input_ids": PROMPTS[0], "lora_path": "areal-lora-v1"}, engine.token)
        assert status == 400 and "not loaded: areal-lora-v1" in reply["error"]["message"]
        with pytest.raises(ArealError, match="does not exist"):
            engine._broadcast("/unload_lora_adapter", {"lora_name": "areal-lora-v1"})
