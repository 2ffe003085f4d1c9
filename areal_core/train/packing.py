"""Sequence packing: first-fit-decreasing micro-batches, a packed (padding-free) layout, and the
decoder forward over it with no attention across sequence boundaries.

A micro-batch is one row of concatenated sequences (``[1, N]``) whose position ids restart at 0
for each sequence; ``cu_seqlens`` marks the boundaries, as flash-attention's varlen kernels expect.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

import attrs

if TYPE_CHECKING:
    import torch


def first_fit_decreasing(lengths: Sequence[int], max_tokens: int) -> list[list[int]]:
    """Group sequence indices into bins of total length <= ``max_tokens`` (first-fit, longest first).

    A sequence longer than ``max_tokens`` gets a bin of its own (never dropped or split). Ties in
    length keep input order, so the result is deterministic. Indices within a bin are ascending.
    """
    if max_tokens < 1:
        raise ValueError(f"max_tokens={max_tokens} must be >= 1")
    _check_lengths(lengths)
    bins: list[list[int]] = []
    room: list[int] = []  # free tokens left in each bin
    for i in sorted(range(len(lengths)), key=lambda i: (-lengths[i], i)):
        n = lengths[i]
        slot = next((b for b, free in enumerate(room) if free >= n), None)
        if slot is None:
            bins.append([i])
            room.append(max(max_tokens - n, 0))  # an oversize sequence fills its bin
        else:
            bins[slot].append(i)
            room[slot] -= n
    return [sorted(b) for b in bins]


@attrs.frozen(eq=False)
class PackedBatch:
    """Sequences concatenated into one row, with per-sequence position ids and boundaries."""

    input_ids: torch.Tensor  # long [1, N]
    position_ids: torch.Tensor  # long [1, N], restarting at 0 for each sequence
    cu_seqlens: torch.Tensor  # int32 [n_seqs + 1], cumulative sequence lengths
    seq_ids: torch.Tensor  # long [N], local index of each token's sequence
    indices: tuple[int, ...]  # position of each packed sequence in the caller's list

    @property
    def n_seqs(self) -> int:
        return len(self.indices)

    @property
    def n_tokens(self) -> int:
        return self.input_ids.shape[1]

    @property
    def seq_lens(self) -> list[int]:
        return self.cu_seqlens.diff().tolist()

    @property
    def seq_starts(self) -> torch.Tensor:
        """Bool ``[N]``: True at the first token of each sequence."""
        return self.position_ids[0] == 0

    def to(self, device: torch.device | str) -> PackedBatch:
        """The same batch with every tensor on ``device``."""
        return attrs.evolve(
            self,
            input_ids=self.input_ids.to(device),
            position_ids=self.position_ids.to(device),
            cu_seqlens=self.cu_seqlens.to(device),
            seq_ids=self.seq_ids.to(device),
        )


def pack(sequences: Sequence[Sequence[int]], indices: Sequence[int]) -> PackedBatch:
    """Pack ``sequences[i] for i in indices`` (in that order) into one row."""
    import torch

    if not indices:
        raise ValueError("pack needs at least one sequence index; got an empty bin")
    chosen = [sequences[i] for i in indices]
    lengths = [len(s) for s in chosen]
    _check_lengths(lengths, indices)
    lens = torch.tensor(lengths, dtype=torch.long)
    ids = torch.tensor([tok for s in chosen for tok in s], dtype=torch.long)
    cu = torch.zeros(len(lengths) + 1, dtype=torch.int32)
    cu[1:] = lens.cumsum(0)
    seq_ids = torch.repeat_interleave(torch.arange(len(lengths)), lens)
    positions = torch.arange(len(ids)) - cu[:-1].long()[seq_ids]
    return PackedBatch(
        input_ids=ids.unsqueeze(0),
        position_ids=positions.unsqueeze(0),
        cu_seqlens=cu,
        seq_ids=seq_ids,
        indices=tuple(int(i) for i in indices),
    )


def pack_per_token(values: Sequence[Sequence[float]], batch: PackedBatch, dtype: torch.dtype) -> torch.Tensor:
    """Lay per-token side data (loss masks, behaviour log-probs) out in ``batch``'s token order: ``[N]``."""
    import torch

    for i, n in zip(batch.indices, batch.seq_lens):
        if len(values[i]) != n:
            raise ValueError(f"values[{i}] has {len(values[i])} entries but sequence {i} has {n} tokens")
    return torch.cat([torch.as_tensor(values[i], dtype=dtype) for i in batch.indices])


def unpack(flat: torch.Tensor, cu_seqlens: torch.Tensor) -> list[torch.Tensor]:
    """Split a packed ``[N, ...]`` tensor back into one tensor per sequence."""
    lengths = cu_seqlens.diff().tolist()
    if sum(lengths) != flat.shape[0]:
        raise ValueError(f"cu_seqlens covers {sum(lengths)} tokens but the tensor has {flat.shape[0]}")
    return list(flat.split(lengths))


def packed_hidden_states(model: torch.nn.Module, batch: PackedBatch) -> torch.Tensor:
    """Final (normed) decoder hidden states ``[N, hidden]`` of a HF causal LM over a packed batch.

    Masking: transformers' own packed-sequence path. With ``attention_mask=None``, no cache and
    position ids that restart at 0, ``create_causal_mask`` detects the sequence boundaries and
    builds a block-diagonal causal mask (one ``[1, 1, N, N]`` bool mask shared by all layers for
    sdpa, an additive one for eager, a BlockMask for flex), and flash-attention derives varlen
    ``cu_seqlens`` from the position ids (no mask at all). So no token attends across sequences,
    whatever attention implementation the model was loaded with.

    The forward goes through the root module (``model(...)``) rather than ``model.get_decoder()``
    directly, so FSDP2's root hooks all-gather the embedding/norm/head parameters; the decoder's
    output is captured with a forward hook and the head runs on zero positions.
    """
    import torch

    captured: list[torch.Tensor] = []

    def _grab(_module: torch.nn.Module, _args: object, output: object) -> None:
        captured.append(output.last_hidden_state)

    handle = model.get_decoder().register_forward_hook(_grab)
    try:
        model(
            input_ids=batch.input_ids,
            position_ids=batch.position_ids,
            attention_mask=None,
            use_cache=False,
            logits_to_keep=torch.empty(0, dtype=torch.long, device=batch.input_ids.device),
        )
    finally:
        handle.remove()
    if len(captured) != 1:
        raise RuntimeError(f"expected one decoder forward per model forward, saw {len(captured)}")
    return captured[0][0]


def _check_lengths(lengths: Sequence[int], names: Sequence[int] | None = None) -> None:
    for pos, n in enumerate(lengths):
        if n < 1:
            name = names[pos] if names is not None else pos
            raise ValueError(f"sequence {name} has length {n}; every packed sequence needs >= 1 token")
