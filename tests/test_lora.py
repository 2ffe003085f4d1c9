"""LoRA policies (``actor.lora``) in the FSDP2 engine: in this process at world size 1 (real gloo
group), and through the controller's worker processes at world size 2."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import attrs
import pytest
import torch
from safetensors.torch import load_file

from areal_core.config import LoraConfig, load_config
from areal_core.api.engine import GenerationRequest, SamplingParams
from areal_core.api.errors import ConfigError
from areal_core.builtin.engine_hf.client import HFEngine
from areal_core.builtin.platform_cpu.platform import CpuPlatform
from areal_core.plugins import load_plugins
from areal_core.api.scheduler import free_port
from areal_core.scheduler.local import LocalScheduler
from areal_core.testing import (
    check_update_mid_generation,
    generate_all,
    greedy_request,
    hf_greedy,
    load_model,
    perturbed_model,
)
from areal_core.train.fsdp_policy import FSDPPolicy
from test_train_controller import ADVANTAGES, controller, make_config, on_policy, raw_trajs
from test_train_engine import make_batch, make_engine, model_path, process_group  # noqa: F401 - fixtures

LORA = ("actor.lora.rank=4", "actor.lora.alpha=8")


def by_name(engine) -> dict[str, torch.Tensor]:
    return {n: t.clone() for n, t in engine.iter_full_tensors()}


def base_weights(engine) -> dict[str, torch.Tensor]:
    from torch.distributed.tensor import DTensor

    named = engine.model.named_parameters()
    return {n: (p.to_local() if isinstance(p, DTensor) else p).detach().clone() for n, p in named if not p.requires_grad}


def merged_logprobs(adapter_dir, base_path: str, seqs: list[list[int]]) -> list[list[float]]:
    """transformers + peft, adapter merged into the base weights: log-prob of each token."""
    from peft import PeftModel
    from transformers import AutoModelForCausalLM

    base = AutoModelForCausalLM.from_pretrained(base_path, dtype=torch.float32)
    merged = PeftModel.from_pretrained(base, str(adapter_dir)).merge_and_unload().eval()
    out = []
    with torch.no_grad():
        for seq in seqs:
            logp = merged(torch.tensor([seq])).logits[0, :-1].log_softmax(-1)
            out.append([0.0, *logp.gather(-1, torch.tensor(seq[1:])[:, None])[:, 0].tolist()])
    return out


def test_only_the_adapter_trains_and_leaves_as_a_peft_adapter(process_group, model_path, tmp_path):
    engine = make_engine(model_path, *LORA)
    trajs, adv = make_batch(engine)
    base_before, adapter_before = base_weights(engine), by_name(engine)
    assert adapter_before and all(".lora_A.weight" in n or ".lora_B.weight" in n for n in adapter_before)
    assert [s[0] for s in engine.full_tensor_specs()] == list(adapter_before)
    for _ in range(2):
        stats = engine.ppo_update(trajs, adv)
    assert stats["grad_norm"] > 0
    adapter_after = by_name(engine)
    assert all(not torch.equal(adapter_before[n], adapter_after[n]) for n in adapter_after)
    for name, value in base_weights(engine).items():
        assert torch.equal(value, base_before[name]), name
    # AdamW state exists for the adapter only
    state = engine.optimizer.state
    assert len(state) == len(adapter_after) == len(engine.optimizer.param_groups[0]["params"])

    engine.save_hf(tmp_path / "adapter")
    saved = load_file(str(tmp_path / "adapter" / "adapter_model.safetensors"))
    assert set(saved) == set(adapter_after)
    config = json.loads((tmp_path / "adapter" / "adapter_config.json").read_text())
    assert config["base_model_name_or_path"] == model_path and config["r"] == 4
    assert not (tmp_path / "adapter" / "model.safetensors").exists()
    seqs = [t.input_ids for t in trajs]
    want = merged_logprobs(tmp_path / "adapter", model_path, seqs)
    for got, expected in zip(engine.compute_logprobs(seqs), want):
        torch.testing.assert_close(torch.tensor(got), torch.tensor(expected), atol=1e-5, rtol=1e-5)


def test_reference_policy_is_the_base_model(process_group, model_path):
    lora = make_engine(model_path, *LORA, "actor.kl_coef=0.1")
    assert lora.ref_model is None
    trajs, adv = make_batch(lora)
    first = lora.ppo_update(trajs, adv)
    assert first["kl_ref"] == pytest.approx(0.0, abs=1e-7)  # lora_B starts at zero: policy == base
    later = lora.ppo_update(trajs, adv)
    assert later["kl_ref"] > 1e-6
    # the reference forward leaves the adapter on and trainable
    assert len([p for p in lora.model.parameters() if p.requires_grad]) == len(lora.full_tensor_specs())
    from areal_core.train.packing import pack

    seqs = [t.input_ids for t in trajs]
    base = make_engine(model_path)
    ref = lora._ref_logprobs(pack(seqs, list(range(len(seqs))))).split([len(s) for s in seqs])
    for got, want in zip(ref, base.compute_logprobs(seqs)):
        torch.testing.assert_close(got, torch.tensor(want), atol=1e-6, rtol=1e-6)


def test_bad_lora_settings_name_the_key(process_group, model_path):
    with pytest.raises(ConfigError, match=r"^actor\.lora\.target_modules: \['nope'\] matches no layer.*q_proj"):
        make_engine(model_path, "actor.lora.target_modules=[nope]")
    with pytest.raises(ConfigError, match=r"^actor\.lora\.target_modules: \['lm_head'\] adapts the output layer"):
        make_engine(model_path, "actor.lora.target_modules=[lm_head]")
    with pytest.raises(ConfigError, match=r"^actor\.lora\.target_modules: \['embed_tokens'\]: only linear layers"):
        make_engine(model_path, "actor.lora.target_modules=[embed_tokens]")
    with pytest.raises(ConfigError, match=r"^actor\.lora\.dropout: must be < 1"):
        load_config(None, ["actor.lora.dropout=1"])


@pytest.mark.slow
def test_world_size_2_matches_world_size_1(model_path, tmp_path):
    results = {}
    with LocalScheduler(CpuPlatform()) as scheduler:
        for ws in (1, 2):
            config = make_config(model_path, ws)
            actor = attrs.evolve(config.actor, lora=LoraConfig(rank=4, alpha=8), kl_coef=0.05)
            config = attrs.evolve(config, actor=actor)
            with controller(config, scheduler, model_path, tmp_path / f"run{ws}") as trainer:
                initial = trainer.compute_logprobs(raw_trajs())
                trajs = on_policy(raw_trajs(), initial)
                stats = [trainer.train_step(trajs, ADVANTAGES, initial) for _ in range(2)]
                trainer.save_hf(str(tmp_path / f"adapter{ws}"))
            results[ws] = stats, load_file(str(tmp_path / f"adapter{ws}" / "adapter_model.safetensors"))
    (stats1, adapter1), (stats2, adapter2) = results[1], results[2]
    for s1, s2 in zip(stats1, stats2):
        for key in ("loss", "grad_norm", "kl_ref"):
            assert s2[key] == pytest.approx(s1[key], rel=1e-3, abs=1e-6), key
    assert stats2[-1]["kl_ref"] > 0
    assert set(adapter1) == set(adapter2)
    for name in adapter1:
        torch.testing.assert_close(adapter2[name], adapter1[name], rtol=0, atol=5e-5)



# --------------------------------------------------------------------------- adapters on servers

PROMPTS = [[3, 4, 5], [7, 8, 9, 10, 11, 12, 13], [12], [5, 6, 7, 8, 9]]
LOGPROB_ATOL = 1e-4  # as tests/test_hf_engine.py: fp32 server vs fp32 recomputation


@attrs.frozen
class Policy:
    """A trained LoRA engine in this process and its run (the servers' base weights in it)."""

    engine: Any
    config: Any
    base_dir: Path

    def train(self, steps: int) -> None:
        trajs, adv = make_batch(self.engine, seed=steps)
        for _ in range(steps):
            self.engine.ppo_update(trajs, adv)

    def merged(self, tmp: Path) -> Any:
        """transformers' model with the engine's current adapter merged into the base weights."""
        from peft import PeftModel

        self.engine.save_hf(tmp)
        return PeftModel.from_pretrained(load_model(self.base_dir), str(tmp)).merge_and_unload().eval()


@pytest.fixture
def policy(process_group, model_path, tmp_path) -> Policy:
    config = load_config(None, [f"fileroot={tmp_path / 'runs'}", *LORA, "actor.lora.alpha=16", "actor.optimizer.lr=0.05",
                                "actor.max_tokens_per_mb=96", "rollout.request_timeout=60"])
    base_dir = config.run_dir / "weights" / "v0"  # inside the run dir: servers may load it
    perturbed_model(model_path, seed=0).save_pretrained(base_dir)
    config = attrs.evolve(config, model=attrs.evolve(config.model, path=str(base_dir)))
    algorithm = load_plugins(autoload=False).get("algorithm", "grpo")(config.actor)
    engine = FSDPPolicy(config, CpuPlatform(), str(base_dir), algorithm)
    engine.initialize()
    return Policy(engine, config, base_dir)


def check_against_trainer(served_engine: Any, policy: Policy, merged: Any, version: int) -> None:
    """Sampled log-probs equal the trainer's; greedy outputs equal transformers with the adapter
    merged; every token carries ``version``."""
    sampled = [GenerationRequest(input_ids=p, sampling=SamplingParams(max_new_tokens=12, seed=i)) for i, p in enumerate(PROMPTS)]
    responses = generate_all(served_engine, sampled)
    trainer = policy.engine.compute_logprobs([r.input_ids + r.output_ids for r in responses])
    for resp, logp in zip(responses, trainer):
        assert resp.versions == [version] * len(resp.output_ids)
        torch.testing.assert_close(
            torch.tensor(resp.logprobs), torch.tensor(logp[len(resp.input_ids):]), atol=LOGPROB_ATOL, rtol=0
        )
    greedy = generate_all(served_engine, [greedy_request(p, 16) for p in PROMPTS])
    assert [g.output_ids for g in greedy] == [hf_greedy(merged, p, 16) for p in PROMPTS]


@pytest.mark.slow
def test_hf_server_takes_the_adapter_from_disk_and_through_its_channel(policy: Policy, tmp_path) -> None:
    scheduler = LocalScheduler(CpuPlatform())
    try:
        served = HFEngine(policy.config, CpuPlatform())
        served.launch_servers(scheduler)
        base = load_model(policy.base_dir)
        before = [g.output_ids for g in generate_all(served, [greedy_request(p, 16) for p in PROMPTS])]
        assert before == [hf_greedy(base, p, 16) for p in PROMPTS]  # a fresh adapter changes nothing

        policy.train(2)  # disk: the adapter directory alone
        v1 = policy.config.run_dir / "weights" / "v1"
        policy.engine.save_hf(v1)
        assert not (v1 / "model.safetensors").exists()
        served.load_weights_from_disk(str(v1), 1)
        merged = policy.merged(tmp_path / "m1")
        check_against_trainer(served, policy, merged, 1)
        assert [hf_greedy(merged, p, 16) for p in PROMPTS] != before  # the adapter matters

        policy.train(1)  # the hf channel: adapter tensors only, staged, then committed
        spec = served.weight_channel("127.0.0.1", free_port(), "lora_weights")
        assert policy.engine.open_weight_channel(spec) is None
        assert policy.engine.send_weights(2) is None
        served.commit_weights(2)
        policy.engine.close_weight_channel()
        merged2 = policy.merged(tmp_path / "m2")
        check_against_trainer(served, policy, merged2, 2)

        policy.train(1)  # paused mid-generation, updated, resumed: one response over two versions
        v3 = policy.config.run_dir / "weights" / "v3"
        policy.engine.save_hf(v3)

        def update() -> Any:
            served.load_weights_from_disk(str(v3), 3)
            return policy.merged(tmp_path / "m3")

        check_update_mid_generation(served, PROMPTS[0], lambda: served.server_health()[0].running >= 1, (2, 3),
                                    merged2, update)
    finally:
        scheduler.stop_all()
