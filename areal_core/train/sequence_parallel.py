"""Ulysses sequence parallelism (``actor.sequence_parallel``): one packed micro-batch split along
the sequence over a group of ``sp`` ranks.

Layout: the micro-batch's ``N`` tokens in one row (sequences back to back, position ids restarting
at 0 for each), padded to a multiple of ``sp`` with one padding block; SP rank ``i`` runs tokens
``[i * N / sp, (i + 1) * N / sp)`` through every layer. Embedding, norms, MLPs, projections and
RoPE are per token and need nothing. Attention needs all of a sequence's tokens, so q, k and v go
through an all-to-all that trades the split over tokens for a split over heads
(``[H, N / sp] -> [H / sp, N]``); each rank runs causal attention over whole sequences for its
heads, and a second all-to-all gives every rank its own tokens back with all heads. Per layer and
rank that moves ``(2 * H + 2 * max(H_kv, sp)) * head_dim * N / sp * (sp - 1) / sp`` values each way
(q, k, v in, the output back), which is what SP costs; activations and logits, per token, are
split over the ``sp`` ranks (attention over a sequence still sees all of it, for ``H / sp`` heads).

Models with fewer kv heads than ``sp`` (GQA/MQA) have each kv head repeated ``sp / H_kv`` times
before the all-to-all, as verl and AReaL do; ``H`` and ``H_kv`` (or ``sp``) must divide:
:func:`areal_core.config.sequence_parallel_problem` says why not, one line.

Each SP rank computes the log-probs of its tokens and all-gathers them, so every rank of the group
holds the whole micro-batch's log-probs and computes the same loss; the gather's backward keeps
each rank's own slice of the gradient, so its parameters get its tokens' share and FSDP's sum over
ranks adds the shares up to the full gradient.
"""

from __future__ import annotations

from typing import Any

import attrs
import torch
import torch.distributed as dist

from areal_core.train.packing import PackedBatch

#: The transformers attention implementation that the policy runs with under SP.
ATTENTION = "areal_ulysses"


@attrs.frozen
class SPGroup:
    """This rank's sequence-parallel group: ``size`` consecutive ranks, this one at ``rank``."""

    group: Any  # a torch.distributed ProcessGroup
    rank: int
    size: int


def new_sp_group(sp: int) -> SPGroup:
    """Split the world into groups of ``sp`` consecutive ranks (collective: every rank calls it)."""
    world, rank = dist.get_world_size(), dist.get_rank()
    mine = None
    for start in range(0, world, sp):
        group = dist.new_group(list(range(start, start + sp)))
        if start <= rank < start + sp:
            mine = group
    return SPGroup(group=mine, rank=rank % sp, size=sp)


#: The model-forward keyword that carries a :class:`Shard` down to :func:`ulysses_attention`
#: (transformers hands a forward's extra keywords to every attention call, recomputed ones included).
SHARD_KWARG = "areal_sp_shard"


@attrs.frozen
class Shard:
    """What one SP forward's attention needs: the group, and ``[start, end)`` of each sequence (and
    of the padding block) in the whole row."""

    group: SPGroup
    segments: list[tuple[int, int]]


class _Exchange(torch.autograd.Function):
    """``to_tokens``: ``[1, H, S, d]`` (this rank's ``S`` tokens, all heads) -> ``[1, H / sp, sp * S, d]``
    (every rank's tokens, this rank's heads); else the inverse. The backward is the other one."""

    @staticmethod
    def forward(ctx: Any, x: torch.Tensor, group: SPGroup, to_tokens: bool) -> torch.Tensor:
        ctx.group, ctx.to_tokens = group, to_tokens
        return _heads_to_tokens(x, group) if to_tokens else _tokens_to_heads(x, group)

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[torch.Tensor, None, None]:
        exchange = _tokens_to_heads if ctx.to_tokens else _heads_to_tokens
        return exchange(grad, ctx.group), None, None


# Both exchanges work in the token-major layout ``[tokens, heads, d]`` that transformers' q/k/v
# and SDPA's output already have in memory, so each costs one ``all_to_all_single`` and one copy:
# rank j's slice along the exchanged axis is then a contiguous block.


def _heads_to_tokens(x: torch.Tensor, group: SPGroup) -> torch.Tensor:
    _, heads, tokens, dim = x.shape
    send = x.transpose(1, 2).reshape(tokens, group.size, heads // group.size, dim).transpose(0, 1).contiguous()
    received = torch.empty_like(send)  # [rank j, its tokens, my heads, d]
    dist.all_to_all_single(received, send, group=group.group)
    return received.view(1, group.size * tokens, heads // group.size, dim).transpose(1, 2)


def _tokens_to_heads(x: torch.Tensor, group: SPGroup) -> torch.Tensor:
    _, heads, tokens, dim = x.shape
    local = tokens // group.size
    send = x.transpose(1, 2).reshape(group.size, local, heads, dim).contiguous()  # a view for SDPA's output
    received = torch.empty_like(send)  # [rank j, my tokens, its heads, d]
    dist.all_to_all_single(received, send, group=group.group)
    return received.transpose(0, 1).reshape(1, local, group.size * heads, dim).transpose(1, 2)


def ulysses_attention(
    module: torch.nn.Module, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor,
    attention_mask: torch.Tensor | None, scaling: float | None = None, dropout: float = 0.0,
    sliding_window: int | None = None, **kwargs: Any,
) -> tuple[torch.Tensor, None]:  # fmt: skip
    """A transformers attention function (``[1, heads, tokens of this rank, head_dim]`` in,
    ``[1, tokens of this rank, heads, head_dim]`` out) for the :class:`Shard` passed as
    :data:`SHARD_KWARG` to the model's forward."""
    shard = kwargs.get(SHARD_KWARG)
    if shard is None:
        raise RuntimeError(f"attention {ATTENTION!r} needs the model forward's {SHARD_KWARG}= keyword")
    if sliding_window is not None:
        raise ValueError(
            f"actor.sequence_parallel: {type(module).__name__} attends within a sliding window of {sliding_window} "
            "tokens, which sequence parallelism does not implement; set actor.sequence_parallel=1"
        )
    group = shard.group
    if key.shape[1] < group.size:  # GQA/MQA: every rank needs a kv head of its own
        repeat = group.size // key.shape[1]
        key, value = key.repeat_interleave(repeat, dim=1), value.repeat_interleave(repeat, dim=1)
    q, k, v = (_Exchange.apply(t, group, True) for t in (query, key, value))  # [1, H / sp, N, d]
    outs = [
        torch.nn.functional.scaled_dot_product_attention(
            q[:, :, a:b], k[:, :, a:b], v[:, :, a:b], dropout_p=dropout, is_causal=True, scale=scaling,
            enable_gqa=q.shape[1] != k.shape[1],
        )
        for a, b in shard.segments
    ]  # fmt: skip
    out = outs[0] if len(outs) == 1 else torch.cat(outs, dim=2)
    return _Exchange.apply(out, group, False).transpose(1, 2), None  # token-major in memory: no copy


def register_attention() -> None:
    """Make :data:`ATTENTION` a transformers attention implementation (idempotent)."""
    from areal_core.train.attention_registry import register_attention as register

    register(ATTENTION, ulysses_attention)


class _GatherTokens(torch.autograd.Function):
    """All-gather each rank's ``[n]`` values into ``[size * n]``; the backward keeps this rank's
    slice (every rank of the group computes the same loss from the gathered values)."""

    @staticmethod
    def forward(ctx: Any, local: torch.Tensor, group: SPGroup) -> torch.Tensor:
        ctx.group, ctx.n = group, local.shape[0]
        parts = [torch.empty_like(local) for _ in range(group.size)]
        dist.all_gather(parts, local.contiguous(), group=group.group)
        return torch.cat(parts)

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[torch.Tensor, None]:
        start = ctx.group.rank * ctx.n
        return grad[start : start + ctx.n].contiguous(), None


def gather_tokens(local: torch.Tensor, group: SPGroup) -> torch.Tensor:
    return _GatherTokens.apply(local, group)


def row_segments(batch: PackedBatch) -> list[tuple[int, int]]:
    """``[start, end)`` of each sequence of a one-row batch, and of its padding block if any."""
    bounds = batch.cu_seqlens.tolist()
    segments = list(zip(bounds[:-1], bounds[1:]))
    width = batch.input_ids.shape[1]
    return segments + [(bounds[-1], width)] if bounds[-1] < width else segments


def local_slice(batch: PackedBatch, group: SPGroup) -> slice:
    """The columns of a one-row batch that this SP rank runs."""
    width = batch.input_ids.shape[1]
    if batch.input_ids.shape[0] != 1 or width % group.size:
        shape = tuple(batch.input_ids.shape)
        raise ValueError(f"need one row padded to a multiple of {group.size} tokens; got {shape}")
    n = width // group.size
    return slice(group.rank * n, (group.rank + 1) * n)


def sharded_token_logprobs(
    model: torch.nn.Module, batch: PackedBatch, group: SPGroup, *, temperature: float, chunk_size: int,
    with_entropy: bool, keep_bytes: int = 0,
) -> tuple[torch.Tensor, torch.Tensor | None]:  # fmt: skip
    """:func:`areal_core.train.logprobs.packed_token_logprobs` of a one-row ``batch`` (see
    :func:`areal_core.train.packing.pack_in_one_row`), this rank running its slice of the row; with
    :attr:`PackedBatch.scored`, the head only at this slice's positions that predict a scored token."""
    from areal_core.train.logprobs import (
        align_to_tokens, predicting_scored, spread_rows, token_logprobs, unsharded_head_weight,
    )
    from areal_core.train.packing import packed_hidden_states

    columns = local_slice(batch, group)
    n_local = columns.stop - columns.start
    local = attrs.evolve(
        batch,
        input_ids=batch.input_ids[:, columns],
        position_ids=batch.position_ids[:, columns],
        tokens=torch.arange(n_local, device=batch.tokens.device),
    )
    n, row = batch.n_tokens, batch.input_ids[0]
    labels = torch.cat([row[1:], row.new_zeros(1)])[columns]  # the token each position predicts
    rows = None  # this slice's positions that run the head: all, or those predicting a scored token
    if batch.scored is not None:
        rows = predicting_scored(batch)
        rows = rows[(rows >= columns.start) & (rows < columns.stop)] - columns.start
        labels = labels[rows]
    hidden = packed_hidden_states(model, local, rows, **{SHARD_KWARG: Shard(group, row_segments(batch))})
    logp, entropy = token_logprobs(
        hidden, unsharded_head_weight(model), labels, temperature=temperature, chunk_size=chunk_size,
        with_entropy=with_entropy, keep_bytes=keep_bytes,
    )  # fmt: skip
    if rows is not None:
        logp, entropy = (spread_rows(v, rows, n_local) for v in (logp, entropy))
    logp = gather_tokens(logp, group)[: n - 1]
    entropy = gather_tokens(entropy, group)[: n - 1] if entropy is not None else None
    return align_to_tokens(logp, batch), align_to_tokens(entropy, batch)
