"""Packing invariants (FFD bins, pack/unpack round trip) and packed == one-sequence-at-a-time
loss and gradients on a tiny Qwen3.

Tolerance for the model comparison: fp32, atol 1e-5 / rtol 1e-5 on per-token log-probs, the loss
and every parameter gradient (packed and unpacked runs differ only in summation order).
"""

from __future__ import annotations

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from areal_core.config import TinyModelSpec
from areal_core.tiny_model import build_tiny_qwen3
from areal_core.train.fsdp_policy import enable_activation_checkpointing
from areal_core.train.logprobs import packed_token_logprobs
from areal_core.train.packing import (
    first_fit_decreasing, pack, pack_in_one_row, pack_per_token, packed_hidden_states, unpack,
)

TOL = {"atol": 1e-5, "rtol": 1e-5}
VOCAB = 53

lengths_st = st.lists(st.integers(1, 60), min_size=1, max_size=40)
sequences_st = st.lists(st.lists(st.integers(0, 1000), min_size=1, max_size=20), min_size=1, max_size=12)


@settings(max_examples=60, deadline=None)
@given(lengths=lengths_st, max_tokens=st.integers(1, 100))
def test_ffd_bins_partition_and_respect_the_cap(lengths, max_tokens):
    bins = first_fit_decreasing(lengths, max_tokens)
    assert sorted(i for b in bins for i in b) == list(range(len(lengths)))
    for b in bins:
        total = sum(lengths[i] for i in b)
        assert total <= max_tokens or len(b) == 1, (b, total)
        assert b == sorted(b)
    assert first_fit_decreasing(list(lengths), max_tokens) == bins  # deterministic


@settings(max_examples=60, deadline=None)
@given(lengths=lengths_st, max_tokens=st.integers(1, 100))
def test_ffd_is_first_fit(lengths, max_tokens):
    """No sequence could have gone into an earlier bin than the one it landed in."""
    bins = first_fit_decreasing(lengths, max_tokens)
    order = sorted(range(len(lengths)), key=lambda i: (-lengths[i], i))
    where = {i: k for k, b in enumerate(bins) for i in b}
    load = [0] * len(bins)
    for i in order:
        for k in range(where[i]):
            assert load[k] + lengths[i] > max_tokens or load[k] >= max_tokens
        load[where[i]] += lengths[i]


def test_ffd_examples():
    assert first_fit_decreasing([5, 3, 8, 2, 2], 10) == [[2, 3], [0, 1, 4]]  # 8+2, 5+3+2
    assert first_fit_decreasing([12, 1, 1], 10) == [[0], [1, 2]]  # oversize alone, not dropped
    with pytest.raises(ValueError, match="max_tokens"):
        first_fit_decreasing([1], 0)
    with pytest.raises(ValueError, match="sequence 1 has length 0"):
        first_fit_decreasing([1, 0], 4)


@settings(max_examples=60, deadline=None)
@given(seqs=sequences_st, data=st.data())
def test_pack_unpack_round_trip(seqs, data):
    order = data.draw(st.permutations(range(len(seqs))))
    indices = order[: data.draw(st.integers(1, len(seqs)))]
    batch = pack(seqs, indices)
    n = sum(len(seqs[i]) for i in indices)
    width = max(len(seqs[i]) for i in indices)
    rows = batch.input_ids.shape[0]
    assert batch.input_ids.shape == batch.position_ids.shape == (rows, width) and batch.n_tokens == n
    assert rows * width < 2 * n + width  # first fit: at most one row is half empty or less
    assert sorted(batch.tokens.tolist()) == sorted(set(batch.tokens.tolist()))  # each slot holds one token
    assert batch.cu_seqlens.dtype == torch.int32 and batch.n_seqs == len(indices)
    assert batch.indices == tuple(indices)
    assert [t.tolist() for t in unpack(batch.flat_ids, batch.cu_seqlens)] == [seqs[i] for i in indices]
    flat_positions = batch.position_ids.reshape(-1)[batch.tokens]
    positions, seq_ids = unpack(flat_positions, batch.cu_seqlens), unpack(batch.seq_ids, batch.cu_seqlens)
    for k, (pos, sid) in enumerate(zip(positions, seq_ids)):
        assert pos.tolist() == list(range(len(pos)))
        assert (sid == k).all()
        assert batch.tokens[int(batch.cu_seqlens[k])] // width == batch.tokens[int(batch.cu_seqlens[k + 1]) - 1] // width
    padding = torch.ones(rows * width, dtype=torch.bool)
    padding[batch.tokens] = False
    assert (batch.input_ids.reshape(-1)[padding] == 0).all()  # each row's free tail: one block from 0
    for row_positions, row_pad in zip(batch.position_ids, padding.view(rows, width)):
        assert row_positions[row_pad].tolist() == list(range(int(row_pad.sum())))
        assert row_pad.tolist() == sorted(row_pad.tolist())  # padding only at the row's end
    side = [[float(i) + t / 100 for t in range(len(s))] for i, s in enumerate(seqs)]
    packed_side = pack_per_token(side, batch, torch.float64)
    assert [t.tolist() for t in unpack(packed_side, batch.cu_seqlens)] == [side[i] for i in indices]


@settings(max_examples=60, deadline=None)
@given(seqs=sequences_st, data=st.data(), multiple=st.integers(1, 5))
def test_one_row_packing_for_sequence_parallelism(seqs, data, multiple):
    indices = data.draw(st.permutations(range(len(seqs))))[: data.draw(st.integers(1, len(seqs)))]
    batch = pack_in_one_row(seqs, indices, multiple)
    n = sum(len(seqs[i]) for i in indices)
    width = batch.input_ids.shape[1]
    assert batch.input_ids.shape == batch.position_ids.shape == (1, width)
    assert width % multiple == 0 and n <= width < n + multiple  # the least padding that divides
    assert batch.tokens.tolist() == list(range(n)) and batch.indices == tuple(indices)
    assert [t.tolist() for t in unpack(batch.flat_ids, batch.cu_seqlens)] == [seqs[i] for i in indices]
    positions = unpack(batch.position_ids[0, :n], batch.cu_seqlens)
    assert all(pos.tolist() == list(range(len(pos))) for pos in positions)
    assert batch.position_ids[0, n:].tolist() == list(range(width - n))  # one padding block
    assert (batch.input_ids[0, n:] == 0).all()
    side = [[float(i) + t / 100 for t in range(len(s))] for i, s in enumerate(seqs)]
    assert [t.tolist() for t in unpack(pack_per_token(side, batch, torch.float64), batch.cu_seqlens)] == [
        side[i] for i in indices
    ]


def test_pack_rejects_mismatched_side_data_and_empty_input():
    batch = pack([[1, 2], [3]], [0, 1])
    with pytest.raises(ValueError, match=r"values\[1\] has 2 entries"):
        pack_per_token([[0.0, 0.0], [0.0, 0.0]], batch, torch.float32)
    with pytest.raises(ValueError, match="empty bin"):
        pack([[1]], [])
    with pytest.raises(ValueError, match="sequence 0 has length 0"):
        pack([[]], [0])
    with pytest.raises(ValueError, match="covers 3 tokens"):
        unpack(torch.zeros(4), batch.cu_seqlens)


# --- packed vs unpacked on a tiny Qwen3 -----------------------------------------------------


def _model(attn: str, checkpointing: bool):
    model = build_tiny_qwen3(TinyModelSpec(), vocab_size=VOCAB, pad_id=0, eos_id=1, seed=0)
    model.set_attn_implementation(attn)
    if checkpointing:
        enable_activation_checkpointing(model)
    model.train()
    return model


def _unpacked_logprobs(model, seq):
    """One sequence alone through the ordinary HF forward: full logits, log_softmax, token-aligned."""
    logits = model(input_ids=torch.tensor([seq]), use_cache=False).logits[0].float()
    logp = logits[:-1].log_softmax(-1).gather(-1, torch.tensor(seq[1:])[:, None]).squeeze(-1)
    return torch.cat([logp.new_zeros(1), logp])


def _grads(model):
    out = {n: p.grad.clone() for n, p in model.named_parameters()}
    model.zero_grad()
    return out


@pytest.mark.parametrize(("attn", "checkpointing"), [("sdpa", False), ("eager", False), ("sdpa", True)])
def test_packed_loss_and_grads_equal_unpacked(attn, checkpointing):
    model = _model(attn, checkpointing)
    g = torch.Generator().manual_seed(1)
    seqs = [torch.randint(2, VOCAB, (n,), generator=g).tolist() for n in (9, 2, 17, 1, 6, 11)]
    masks = [[float(t >= len(s) // 3) for t in range(len(s))] for s in seqs]  # "prompt" tokens masked
    advantages = torch.randn(len(seqs), generator=g).tolist()
    bins = first_fit_decreasing([len(s) for s in seqs], max_tokens=24)
    assert len(bins) > 1 and any(len(b) > 1 for b in bins)

    packed_loss, packed_logp = 0.0, {}
    for b in bins:
        batch = pack(seqs, b)
        logp, _ = packed_token_logprobs(model, batch, chunk_size=7)
        mask = pack_per_token(masks, batch, torch.float32)
        adv = torch.tensor([advantages[i] for i in b])[batch.seq_ids]
        loss = -(logp * mask * adv).sum()
        loss.backward()
        packed_loss += loss.item()
        packed_logp.update(zip(b, unpack(logp.detach(), batch.cu_seqlens)))
    packed_grads = _grads(model)

    unpacked_loss = 0.0
    for i, s in enumerate(seqs):
        logp = _unpacked_logprobs(model, s)
        torch.testing.assert_close(packed_logp[i], logp.detach(), **TOL)
        loss = -(logp * torch.tensor(masks[i]) * advantages[i]).sum()
        loss.backward()
        unpacked_loss += loss.item()
    unpacked_grads = _grads(model)

    assert packed_loss == pytest.approx(unpacked_loss, abs=1e-5, rel=1e-5)
    for name, grad in unpacked_grads.items():
        assert grad.abs().sum() > 0, name
        torch.testing.assert_close(packed_grads[name], grad, **TOL, msg=name)


def test_no_attention_across_sequences():
    """Changing one packed sequence leaves every other sequence's hidden states unchanged."""
    model = _model("sdpa", checkpointing=False).eval()
    seqs = [[5, 6, 7, 8], [9, 10, 11], [12, 13, 14, 15, 16]]
    with torch.no_grad():
        before = unpack(packed_hidden_states(model, pack(seqs, [0, 1, 2])), pack(seqs, [0, 1, 2]).cu_seqlens)
        seqs[1] = [20, 21, 22]
        after = unpack(packed_hidden_states(model, pack(seqs, [0, 1, 2])), pack(seqs, [0, 1, 2]).cu_seqlens)
    torch.testing.assert_close(before[0], after[0], atol=0, rtol=0)
    torch.testing.assert_close(before[2], after[2], atol=0, rtol=0)
    assert not torch.allclose(before[1], after[1])
