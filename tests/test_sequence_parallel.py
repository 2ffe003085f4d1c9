"""actor.sequence_parallel: Ulysses SP over real gloo ranks equals one rank on the same batch.

Each run is a real ``FSDPPolicy`` in spawned processes: ``sp=1`` on one rank (the reference),
``sp=2`` on two, and ``dp=2 x sp=2`` on four. On the same packed micro-batch of sequences of
uneven lengths they must give the same log-probs and entropies, the same proximal pass, the same
loss and gradients of one train step and the same parameters after it, with and without LoRA; a
checkpoint written at ``sp=2`` loads at ``sp=1``. Two models: the tiny Qwen3 (4 heads, 2 kv heads:
kv heads split over the ranks) and a Llama-shaped one with one kv head (repeated to one per rank).
"""

from __future__ import annotations

import math
import os
from pathlib import Path
from typing import Any

import pytest
import torch

from areal_core.api.errors import ConfigError
from areal_core.config import TinyModelSpec, load_config
from areal_core.tiny_model import ensure_tiny_model

CORPUS = ["0123456789+-=? abcdefghij"]
LENGTHS = [23, 5, 40, 11, 2, 17]  # 98 tokens: the one-row layout pads to a multiple of the SP size
TOL = {"rtol": 2e-5, "atol": 2e-6}


def _trajectories(vocab: int):
    from areal_core.api.trajectory import Trajectory

    gen = torch.Generator().manual_seed(3)
    trajs = []
    for i, n in enumerate(LENGTHS):
        ids = torch.randint(2, vocab, (n,), generator=gen).tolist()
        prompt = min(3, n - 1)
        mask = [0] * prompt + [1] * (n - prompt)
        # about the random model's own log-probs (-3.3 to -3.7 here), so that IcePop keeps most
        logprobs = [(-3.4 + 0.8 * math.sin(t)) * m for t, m in enumerate(mask)]
        trajs.append(Trajectory(uid=str(i), prompt_id=str(i // 2), input_ids=ids, loss_mask=mask, logprobs=logprobs,
                                versions=[0 if m else -1 for m in mask], reward=float(i % 2)))  # fmt: skip
    return trajs, [1.0, -1.0, 0.5, -0.5, 1.5, -1.5]


def _worker(
    rank: int, world: int, sp: int, store: str, model_path: str, out: str, load: str | None, extra: list[str]
) -> None:
    import torch.distributed as dist

    from areal_core.builtin.platform_cpu import CpuPlatform
    from areal_core.plugins import load_plugins
    from areal_core.train.fsdp_policy import FSDPPolicy

    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"file://{store}", rank=rank, world_size=world)
    try:
        config = load_config(None, [f"model.path={model_path}", f"actor.world_size={world}",
                                    f"actor.sequence_parallel={sp}", "actor.max_tokens_per_mb=4096",
                                    "actor.ppo_n_minibatches=2",
                                    # AdamW with eps 1 moves by about lr * gradient: no sign(gradient) steps that
                                    # would blow float noise on near-zero gradients up to lr
                                    "actor.optimizer.lr=1.0", "actor.optimizer.eps=1.0", *extra])  # fmt: skip
        algorithm = load_plugins(autoload=False).get("algorithm", config.actor.algorithm)(config.actor)
        engine = FSDPPolicy(config, CpuPlatform(), model_path, algorithm)
        engine.initialize()
        vocab = engine.model.lm.config.vocab_size
        trajs, adv = _trajectories(vocab)
        seqs = [t.input_ids for t in trajs]
        result: dict[str, Any] = {}
        if load is not None:
            engine.load_checkpoint(load)
        else:
            named = engine.model.named_parameters()
            result["init"] = {n: p.full_tensor().detach().clone() for n, p in named if p.requires_grad}
            with torch.no_grad():
                logp, entropy = engine._logprobs(engine.model, engine._pack(seqs, range(len(seqs))), with_entropy=True)
            masks = [t.loss_mask for t in trajs]
            result.update(logp=logp, entropy=entropy, prox=engine.compute_logprobs(seqs), masks=masks,
                          prox_scored=engine.compute_logprobs(seqs, scored=masks))
            result["stats"] = engine.ppo_update(trajs, adv, recompute_prox=True)
            result["grads"] = {n: p.grad.full_tensor() for n, p in engine.model.named_parameters() if p.requires_grad}
            engine.save_checkpoint(str(Path(out).parent / f"ckpt-sp{sp}"))
        result["params"] = {n: p.full_tensor().detach() for n, p in engine.model.named_parameters()}
        if rank == 0:
            torch.save(result, out)
        dist.barrier()
    finally:
        dist.destroy_process_group()
    os._exit(0)  # gloo's threads can abort interpreter teardown after the work is saved


def _run(
    tmp: Path, model_path: str, world: int, sp: int, load: str | None = None, extra: tuple[str, ...] = ()
) -> dict[str, Any]:
    import torch.multiprocessing as mp

    out = tmp / f"w{world}-sp{sp}-{'load' if load else 'train'}.pt"
    store = tmp / f"store-{out.stem}"
    mp.spawn(_worker, args=(world, sp, str(store), model_path, str(out), load, list(extra)), nprocs=world, join=True)
    return torch.load(out)


def _llama_model(root: Path) -> str:
    """A Llama-shaped model with one kv head (MQA), saved as an HF directory."""
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    config = LlamaConfig(vocab_size=40, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                         num_attention_heads=4, num_key_value_heads=1, max_position_embeddings=256,
                         tie_word_embeddings=True)  # fmt: skip
    path = root / "tiny-llama"
    LlamaForCausalLM(config).save_pretrained(path)
    return str(path)


@pytest.fixture(scope="module", params=["qwen3-gqa", "llama-mqa"])
def model_path(request, tmp_path_factory) -> str:
    root = tmp_path_factory.mktemp("models")
    if request.param == "qwen3-gqa":
        return str(ensure_tiny_model(TinyModelSpec(), CORPUS, root, seed=0))
    return _llama_model(root)


@pytest.fixture(scope="module")
def reference(model_path, tmp_path_factory) -> dict[str, Any]:
    return _run(tmp_path_factory.mktemp("sp1"), model_path, world=1, sp=1)


def _assert_same_step(got: dict[str, Any], want: dict[str, Any]) -> None:
    torch.testing.assert_close(got["logp"], want["logp"], **TOL)
    torch.testing.assert_close(got["entropy"], want["entropy"], **TOL)
    for a, b in zip(got["prox"] + got["prox_scored"], want["prox"] + want["prox_scored"]):
        torch.testing.assert_close(torch.tensor(a), torch.tensor(b), **TOL)
    compared = ("loss", "grad_norm", "clip_frac", "masked_frac", "n_loss_tokens", "imp_weight_mean", "mismatch/abs_mean")
    for key in compared:
        assert got["stats"][key] == pytest.approx(want["stats"][key], rel=1e-5, abs=1e-7), key
    for name, grad in want["grads"].items():
        torch.testing.assert_close(got["grads"][name], grad, **TOL, msg=name)
    for name, param in want["params"].items():
        torch.testing.assert_close(got["params"][name], param, **TOL, msg=name)


@pytest.mark.slow
def test_two_ranks_equal_one(model_path, reference, tmp_path):
    got = _run(tmp_path, model_path, world=2, sp=2)
    assert 0 < got["stats"]["masked_frac"] < 0.5  # the behaviour weights act, and most tokens train
    _assert_same_step(got, reference)
    # with the loss masks as scored tokens, the head runs on the answers alone: the rest comes back 0
    for full, scored, mask in zip(got["prox"], got["prox_scored"], got["masks"]):
        torch.testing.assert_close(torch.tensor(scored), torch.tensor([x * m for x, m in zip(full, mask)]), **TOL)
    # a checkpoint written at sp=2 loads at sp=1 (one rank) with the same parameters
    loaded = _run(tmp_path, model_path, world=1, sp=1, load=str(tmp_path / "ckpt-sp2"))
    for name, param in got["params"].items():
        torch.testing.assert_close(loaded["params"][name], param, rtol=0, atol=0, msg=name)


@pytest.mark.slow
def test_data_and_sequence_parallel_together(model_path, reference, tmp_path):
    """With activation checkpointing too: its recomputed forward repeats the all-to-alls."""
    if "llama" in model_path:
        pytest.skip("one model is enough for the 4-rank layout")
    _assert_same_step(_run(tmp_path, model_path, world=4, sp=2, extra=("model.gradient_checkpointing=true",)), reference)


@pytest.mark.slow
def test_lora_two_ranks_equal_one(model_path, tmp_path):
    """LoRA adapters (peft layers around the projections that feed the all-to-alls) train the same
    under SP. Two minibatches: the first moves B off zero, so the second gives A a gradient too."""
    if "llama" in model_path:
        pytest.skip("one model is enough for LoRA")
    lora = ("actor.lora.rank=4", "actor.lora.alpha=8")
    want = _run(tmp_path, model_path, world=1, sp=1, extra=lora)
    got = _run(tmp_path, model_path, world=2, sp=2, extra=lora)
    assert want["grads"] and all("lora_" in name for name in want["grads"])  # only the adapters train
    for factor in ("lora_A", "lora_B"):
        assert any(not torch.equal(got["params"][n], p) for n, p in got["init"].items() if factor in n), factor
    _assert_same_step(got, want)


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        (["actor.sequence_parallel=2"], "actor.sequence_parallel: 2 does not divide actor.world_size=1"),
        (["actor.world_size=3", "actor.sequence_parallel=3"], "actor.sequence_parallel: 3 does not divide the model's 4 attention heads"),
        (["actor.world_size=3", "actor.sequence_parallel=3", "model.tiny.num_heads=6", "model.tiny.num_kv_heads=2"],
         "actor.sequence_parallel: 3 and the model's 2 kv heads do not divide one another"),
    ],
)  # fmt: skip
def test_sizes_that_do_not_divide_are_one_line(overrides, message):
    with pytest.raises(ConfigError) as info:
        load_config(None, overrides)
    assert str(info.value).startswith(message) and "\n" not in str(info.value)
