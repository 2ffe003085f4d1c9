"""TrainWorkerGroup with real worker processes (gloo, world size 1 and 2) started by the test."""

from __future__ import annotations

import os
import random
import signal

import attrs
import pytest
import torch
from safetensors.torch import load_file

from areal_core.config import Config, LoraConfig, TinyModelSpec, load_config
from areal_core.builtin.platform_cpu.platform import CpuPlatform
from areal_core.scheduler.local import LocalScheduler
from areal_core.tiny_model import ensure_tiny_model
from areal_core.train.worker_group import TrainWorkerGroup, TrainWorkerError
from areal_core.train.fsdp_policy import split_minibatches, token_balanced_shares
from areal_core.train.packing import first_fit_decreasing
from areal_core.api.trajectory import Trajectory

pytestmark = pytest.mark.slow
CORPUS = ["0123456789+-=? abcdefghij"]
MAX_TOKENS = 48
# Lengths chosen so the two ranks pack a minibatch into different numbers of micro-batches: the
# rank with fewer runs padding micro-batches (checked in test_padding_microbatches_are_exercised).
LENGTHS = [29, 31, 7, 21, 37, 36, 30, 24, 35, 27, 18, 37]


@pytest.fixture(scope="module")
def model_path(tmp_path_factory):
    return str(ensure_tiny_model(TinyModelSpec(), CORPUS, tmp_path_factory.mktemp("models"), seed=0))


@pytest.fixture
def scheduler():
    platform = CpuPlatform()
    with LocalScheduler(platform) as sched:
        yield sched


def make_config(model_path: str, world_size: int) -> Config:
    return load_config(
        None,
        [f"model.path={model_path}", f"actor.world_size={world_size}", "actor.ppo_n_minibatches=2",
         f"actor.max_tokens_per_mb={MAX_TOKENS}", "actor.optimizer.warmup_steps=2", "total_train_steps=4"],
    )


def controller(config: Config, scheduler, model_path: str, run_dir) -> TrainWorkerGroup:
    return TrainWorkerGroup(config, CpuPlatform(), scheduler, model_path, run_dir)


def raw_trajs(seed: int = 0) -> list[Trajectory]:
    rng = random.Random(seed)
    out = []
    for i, n in enumerate(LENGTHS):
        prompt = rng.randint(2, 5)
        out.append(
            Trajectory(
                uid=str(i), prompt_id=str(i // 4), input_ids=[rng.randrange(2, 20) for _ in range(n)],
                loss_mask=[0] * prompt + [1] * (n - prompt), logprobs=[0.0] * n,
                versions=[-1] * prompt + [0] * (n - prompt), reward=float(i % 2),
            )
        )
    return out


def on_policy(trajs: list[Trajectory], logps: list[list[float]]) -> list[Trajectory]:
    return [
        Trajectory(uid=t.uid, prompt_id=t.prompt_id, input_ids=t.input_ids, loss_mask=t.loss_mask,
                   logprobs=[lp if m else 0.0 for lp, m in zip(logp, t.loss_mask)], versions=t.versions,
                   reward=t.reward)
        for t, logp in zip(trajs, logps)
    ]


ADVANTAGES = [1.0 if i % 2 else -1.0 for i in range(len(LENGTHS))]


def test_padding_microbatches_are_exercised():
    """Precondition of the world-size tests: ranks disagree on their micro-batch count."""
    counts = []
    for mb in split_minibatches(len(LENGTHS), 2):
        shares = token_balanced_shares([LENGTHS[i] for i in mb], 2)
        counts.append([len(first_fit_decreasing([LENGTHS[mb[j]] for j in s], MAX_TOKENS)) for s in shares])
    assert any(a != b for a, b in counts), counts


def test_world_size_2_matches_world_size_1(model_path, scheduler, tmp_path):
    from transformers import AutoModelForCausalLM

    results = {}
    for ws in (1, 2):
        with controller(make_config(model_path, ws), scheduler, model_path, tmp_path / f"run{ws}") as trainer:
            initial = trainer.compute_logprobs(raw_trajs())
            trajs = on_policy(raw_trajs(), initial)
            stats = [trainer.train_step(trajs, ADVANTAGES, initial) for _ in range(2)]
            trained = trainer.compute_logprobs(trajs)
            trainer.save_hf(str(tmp_path / f"hf{ws}"))
            assert trainer.step == 2
        assert not any(h.alive() for h in trainer.handles)
        assert (tmp_path / f"run{ws}" / "logs" / f"trainer{ws - 1}.log").exists()
        results[ws] = initial, stats, trained, load_file(str(tmp_path / f"hf{ws}" / "model.safetensors"))

    (init1, stats1, trained1, params1), (init2, stats2, trained2, params2) = results[1], results[2]
    # Tolerance: sums over ranks and micro-batches run in another order; 2 Adam steps of lr 3e-4.
    for a, b in zip(init1, init2):
        assert a == pytest.approx(b, abs=1e-5)
    for s1, s2 in zip(stats1, stats2):
        for key in ("loss", "grad_norm", "clip_frac", "entropy", "lr"):
            assert s2[key] == pytest.approx(s1[key], rel=1e-3, abs=1e-6), key
    for a, b in zip(trained1, trained2):
        assert a == pytest.approx(b, abs=1e-4)
    for name in params1:
        torch.testing.assert_close(params2[name], params1[name], rtol=0, atol=5e-5)
    # the update did something: positive-advantage samples became likelier, negative ones less
    gain = sum(s * sum(b - a for a, b, m in zip(i, t, tr.loss_mask) if m)
               for s, i, t, tr in zip(ADVANTAGES, init1, trained1, trajs))
    assert gain > 0
    # the saved directory is a working HF model: it reproduces the sharded model's log-probs
    loaded = AutoModelForCausalLM.from_pretrained(tmp_path / "hf2")
    seq = trajs[0].input_ids
    with torch.no_grad():
        logits = loaded(torch.tensor([seq])).logits[0]
    expected = logits[:-1].log_softmax(-1).gather(-1, torch.tensor(seq[1:])[:, None])[:, 0]
    assert trained2[0][1:] == pytest.approx(expected.tolist(), abs=1e-5)


@pytest.mark.parametrize("lora", [None, LoraConfig(rank=4, alpha=8, dropout=0.1)], ids=["full", "lora"])
def test_checkpoint_resume_is_bitwise_at_world_size_2(model_path, scheduler, tmp_path, lora):
    """With LoRA: the adapter and its AdamW state (the base comes from model.path), with dropout
    on the adapter (each rank's RNG state comes back) and the reference policy (kl_coef > 0)."""
    config = make_config(model_path, 2)
    if lora is not None:
        config = attrs.evolve(config, actor=attrs.evolve(config.actor, lora=lora, kl_coef=0.05))
    weights = "adapter_model.safetensors" if lora else "model.safetensors"
    with controller(config, scheduler, model_path, tmp_path / "a") as trainer:
        trajs = on_policy(raw_trajs(), trainer.compute_logprobs(raw_trajs()))
        for _ in range(2):
            trainer.train_step(trajs, ADVANTAGES, None)
        trainer.save_checkpoint(str(tmp_path / "ckpt"))
        straight_stats = [trainer.train_step(trajs, ADVANTAGES, None) for _ in range(2)]
        trainer.save_hf(str(tmp_path / "straight"))
    with controller(config, scheduler, model_path, tmp_path / "b") as trainer:
        trainer.load_checkpoint(str(tmp_path / "ckpt"))
        assert trainer.step == 2
        resumed_stats = [trainer.train_step(trajs, ADVANTAGES, None) for _ in range(2)]
        trainer.save_hf(str(tmp_path / "resumed"))
    for want, got in zip(straight_stats, resumed_stats):
        assert (got["loss"], got["grad_norm"], got["lr"]) == (want["loss"], want["grad_norm"], want["lr"])
    straight = load_file(str(tmp_path / "straight" / weights))
    resumed = load_file(str(tmp_path / "resumed" / weights))
    assert straight.keys() == resumed.keys()
    for name in straight:
        assert torch.equal(straight[name], resumed[name]), name


def test_worker_death_mid_call_raises_and_leaves_no_process(model_path, scheduler, tmp_path):
    trainer = controller(make_config(model_path, 2), scheduler, model_path, tmp_path)
    with trainer:
        trajs = on_policy(raw_trajs(), trainer.compute_logprobs(raw_trajs()))
        os.kill(trainer.handles[1].pid, signal.SIGKILL)  # rank 0 will wait for it in a collective
        with pytest.raises(TrainWorkerError, match=r"trainer1 exited \(code -9\) during TrainStep"):
            trainer.train_step(trajs, ADVANTAGES, None)
        assert not any(h.alive() for h in trainer.handles)
        with pytest.raises(RuntimeError, match="not running"):
            trainer.compute_logprobs(trajs)
    trainer.stop()  # idempotent


def test_build_failure_reports_the_worker_traceback(scheduler, tmp_path):
    not_a_model = tmp_path / "empty"
    not_a_model.mkdir()
    config = load_config(None, ["actor.world_size=1"])
    trainer = controller(config, scheduler, str(not_a_model), tmp_path / "run")
    with pytest.raises(TrainWorkerError, match="Build failed on trainer0") as info:
        trainer.start()
    assert "Traceback" in str(info.value) and str(not_a_model) in str(info.value)
    assert not any(h.alive() for h in trainer.handles)
