"""Memory-lean per-token log-probs (and entropy) from hidden states and the output embedding.

The full ``[N, V]`` logits are never held for the whole batch, neither in the forward nor the
backward: :class:`_ChunkedLogProbs` is a custom autograd function that saves only its inputs and,
in backward, recomputes each ``[chunk, V]`` block of logits, turns it into the logit gradient in
closed form and multiplies it straight into the hidden and weight gradients. Compared with
per-chunk ``torch.utils.checkpoint`` this avoids re-running autograd's softmax graph, keeps one
fp32 weight-gradient buffer instead of one ``[V, H]`` gradient per chunk summed by autograd, and
gives the entropy gradient analytically. Peak extra memory is one ``[chunk, V]`` fp32 block (two
with entropy), worked on in place.

Where the whole ``[N, V]`` fp32 log-softmax fits in ``keep_bytes``, the forward keeps it and the
backward starts from it instead of recomputing the logits (one matmul of four, and the softmax's
passes, fewer). Log-probs are computed in fp32 always; the two backward matmuls run in the
hidden states' dtype (bf16 or fp16 under mixed precision, as the rest of the model's backward
does), on logit gradients computed in fp32.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch
from torch.autograd.function import once_differentiable

if TYPE_CHECKING:
    from areal_core.train.packing import PackedBatch


def token_logprobs(
    hidden: torch.Tensor,
    weight: torch.Tensor,
    labels: torch.Tensor,
    *,
    temperature: float = 1.0,
    chunk_size: int = 1024,
    with_entropy: bool = False,
    keep_bytes: int = 0,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """``log p(labels[t] | hidden[t])`` under ``softmax(hidden @ weight.T / temperature)``, in fp32.

    Returns ``(logprobs [N], entropy [N] or None)``. Gradients flow to ``hidden`` and ``weight``.
    ``keep_bytes``: the most memory the ``[N, V]`` fp32 log-softmax may take to be kept from
    forward to backward (0: always recompute it, chunk by chunk).
    """
    if temperature <= 0:
        raise ValueError(f"temperature={temperature} must be > 0")
    if chunk_size < 1:
        raise ValueError(f"chunk_size={chunk_size} must be >= 1")
    if hidden.ndim != 2 or weight.ndim != 2 or hidden.shape[1] != weight.shape[1]:
        raise ValueError(f"need hidden [N, H] and weight [V, H]; got {tuple(hidden.shape)} and {tuple(weight.shape)}")
    if labels.shape != hidden.shape[:1]:
        raise ValueError(f"labels {tuple(labels.shape)} must be [N] with N={hidden.shape[0]}")
    backward = torch.is_grad_enabled() and (hidden.requires_grad or weight.requires_grad)
    keep = backward and hidden.shape[0] * weight.shape[0] * 4 <= keep_bytes
    logp, entropy = _ChunkedLogProbs.apply(hidden, weight, labels, temperature, chunk_size, with_entropy, keep)
    return logp, entropy if with_entropy else None


def packed_token_logprobs(
    model: torch.nn.Module,
    batch: PackedBatch,
    *,
    temperature: float = 1.0,
    chunk_size: int = 1024,
    with_entropy: bool = False,
    keep_bytes: int = 0,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Per-token log-probs ``[N]`` aligned to tokens: entry t is ``log p(input_ids[t] | earlier
    tokens of its sequence)``, 0.0 at each sequence's first token; entropy (optional) likewise is
    that of the distribution which predicted token t.

    Uses the model's output embedding (tied ``lm_head``). Works on FSDP2-sharded models: the head
    weight is read while the root's parameters are all-gathered, so its gradient reaches the
    sharded parameter through FSDP's own reduce-scatter. With :attr:`PackedBatch.scored` the head
    runs only where a scored token is predicted (a GRPO answer's positions, not its prompt's), and
    every other token gets 0. ``chunk_size``, ``with_entropy``, ``keep_bytes``: :func:`token_logprobs`'s.
    """
    from areal_core.train.packing import packed_hidden_states

    ids = batch.flat_ids
    n = ids.shape[0] - 1
    # the state at packed position t predicts ids[t + 1]; values that cross a sequence boundary
    # are masked to 0 below
    rows = torch.arange(n, device=ids.device) if batch.scored is None else predicting_scored(batch)
    hidden = packed_hidden_states(model, batch, rows)
    weight = unsharded_head_weight(model)
    logp, entropy = token_logprobs(
        hidden, weight, ids[rows + 1], temperature=temperature, chunk_size=chunk_size, with_entropy=with_entropy,
        keep_bytes=keep_bytes,
    )
    if batch.scored is not None:
        logp, entropy = (spread_rows(v, rows, n) for v in (logp, entropy))
    return align_to_tokens(logp, batch), align_to_tokens(entropy, batch)


def predicting_scored(batch: PackedBatch) -> torch.Tensor:
    """The packed positions (long) whose state predicts a token of :attr:`PackedBatch.scored`."""
    return batch.scored[1:].nonzero().squeeze(1)


def spread_rows(values: torch.Tensor | None, rows: torch.Tensor, n: int) -> torch.Tensor | None:
    """``values`` at ``rows`` of an ``[n]`` vector of zeros (differentiable)."""
    return None if values is None else values.new_zeros(n).index_copy(0, rows, values)


def align_to_tokens(next_token: torch.Tensor | None, batch: PackedBatch) -> torch.Tensor | None:
    """Values computed at packed position ``t`` for the token ``t + 1`` (``[N - 1]``), moved onto
    that token (``[N]``), with 0 at each sequence's first token (nothing of its own predicts it)."""
    if next_token is None:
        return None
    return torch.where(batch.seq_starts, 0.0, torch.cat([next_token.new_zeros(1), next_token]))


def unsharded_head_weight(model: torch.nn.Module) -> torch.Tensor:
    """The output-embedding weight as a plain tensor that FSDP2 will reduce gradients for.

    FSDP2 keeps the root's parameters all-gathered after forward by default, so the head's
    ``weight`` is already the unsharded parameter. If the root was built with
    ``reshard_after_forward=True`` it is a DTensor again; then we unshard the owning FSDP module
    explicitly (its post-backward still runs in FSDP's final backward callback). With grad enabled
    we do not use ``DTensor.full_tensor()``: its gradient would bypass FSDP's reduce-scatter (and
    in a 2-rank gloo run it crashed the process); without grad it is the simple, correct choice.
    """
    from torch.distributed.fsdp import FSDPModule
    from torch.distributed.tensor import DTensor

    head = model.get_output_embeddings()
    if head is None:
        raise ValueError(f"{type(model).__name__} has no output embedding (lm_head); cannot compute log-probs")
    if not isinstance(head.weight, DTensor):
        return head.weight
    if not torch.is_grad_enabled():  # e.g. recomputing proximal log-probs: values only
        return head.weight.full_tensor()
    owner = next((m for m in (head, model) if isinstance(m, FSDPModule)), None)
    if owner is None:
        raise ValueError("lm_head weight is a DTensor but neither lm_head nor the root is an FSDP2 module")
    owner.unshard()
    return head.weight


class _ChunkedLogProbs(torch.autograd.Function):
    """Chunked ``log_softmax`` gather (+ entropy), the log-softmax kept for or recomputed in
    backward; see the module docstring."""

    @staticmethod
    def forward(ctx, hidden, weight, labels, temperature, chunk_size, with_entropy, keep):
        ctx.set_materialize_grads(False)
        ctx.save_for_backward(hidden, weight, labels)
        ctx.temperature, ctx.chunk_size = temperature, chunk_size
        n, v = hidden.shape[0], weight.shape[0]
        ctx.log_softmax = hidden.new_empty((n, v), dtype=torch.float32) if keep else None
        w = weight.float()
        logp = hidden.new_empty(n, dtype=torch.float32)
        entropy = torch.empty_like(logp) if with_entropy else logp.new_zeros(0)
        for lo, hi in _chunks(n, chunk_size):
            ent_out = entropy[lo:hi] if with_entropy else None
            keep_out = ctx.log_softmax[lo:hi] if keep else None
            _forward_chunk(hidden[lo:hi], w, labels[lo:hi], temperature, logp[lo:hi], ent_out, keep_out)
        if not with_entropy:
            ctx.mark_non_differentiable(entropy)
        return logp, entropy

    @staticmethod
    @once_differentiable
    def backward(ctx, grad_logp, grad_entropy):
        hidden, weight, labels = ctx.saved_tensors
        kept, ctx.log_softmax = ctx.log_softmax, None
        if grad_entropy is not None and grad_entropy.numel() == 0:
            grad_entropy = None
        mm_dtype = hidden.dtype  # the backward matmuls' precision, as the model's own backward
        w = weight.float() if kept is None else None  # the fp32 copy only where logits are recomputed
        w_mm = weight.to(mm_dtype)
        grad_hidden = torch.empty_like(hidden) if ctx.needs_input_grad[0] else None
        grad_w = None
        if ctx.needs_input_grad[1]:
            grad_w = torch.zeros(weight.shape, dtype=torch.float32, device=weight.device)
        for lo, hi in _chunks(hidden.shape[0], ctx.chunk_size):
            g_lp = None if grad_logp is None else grad_logp[lo:hi, None].float()
            g_ent = None if grad_entropy is None else grad_entropy[lo:hi, None].float()
            if kept is None:
                probs, _, logp_all = _softmax_chunk(hidden[lo:hi], w, labels[lo:hi], ctx.temperature,
                                                    keep_logp=g_ent is not None)  # fmt: skip
            else:
                logp_all = kept[lo:hi]
                probs = logp_all.exp() if g_ent is not None else logp_all.exp_()
            grad_logits = _logit_grad_chunk(probs, logp_all, labels[lo:hi], ctx.temperature, g_lp, g_ent)
            grad_logits = grad_logits.to(mm_dtype)
            if grad_hidden is not None:
                grad_hidden[lo:hi] = grad_logits @ w_mm
            if grad_w is not None:
                _add_product(grad_w, grad_logits.T, hidden[lo:hi])
            del grad_logits, probs, logp_all  # free this chunk's [chunk, V] blocks before the next
        if grad_w is not None:
            grad_w = grad_w.to(weight.dtype)
        return grad_hidden, grad_w, None, None, None, None, None


def _add_product(acc: torch.Tensor, a: torch.Tensor, b: torch.Tensor) -> None:
    """``acc += a @ b``, the product taken in ``a``'s and ``b``'s dtype."""
    if a.dtype == acc.dtype:
        acc.addmm_(a, b)
    else:
        acc += a @ b


def _chunks(n: int, size: int) -> list[tuple[int, int]]:
    return [(lo, min(lo + size, n)) for lo in range(0, n, size)]


def _forward_chunk(h, w, labels, temperature, logp_out, entropy_out, log_softmax_out) -> None:
    """Write one chunk's log-probs (and entropy, and its whole log-softmax) into the output slices."""
    keep_logp = entropy_out is not None or log_softmax_out is not None
    probs, label_logp, logp_all = _softmax_chunk(h, w, labels, temperature, keep_logp=keep_logp,
                                                 out=log_softmax_out)  # fmt: skip
    logp_out.copy_(label_logp.squeeze(-1))
    if entropy_out is not None:
        entropy_out.copy_(-_rowdot(probs, logp_all).squeeze(-1))


def _logit_grad_chunk(probs, logp_all, labels, temperature, g_lp, g_ent) -> torch.Tensor:
    """Gradient w.r.t. one chunk's raw logits of  sum(g_lp * logp[label] + g_ent * entropy), from
    its softmax ``probs`` and, for the entropy term, its ``log_softmax`` (both overwritten).

    d/dz is  onehot * g_lp - p * (g_lp + g_ent * (log p + H)), then divided by the temperature.
    """
    if g_lp is None:
        g_lp = probs.new_zeros(probs.shape[0], 1)
    coef = g_lp
    if g_ent is not None:
        ent = -_rowdot(probs, logp_all)
        coef = logp_all.add_(ent).mul_(g_ent).add_(g_lp)
    grad = probs.mul_(coef).neg_().scatter_add_(-1, labels[:, None], g_lp)
    del coef
    return grad.div_(temperature) if temperature != 1.0 else grad


def _softmax_chunk(h, w, labels, temperature, *, keep_logp: bool, out: torch.Tensor | None = None):
    """``(probs [C, V], logp[label] [C, 1], log_softmax [C, V] or None)`` for one chunk, in fp32.

    Works in place in the logits buffer (``out`` if given), so without ``keep_logp`` only one
    ``[C, V]`` block lives.
    """
    z = _logits(h, w, temperature, out)
    z.sub_(z.amax(-1, keepdim=True))
    label_z = z.gather(-1, labels[:, None])
    probs = z.exp() if keep_logp else z.exp_()
    sums = probs.sum(-1, keepdim=True)
    probs.div_(sums)
    log_sums = sums.log_()
    return probs, label_z - log_sums, z.sub_(log_sums) if keep_logp else None


def _logits(hidden: torch.Tensor, weight_f32: torch.Tensor, temperature: float, out: torch.Tensor | None = None):
    logits = torch.matmul(hidden.float(), weight_f32.T, out=out)
    return logits.div_(temperature) if temperature != 1.0 else logits


def _rowdot(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """Row-wise dot product ``[C, 1]`` without a ``[C, V]`` temporary."""
    return torch.bmm(a.unsqueeze(1), b.unsqueeze(2)).squeeze(-1)
