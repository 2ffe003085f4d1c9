"""Chunked log-probs equal the naive full log-softmax (values, entropy, gradients), packed
log-probs are aligned to tokens, and both work on a real FSDP2-sharded model.

Tolerances: fp32 throughout, atol 1e-5 / rtol 1e-5 against the naive computation (the two differ
only in summation order); bf16 weights are compared with the naive result on the same bf16 values
upcast to fp32, gradients (whose matmuls then run in bf16) at bf16 resolution (rtol 1e-2).
"""

from __future__ import annotations

import copy
import os

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from areal_core.config import TinyModelSpec
from areal_core.tiny_model import build_tiny_qwen3
from areal_core.train.fsdp_policy import enable_activation_checkpointing
from areal_core.train.logprobs import packed_token_logprobs, token_logprobs
from areal_core.train.packing import pack

TOL = {"atol": 1e-5, "rtol": 1e-5}
VOCAB = 61


def naive_token_logprobs(hidden, weight, labels, temperature=1.0):
    """Reference: full [N, V] log-softmax in fp32."""
    logits = hidden.float() @ weight.float().T / temperature
    logp_all = logits.log_softmax(-1)
    logp = logp_all.gather(-1, labels[:, None]).squeeze(-1)
    entropy = -(logp_all.exp() * logp_all).sum(-1)
    return logp, entropy


def _inputs(n, v, h, seed, dtype=torch.float32):
    g = torch.Generator().manual_seed(seed)
    hidden = torch.randn(n, h, generator=g).to(dtype).requires_grad_()
    weight = torch.randn(v, h, generator=g).to(dtype).requires_grad_()
    labels = torch.randint(0, v, (n,), generator=g)
    return hidden, weight, labels


def _grads(fn, hidden, weight, labels, seed, **kw):
    """Values, entropy and the gradients of a random linear functional of both."""
    logp, ent = fn(hidden, weight, labels, **kw)
    g = torch.Generator().manual_seed(seed + 1)
    a, b = torch.randn(logp.shape, generator=g), torch.randn(logp.shape, generator=g)
    hidden.grad = weight.grad = None
    ((logp * a).sum() + (ent * b).sum()).backward()
    return logp.detach(), ent.detach(), hidden.grad.clone(), weight.grad.clone()


def _chunked(hidden, weight, labels, **kw):
    return token_logprobs(hidden, weight, labels, with_entropy=True, **kw)


@settings(max_examples=25, deadline=None)
@given(
    n=st.integers(1, 40),
    v=st.integers(2, 70),
    chunk=st.integers(1, 50),
    temperature=st.sampled_from([1.0, 0.7, 1.3]),
    seed=st.integers(0, 2**16),
    keep_bytes=st.sampled_from([0, 2**20]),  # recompute the log-softmax in backward, or keep it
)
def test_matches_naive_values_entropy_and_grads(n, v, chunk, temperature, seed, keep_bytes):
    hidden, weight, labels = _inputs(n, v, 16, seed)
    options = {"temperature": temperature, "chunk_size": chunk, "keep_bytes": keep_bytes}
    got = _grads(_chunked, hidden, weight, labels, seed, **options)
    want = _grads(naive_token_logprobs, hidden, weight, labels, seed, temperature=temperature)
    for g, w in zip(got, want):
        torch.testing.assert_close(g, w, **TOL)


def test_temperature_changes_the_distribution():
    hidden, weight, labels = _inputs(32, 50, 16, seed=3)
    at_1 = _grads(_chunked, hidden, weight, labels, 3, chunk_size=7)
    at_07 = _grads(_chunked, hidden, weight, labels, 3, temperature=0.7, chunk_size=7)
    want = _grads(naive_token_logprobs, hidden, weight, labels, 3, temperature=0.7)
    for g, w in zip(at_07, want):
        torch.testing.assert_close(g, w, **TOL)
    assert not torch.allclose(at_1[0], at_07[0], atol=1e-3)
    assert not torch.allclose(at_1[3], at_07[3], atol=1e-3)


def test_logprob_only_and_entropy_only_gradients():
    hidden, weight, labels = _inputs(20, 30, 8, seed=5)
    logp, ent = token_logprobs(hidden, weight, labels, chunk_size=6)
    assert ent is None
    logp.sum().backward()
    gh, gw = hidden.grad.clone(), weight.grad.clone()
    hidden.grad = weight.grad = None
    naive_token_logprobs(hidden, weight, labels)[0].sum().backward()
    torch.testing.assert_close(gh, hidden.grad, **TOL)
    torch.testing.assert_close(gw, weight.grad, **TOL)

    hidden.grad = weight.grad = None
    token_logprobs(hidden, weight, labels, chunk_size=6, with_entropy=True)[1].sum().backward()
    gh, gw = hidden.grad.clone(), weight.grad.clone()
    hidden.grad = weight.grad = None
    naive_token_logprobs(hidden, weight, labels)[1].sum().backward()
    torch.testing.assert_close(gh, hidden.grad, **TOL)
    torch.testing.assert_close(gw, weight.grad, **TOL)


def test_a_kept_log_softmax_replaces_the_recomputation(monkeypatch):
    """Within ``keep_bytes`` the backward runs no logits matmul; over it, one per chunk."""
    from areal_core.train import logprobs

    calls = []
    real = logprobs._logits
    monkeypatch.setattr(logprobs, "_logits", lambda *a: calls.append(1) or real(*a))
    hidden, weight, labels = _inputs(12, 30, 8, seed=2)
    for keep_bytes, backward_calls in ((12 * 30 * 4, 0), (12 * 30 * 4 - 1, 3)):
        logp, _ = token_logprobs(hidden, weight, labels, chunk_size=5, keep_bytes=keep_bytes)
        calls.clear()
        logp.sum().backward()
        assert len(calls) == backward_calls


@pytest.mark.parametrize("keep_bytes", [0, 2**20])
def test_bf16_inputs_are_computed_in_fp32(keep_bytes):
    hidden, weight, labels = _inputs(24, 40, 16, seed=7, dtype=torch.bfloat16)
    logp, ent, gh, gw = _grads(_chunked, hidden, weight, labels, 7, chunk_size=5, keep_bytes=keep_bytes)
    assert logp.dtype == torch.float32 and gh.dtype == gw.dtype == torch.bfloat16
    ref = [t.detach().float().requires_grad_() for t in (hidden, weight)]
    want = _grads(naive_token_logprobs, ref[0], ref[1], labels, 7)
    torch.testing.assert_close(logp, want[0], **TOL)
    torch.testing.assert_close(ent, want[1], **TOL)
    torch.testing.assert_close(gh.float(), want[2], atol=1e-2, rtol=1e-2)
    torch.testing.assert_close(gw.float(), want[3], atol=1e-2, rtol=1e-2)


def test_rejects_bad_arguments():
    hidden, weight, labels = _inputs(4, 10, 8, seed=0)
    with pytest.raises(ValueError, match="temperature"):
        token_logprobs(hidden, weight, labels, temperature=0.0)
    with pytest.raises(ValueError, match="chunk_size"):
        token_logprobs(hidden, weight, labels, chunk_size=0)
    with pytest.raises(ValueError, match="labels"):
        token_logprobs(hidden, weight, labels[:3])


# --- packed log-probs on a tiny Qwen3 -------------------------------------------------------


def _tiny_model():
    return build_tiny_qwen3(TinyModelSpec(), vocab_size=VOCAB, pad_id=0, eos_id=1, seed=0)


def _sequences(lengths, seed=0):
    g = torch.Generator().manual_seed(seed)
    return [torch.randint(2, VOCAB, (n,), generator=g).tolist() for n in lengths]


def _per_sequence_reference(model, seq, temperature):
    """Log-probs and entropy of one sequence from the model's full logits, token-aligned."""
    logits = model(input_ids=torch.tensor([seq]), use_cache=False).logits[0].float() / temperature
    logp_all = logits.log_softmax(-1)
    logp = logp_all[:-1].gather(-1, torch.tensor(seq[1:])[:, None]).squeeze(-1)
    ent = -(logp_all.exp() * logp_all).sum(-1)[:-1]
    zero = torch.zeros(1)
    return torch.cat([zero, logp]), torch.cat([zero, ent])


@pytest.mark.parametrize("temperature", [1.0, 0.6])
def test_packed_logprobs_are_token_aligned(temperature):
    model = _tiny_model()
    seqs = _sequences([7, 1, 12, 4])
    batch = pack(seqs, [2, 0, 1, 3])
    logp, ent = packed_token_logprobs(model, batch, temperature=temperature, chunk_size=5, with_entropy=True)
    want = [_per_sequence_reference(model, seqs[i], temperature) for i in batch.indices]
    torch.testing.assert_close(logp, torch.cat([w[0] for w in want]), **TOL)
    torch.testing.assert_close(ent, torch.cat([w[1] for w in want]), **TOL)
    assert (logp[batch.seq_starts] == 0).all() and (logp[~batch.seq_starts] < 0).all()


@pytest.mark.parametrize("share_prefixes", [False, True])
def test_scored_tokens_alone_run_the_head_and_train_the_same(share_prefixes):
    """``PackedBatch.scored`` (the loss tokens): their log-probs, entropies and the gradient of a
    loss over them are those of the whole batch; every other token is 0."""
    import attrs

    from areal_core.train.shared_prefix import pack_sharing_prefixes

    prompt = _sequences([9], seed=3)[0]
    answers = _sequences([5, 1, 7, 3], seed=4)
    seqs = [prompt + a for a in answers]
    batch = pack_sharing_prefixes(seqs, [1, 3, 0, 2], 4) if share_prefixes else pack(seqs, [1, 3, 0, 2])
    scored = torch.tensor([k >= len(prompt) for i in batch.indices for k in range(len(seqs[i]))])
    weights = torch.linspace(-1.0, 1.0, scored.shape[0])
    results = []
    for b in (batch, attrs.evolve(batch, scored=scored)):
        model = _tiny_model()
        logp, ent = packed_token_logprobs(model, b, chunk_size=4, with_entropy=True)
        (torch.where(scored, logp * weights + 0.1 * ent, 0.0)).sum().backward()
        results.append((logp, ent, {n: p.grad for n, p in model.named_parameters()}))
    (logp, ent, grads), (s_logp, s_ent, s_grads) = results
    torch.testing.assert_close(s_logp[scored], logp[scored], **TOL)
    torch.testing.assert_close(s_ent[scored], ent[scored], **TOL)
    assert (s_logp[~scored] == 0).all() and (s_ent[~scored] == 0).all() and (logp[~scored][1:] != 0).any()
    for name, grad in grads.items():
        torch.testing.assert_close(s_grads[name], grad, **TOL, msg=name)


# --- FSDP2 on a real 1-process gloo group ---------------------------------------------------


@pytest.fixture
def gloo_group(tmp_path):
    import torch.distributed as dist

    dist.init_process_group("gloo", init_method=f"file://{tmp_path / 'store'}", rank=0, world_size=1)
    try:
        yield
    finally:
        dist.destroy_process_group()


def _loss_and_logp(model, batch):
    logp, ent = packed_token_logprobs(model, batch, chunk_size=8, with_entropy=True)
    weights = torch.linspace(-1.0, 1.0, logp.shape[0])
    return (logp * weights).sum() + 0.1 * ent.sum(), logp.detach()


@pytest.mark.parametrize("root_reshard", [None, True], ids=["root-auto", "root-reshard"])
def test_fsdp2_model_matches_plain_model(gloo_group, root_reshard):
    from torch.distributed.fsdp import fully_shard
    from torch.distributed.tensor import DTensor

    plain = _tiny_model()
    sharded = copy.deepcopy(plain)
    for m in (plain, sharded):
        enable_activation_checkpointing(m)
        m.train()
    for layer in sharded.model.layers:
        fully_shard(layer)
    fully_shard(sharded, reshard_after_forward=root_reshard)
    assert isinstance(sharded.lm_head.weight, DTensor)

    batch = pack(_sequences([9, 3, 14, 5], seed=1), [0, 1, 2, 3])
    want_loss, want_logp = _loss_and_logp(plain, batch)
    want_loss.backward()
    with torch.no_grad():  # the proximal-log-prob recompute path
        torch.testing.assert_close(_loss_and_logp(sharded, batch)[1], want_logp, **TOL)
    for _ in range(2):  # a second step checks FSDP's state resets cleanly
        sharded.zero_grad()
        loss, logp = _loss_and_logp(sharded, batch)
        loss.backward()
        torch.testing.assert_close(logp, want_logp, **TOL)
        torch.testing.assert_close(loss.detach(), want_loss.detach(), **TOL)
        grads = dict(sharded.named_parameters())
        for name, p in plain.named_parameters():
            g = grads[name].grad
            assert isinstance(g, DTensor), name
            torch.testing.assert_close(g.full_tensor(), p.grad, **TOL, msg=name)
    assert isinstance(sharded.lm_head.weight, DTensor)  # resharded after backward


def _two_rank_worker(rank: int, store: str, root_reshard: bool | None, out: str) -> None:
    """Each rank packs its own sequences; rank 0 saves the full (reduced) gradients."""
    import torch.distributed as dist
    from torch.distributed.fsdp import fully_shard

    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"file://{store}", rank=rank, world_size=2)
    try:
        model = _tiny_model()
        enable_activation_checkpointing(model)
        model.train()
        for layer in model.model.layers:
            fully_shard(layer)
        fully_shard(model, reshard_after_forward=root_reshard)
        loss, _ = _loss_and_logp(model, pack(_sequences([9, 3, 14, 5], seed=1), _RANK_BINS[rank]))
        loss.backward()
        grads = {n: p.grad.full_tensor() for n, p in model.named_parameters()}
        if rank == 0:
            torch.save(grads, out)
        dist.barrier()  # tear the group down together: a peer leaving early can abort gloo
    finally:
        dist.destroy_process_group()
    # Skip interpreter teardown: gloo's threads can make C++ static destructors abort (SIGABRT,
    # "terminate called without an active exception") after the work is done and saved.
    os._exit(0)


_RANK_BINS = ([0, 1], [2, 3])


@pytest.mark.slow
@pytest.mark.parametrize("root_reshard", [None, True], ids=["root-auto", "root-reshard"])
def test_fsdp2_two_ranks_average_head_gradients(tmp_path, root_reshard):
    """With 2 real ranks the tied head/embedding gradient is the mean over ranks, as for every
    other parameter (a rank-local ``full_tensor()`` backward would fail this)."""
    import torch.multiprocessing as mp

    out = tmp_path / "rank0.pt"
    mp.spawn(_two_rank_worker, args=(str(tmp_path / "store"), root_reshard, str(out)), nprocs=2, join=True)
    got = torch.load(out)

    plain = _tiny_model()
    seqs = _sequences([9, 3, 14, 5], seed=1)
    for b in _RANK_BINS:
        loss, _ = _loss_and_logp(plain, pack(seqs, b))
        (loss / len(_RANK_BINS)).backward()
    for name, p in plain.named_parameters():
        torch.testing.assert_close(got[name], p.grad, **TOL, msg=name)
