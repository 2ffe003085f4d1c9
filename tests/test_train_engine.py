"""The FSDP2 train engine in this process: world size 1 over a real gloo process group."""

from __future__ import annotations

import math
import random
import socket

import attrs
import pytest
import torch
import torch.distributed as dist
from hypothesis import given, settings
from hypothesis import strategies as st

from areal_core.config import OptimizerConfig, TinyModelSpec, load_config
from areal_core.builtin.platform_cpu.platform import CpuPlatform
from areal_core.plugins import load_plugins
from areal_core.tiny_model import ensure_tiny_model
from areal_core.train.fsdp_policy import (
    FSDPPolicy,
    split_minibatches,
    token_balanced_shares,
)
from areal_core.train.optim import build_optimizer, lr_factor
from areal_core.api.trajectory import Trajectory

CORPUS = ["0123456789+-=? abcdefghij"]


@pytest.fixture(scope="module")
def process_group():
    """One real single-rank gloo group shared by every engine in this module."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=0, world_size=1)
    try:
        yield
    finally:
        dist.destroy_process_group()


@pytest.fixture(scope="module")
def model_path(tmp_path_factory):
    return str(ensure_tiny_model(TinyModelSpec(), CORPUS, tmp_path_factory.mktemp("models"), seed=0))


def make_engine(model_path: str, *overrides: str) -> FSDPPolicy:
    config = load_config(None, [f"model.path={model_path}", "actor.max_tokens_per_mb=96", *overrides])
    algorithm = load_plugins(autoload=False).get("algorithm", config.actor.algorithm)(config.actor)
    engine = FSDPPolicy(config, CpuPlatform(), model_path, algorithm)
    engine.initialize()
    return engine


def make_batch(engine: FSDPPolicy, n: int = 8, seed: int = 0) -> tuple[list[Trajectory], list[float]]:
    """On-policy trajectories of random tokens (behaviour log-probs from the engine itself) and
    alternating +1/-1 advantages."""
    rng = random.Random(seed)
    vocab = engine.model.lm.config.vocab_size
    seqs, masks = [], []
    for _ in range(n):
        prompt, completion = rng.randint(2, 8), rng.randint(3, 30)
        seqs.append([rng.randrange(2, vocab) for _ in range(prompt + completion)])
        masks.append([0] * prompt + [1] * completion)
    logps = engine.compute_logprobs(seqs)
    trajs = [
        Trajectory(
            uid=str(i),
            prompt_id=str(i // 4),
            input_ids=s,
            loss_mask=m,
            logprobs=[lp if keep else 0.0 for lp, keep in zip(logp, m)],
            versions=[0 if keep else -1 for keep in m],
            reward=float(i % 2),
        )
        for i, (s, m, logp) in enumerate(zip(seqs, masks, logps))
    ]
    return trajs, [1.0 if i % 2 else -1.0 for i in range(n)]


def params(engine: FSDPPolicy) -> dict[str, torch.Tensor]:
    return {name: t.clone() for name, t in engine.iter_full_tensors()}


def seq_logprob_sums(engine: FSDPPolicy, trajs: list[Trajectory]) -> list[float]:
    logps = engine.compute_logprobs([t.input_ids for t in trajs])
    return [sum(lp for lp, m in zip(logp, t.loss_mask) if m) for logp, t in zip(logps, trajs)]


# ---------------------------------------------------------------------- pure helpers


@given(n=st.integers(1, 40), k=st.integers(1, 8))
@settings(max_examples=50, deadline=None)
def test_split_minibatches_partitions_in_order(n, k):
    if n < k:
        with pytest.raises(ValueError, match="ppo_n_minibatches"):
            split_minibatches(n, k)
        return
    parts = split_minibatches(n, k)
    assert [i for p in parts for i in p] == list(range(n))
    assert max(map(len, parts)) - min(map(len, parts)) <= 1


@given(lengths=st.lists(st.integers(1, 100), max_size=30), ranks=st.integers(1, 4))
@settings(max_examples=50, deadline=None)
def test_token_balanced_shares_partition_and_balance(lengths, ranks):
    shares = token_balanced_shares(lengths, ranks)
    assert sorted(i for s in shares for i in s) == list(range(len(lengths)))
    loads = [sum(lengths[i] for i in s) for s in shares]
    assert max(loads) - min(loads) <= max(lengths, default=0)  # greedy LPT bound


def test_lr_schedule_warmup_then_constant_or_cosine():
    warm = OptimizerConfig(warmup_steps=4, schedule="constant")
    assert [lr_factor(s, warm, 10) for s in range(6)] == [0.25, 0.5, 0.75, 1.0, 1.0, 1.0]
    cos = OptimizerConfig(warmup_steps=2, schedule="cosine", min_lr_ratio=0.1)
    assert lr_factor(2, cos, 12) == pytest.approx(1.0)
    assert lr_factor(7, cos, 12) == pytest.approx(0.1 + 0.9 * 0.5)  # half-way through decay
    assert lr_factor(12, cos, 12) == pytest.approx(0.1)
    assert lr_factor(50, cos, 12) == pytest.approx(0.1)  # past the end: stays at the floor


def test_adamw_takes_the_fused_kernel_where_torch_has_one_with_the_same_steps():
    torch.manual_seed(0)
    start = [torch.randn(64, 32), torch.randn(32)]
    grads = [[torch.randn_like(t) for t in start] for _ in range(3)]
    config = OptimizerConfig(lr=1e-2, weight_decay=0.1)
    results = {}
    for kernel in ("fused", "foreach"):
        params = [torch.nn.Parameter(t.clone()) for t in start]
        if kernel == "fused":
            optimizer, _ = build_optimizer(params, config, total_steps=3)
        else:  # what torch runs without the fused kernel
            optimizer = torch.optim.AdamW(params, lr=config.lr, betas=(config.beta1, config.beta2),
                                          eps=config.eps, weight_decay=config.weight_decay, foreach=True)
        assert bool(optimizer.defaults["fused"]) is (kernel == "fused")
        for step_grads in grads:
            for p, g in zip(params, step_grads):
                p.grad = g.clone()
            optimizer.step()
        results[kernel] = [p.detach() for p in params]
    for fused, looped, initial in zip(results["fused"], results["foreach"], start):
        assert not torch.equal(fused, initial)
        torch.testing.assert_close(fused, looped, rtol=1e-5, atol=1e-6)
    meta = [torch.nn.Parameter(torch.empty(4, device="meta"))]  # a device without the fused kernel
    optimizer, _ = build_optimizer(meta, config, total_steps=1)
    assert optimizer.defaults["foreach"] is True and not optimizer.defaults["fused"]


# ---------------------------------------------------------------------- engine


def test_compute_logprobs_matches_plain_hf_forward(process_group, model_path):
    from transformers import AutoModelForCausalLM

    engine = make_engine(model_path, "actor.max_tokens_per_mb=40")  # several packed micro-batches
    rng = random.Random(1)
    seqs = [[rng.randrange(2, 20) for _ in range(rng.randint(1, 35))] for _ in range(9)]
    got = engine.compute_logprobs(seqs)
    reference = AutoModelForCausalLM.from_pretrained(model_path, dtype=torch.float32)
    for seq, logp in zip(seqs, got):
        with torch.no_grad():
            logits = reference(torch.tensor([seq])).logits[0].float()
        expected = [0.0] + logits[:-1].log_softmax(-1).gather(-1, torch.tensor(seq[1:])[:, None])[:, 0].tolist()
        assert len(logp) == len(seq)
        assert logp == pytest.approx(expected, abs=2e-5)


def test_train_step_raises_advantage_weighted_likelihood(process_group, model_path):
    engine = make_engine(model_path, "actor.ppo_n_minibatches=2")
    trajs, adv = make_batch(engine)
    before_params, before = params(engine), seq_logprob_sums(engine, trajs)
    losses = [engine.ppo_update(trajs, adv)["loss"] for _ in range(3)]
    after = seq_logprob_sums(engine, trajs)
    gain = [(a - b) * sign for a, b, sign in zip(after, before, adv)]
    assert sum(gain) > 0 and sum(g > 0 for g in gain) >= 6  # positive samples up, negatives down
    assert losses[-1] < losses[0]
    assert engine.step == 3
    changed = params(engine)
    assert all(not torch.equal(changed[k], before_params[k]) for k in before_params)


def test_update_stats(process_group, model_path):
    engine = make_engine(model_path, "actor.ppo_n_minibatches=2", "actor.optimizer.warmup_steps=4")
    trajs, adv = make_batch(engine)
    prox = engine.compute_logprobs([t.input_ids for t in trajs])
    stats = engine.ppo_update(trajs, adv, prox)
    for key in ("loss", "clip_frac", "entropy", "grad_norm", "lr", "tokens_per_s", "ratio_max", "ratio_min",
                "behav_imp_weight_max", "behav_imp_weight_min"):
        assert math.isfinite(stats[key]), key
    assert stats["lr"] == pytest.approx(3e-4 * 2 / 4)  # two optimizer steps into a 4-step warm-up
    assert stats["n_seqs"] == 8 and stats["n_loss_tokens"] == sum(t.n_output_tokens for t in trajs)
    # first minibatch is exactly on-policy: prox == behaviour (up to fp noise)
    assert stats["behav_imp_weight_max"] == pytest.approx(1.0, abs=1e-4)
    assert stats["mismatch/fresh_frac"] == 1.0 and stats["mismatch/abs_max"] < 1e-4  # versions 0 = the engine's
    assert 0 < stats["entropy"] <= math.log(engine.model.lm.config.vocab_size) + 1e-4


def test_mismatch_stats_tell_fresh_tokens_from_stale_ones(process_group, model_path):
    """After one update the engine holds version 1: tokens tagged 1 are fresh; those tagged 0 are
    stale, and their behaviour log-probs (shifted by -0.3 here) are what the gap measures."""
    engine = make_engine(model_path)
    engine.ppo_update(*make_batch(engine, seed=1))
    trajs, adv = make_batch(engine)
    stale = {0, 1, 2}
    trajs = [
        attrs.evolve(t, logprobs=[lp - 0.3 * m for lp, m in zip(t.logprobs, t.loss_mask)], versions=[0 if m else -1 for m in t.loss_mask])
        if i in stale else attrs.evolve(t, versions=[1 if m else -1 for m in t.loss_mask])
        for i, t in enumerate(trajs)
    ]  # fmt: skip
    stats = engine.ppo_update(trajs, adv, recompute_prox=True)
    stale_share = sum(trajs[i].n_output_tokens for i in stale) / sum(t.n_output_tokens for t in trajs)
    assert stats["mismatch/fresh_frac"] == pytest.approx(1 - stale_share)
    assert stats["mismatch/fresh_abs_max"] < 1e-4
    assert stats["mismatch/abs_max"] == pytest.approx(0.3, abs=1e-4)
    assert stats["mismatch/kl_k1"] == pytest.approx(-0.3 * stale_share, abs=1e-4)
    assert stats["mismatch/out_of_band_frac"] == 0.0  # |d| = 0.3 < ln 2


@pytest.mark.parametrize("minibatches", [1, 2])
def test_recompute_prox_equals_a_separate_pass(process_group, model_path, minibatches):
    """The proximal log-probs taken inside the update (fused into the forward with one minibatch)
    give the same update as a separate ``compute_logprobs`` pass handed in."""
    results = []
    for fused in (False, True):
        engine = make_engine(model_path, f"actor.ppo_n_minibatches={minibatches}", "actor.max_tokens_per_mb=64")
        trajs, adv = make_batch(engine)
        trajs = [attrs.evolve(t, logprobs=[lp - 0.1 * (i % 3) * m for i, (lp, m) in enumerate(zip(t.logprobs, t.loss_mask))])
                 for t in trajs]  # off-policy behaviour: the proximal anchor matters
        if fused:
            stats = engine.ppo_update(trajs, adv, recompute_prox=True)
        else:
            stats = engine.ppo_update(trajs, adv, engine.compute_logprobs([t.input_ids for t in trajs]))
        results.append((stats, params(engine)))
    (separate, p0), (inside, p1) = results
    assert inside["time/prox_logp_s"] == 0.0 if minibatches == 1 else inside["time/prox_logp_s"] > 0
    for key, value in separate.items():
        if not key.startswith(("time/", "minibatch_s/")) and key != "tokens_per_s":  # timings
            assert inside[key] == pytest.approx(value, rel=1e-5, abs=1e-6), key
    assert separate["behav_imp_weight_max"] > 1.05  # the anchor was not the behaviour policy
    for name in p0:
        torch.testing.assert_close(p1[name], p0[name], rtol=1e-6, atol=1e-7, msg=name)
    with pytest.raises(ValueError, match="not both"):
        make_engine(model_path).ppo_update(trajs, adv, [t.logprobs for t in trajs], recompute_prox=True)


def grads(engine: FSDPPolicy) -> dict[str, torch.Tensor]:
    """Full gradients left by the last optimizer step (the engine zeroes them at the next one)."""
    return {name: p.grad.full_tensor().clone() for name, p in engine.model.lm.named_parameters()}


def _assert_same_gradient(model_path, *overrides: str) -> None:
    """One PPO update under each override gives the same gradients."""
    results = []
    for override in overrides:
        engine = make_engine(model_path, override)
        trajs, adv = make_batch(engine)
        engine.ppo_update(trajs, adv)
        results.append(grads(engine))
    for name in results[0]:
        torch.testing.assert_close(results[0][name], results[1][name], rtol=1e-5, atol=1e-7)


def test_micro_batch_split_does_not_change_the_gradient(process_group, model_path):
    # many micro-batches vs one
    _assert_same_gradient(model_path, "actor.max_tokens_per_mb=16", "actor.max_tokens_per_mb=4096")


def test_gradient_checkpointing_gives_the_same_gradient(process_group, model_path):
    _assert_same_gradient(model_path, "model.gradient_checkpointing=false", "model.gradient_checkpointing=true")


def test_reference_model_stays_at_initial_weights(process_group, model_path):
    engine = make_engine(model_path, "actor.kl_coef=0.5")
    assert engine.ref_model is not None
    trajs, adv = make_batch(engine)
    initial = engine.compute_logprobs([t.input_ids for t in trajs])
    stats = [engine.ppo_update(trajs, adv) for _ in range(2)]
    assert stats[0]["kl_ref"] == pytest.approx(0.0, abs=1e-6) and stats[1]["kl_ref"] > 0
    from areal_core.train.packing import pack

    batch = pack([t.input_ids for t in trajs], range(len(trajs)))
    with torch.no_grad():
        ref, _ = engine._logprobs(engine.ref_model, batch, with_entropy=False)
    flat = [x for seq in initial for x in seq]
    assert ref.tolist() == pytest.approx(flat, abs=1e-6)


def test_bfloat16_compute_trains_and_saves_bf16(process_group, model_path, tmp_path):
    from safetensors import safe_open

    engine = make_engine(model_path, "model.dtype=bfloat16")
    trajs, adv = make_batch(engine)
    before = seq_logprob_sums(engine, trajs)
    for _ in range(3):
        stats = engine.ppo_update(trajs, adv)
    assert math.isfinite(stats["loss"])
    gain = sum((a - b) * s for a, b, s in zip(seq_logprob_sums(engine, trajs), before, adv))
    assert gain > 0
    engine.save_hf(tmp_path / "hf")
    with safe_open(str(tmp_path / "hf" / "model.safetensors"), "pt") as f:
        assert {f.get_tensor(k).dtype for k in f.keys()} == {torch.bfloat16}


def test_save_hf_loads_back_with_transformers(process_group, model_path, tmp_path):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    engine = make_engine(model_path)
    trajs, adv = make_batch(engine)
    engine.ppo_update(trajs, adv)
    engine.save_hf(tmp_path / "hf")
    loaded = AutoModelForCausalLM.from_pretrained(tmp_path / "hf")
    ours = params(engine)
    theirs = loaded.state_dict()
    assert set(ours) <= set(theirs)
    for name, value in ours.items():
        assert torch.equal(theirs[name], value), name
    assert torch.equal(theirs["lm_head.weight"], ours["model.embed_tokens.weight"])  # tied
    tokenizer = AutoTokenizer.from_pretrained(tmp_path / "hf")
    assert tokenizer.decode(tokenizer("12+3=")["input_ids"]) == "12+3="


@pytest.mark.parametrize("lora", [(), ("actor.lora.rank=4", "actor.lora.alpha=8")], ids=["full", "lora"])
def test_resume_from_checkpoint_is_bitwise_identical(process_group, model_path, tmp_path, lora):
    """Model (with LoRA: the adapter; the base comes from model.path), AdamW state, schedule, RNG."""
    overrides = ("actor.ppo_n_minibatches=2", "actor.optimizer.warmup_steps=3", "actor.optimizer.schedule=cosine",
                 "total_train_steps=4", *lora)
    straight = make_engine(model_path, *overrides)
    trajs, adv = make_batch(straight)
    for _ in range(4):
        expected_stats = straight.ppo_update(trajs, adv)

    first = make_engine(model_path, *overrides)
    for _ in range(2):
        first.ppo_update(trajs, adv)
    first.save_checkpoint(tmp_path / "ckpt")
    rng_at_save = torch.get_rng_state()
    torch.manual_seed(1234)  # the RNG state must come back from the checkpoint, not stay like this
    resumed = make_engine(model_path, *overrides)
    resumed.load_checkpoint(tmp_path / "ckpt")
    assert resumed.step == 2 and torch.equal(torch.get_rng_state(), rng_at_save)
    for _ in range(2):
        last = resumed.ppo_update(trajs, adv)
    assert last["lr"] == expected_stats["lr"] and last["loss"] == expected_stats["loss"]
    expected, got = params(straight), params(resumed)
    for name in expected:
        assert torch.equal(expected[name], got[name]), name
    for want, have in zip(straight.optimizer.state.values(), resumed.optimizer.state.values(), strict=True):
        for key in ("exp_avg", "exp_avg_sq"):
            assert torch.equal(want[key].to_local(), have[key].to_local()), key
    assert attrs.asdict(straight.config) == attrs.asdict(resumed.config)


def test_a_checkpoint_written_with_the_multi_tensor_loop_resumes_on_the_fused_kernel(
    process_group, model_path, tmp_path
):
    """torch's load_state_dict takes the saved groups' kernel flags: a run resumed from a checkpoint
    written before the fused AdamW must not run the loop from then on, and must train the same."""
    older = make_engine(model_path)
    for group in older.optimizer.param_groups:  # as build_optimizer set it before the fused kernel
        group.update(fused=None, foreach=True)
    trajs, adv = make_batch(older)
    older.ppo_update(trajs, adv)
    older.save_checkpoint(tmp_path / "ckpt")
    resumed = make_engine(model_path)
    resumed.load_checkpoint(tmp_path / "ckpt")
    assert all(g["fused"] is True and not g["foreach"] for g in resumed.optimizer.param_groups)
    resumed.ppo_update(trajs, adv)
    older.ppo_update(trajs, adv)
    got = params(resumed)
    for name, value in params(older).items():
        torch.testing.assert_close(got[name], value, rtol=1e-5, atol=1e-6)


def test_load_checkpoint_rejects_a_non_checkpoint(process_group, model_path, tmp_path):
    engine = make_engine(model_path)
    with pytest.raises(FileNotFoundError, match="not a DCP checkpoint"):
        engine.load_checkpoint(tmp_path)


def test_bad_inputs_name_the_problem(process_group, model_path):
    engine = make_engine(model_path, "actor.ppo_n_minibatches=4")
    trajs, adv = make_batch(engine, n=3)
    with pytest.raises(ValueError, match="advantages"):
        engine.ppo_update(trajs, adv[:2])
    with pytest.raises(ValueError, match="ppo_n_minibatches"):
        engine.ppo_update(trajs, adv)



def test_load_checkpoint_after_a_forward_uses_the_loaded_weights(process_group, model_path, tmp_path):
    """A no-grad forward leaves gathered weights behind; loading must not leave them stale."""
    trained = make_engine(model_path)
    trajs, adv = make_batch(trained)
    trained.ppo_update(trajs, adv)
    trained.save_checkpoint(tmp_path / "ckpt")
    seqs = [t.input_ids for t in trajs]
    other = make_engine(model_path)
    before = other.compute_logprobs(seqs)
    other.load_checkpoint(tmp_path / "ckpt")
    after = other.compute_logprobs(seqs)
    assert after == trained.compute_logprobs(seqs) and after != before
