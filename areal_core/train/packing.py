"""Sequence packing: first-fit-decreasing micro-batches, a packed layout, and the decoder forward
over it with no attention across sequence boundaries.

A micro-batch's ``N`` tokens are laid out in rows as wide as its longest sequence (``[R, W]``),
sequences placed first-fit-decreasing, each row's free tail one padding block; position ids
restart at 0 for every sequence and padding block. Attention then costs at most ``N * W`` (not
``N * N`` as in one long row), and padding is at most one block per row. ``tokens`` maps the
packed token order (sequences in the caller's order, back to back) to the flat row layout;
``cu_seqlens`` marks the boundaries in that order, as flash-attention's varlen kernels expect.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

import attrs

if TYPE_CHECKING:
    import torch

    from areal_core.train.shared_prefix import SharedLayout


def first_fit_decreasing(lengths: Sequence[int], max_tokens: int) -> list[list[int]]:
    """Group sequence indices into bins of total length <= ``max_tokens`` (first-fit, longest first).

    A sequence longer than ``max_tokens`` gets a bin of its own (never dropped or split). Ties in
    length keep input order, so the result is deterministic. Indices within a bin are ascending.
    """
    if max_tokens < 1:
        raise ValueError(f"max_tokens={max_tokens} must be >= 1")
    _check_lengths(lengths)
    bins: list[list[int]] = []
    room: dict[int, int] = {}  # free tokens left in each bin that can still take the shortest sequence
    shortest = min(lengths, default=0)
    for i in sorted(range(len(lengths)), key=lambda i: (-lengths[i], i)):
        n = lengths[i]
        slot = next((b for b, free in room.items() if free >= n), None)  # dicts keep bin order
        if slot is None:
            slot = len(bins)
            bins.append([i])
            room[slot] = max(max_tokens - n, 0)  # an oversize sequence fills its bin
        else:
            bins[slot].append(i)
            room[slot] -= n
        if room[slot] < shortest:  # full for good: no longer scanned
            del room[slot]
    return [sorted(b) for b in bins]


@attrs.frozen(eq=False)
class PackedBatch:
    """Sequences packed into rows, with per-sequence position ids and boundaries."""

    input_ids: torch.Tensor  # long [R, W], padding blocks hold token 0
    position_ids: torch.Tensor  # long [R, W], restarting at 0 for each sequence and padding block
    tokens: torch.Tensor  # long [N], flat ``[R * W]`` position of each packed token
    cu_seqlens: torch.Tensor  # int32 [n_seqs + 1], cumulative sequence lengths
    seq_ids: torch.Tensor  # long [N], local index of each token's sequence
    indices: tuple[int, ...]  # position of each packed sequence in the caller's list
    # set: the model runs this layout instead (shared prefixes once); the fields above keep the packed order
    shared: SharedLayout | None = None
    # set: bool [N], the tokens whose log-probs the caller reads (its loss tokens); the output head
    # runs only on the positions that predict them, and the others come back as 0
    scored: torch.Tensor | None = None

    @property
    def n_seqs(self) -> int:
        return len(self.indices)

    @property
    def n_tokens(self) -> int:
        return self.tokens.shape[0]

    @property
    def seq_lens(self) -> list[int]:
        return self.cu_seqlens.diff().tolist()

    @property
    def flat_ids(self) -> torch.Tensor:
        """Long ``[N]``: the packed tokens, sequences back to back in ``indices`` order."""
        return self.input_ids.reshape(-1)[self.tokens]

    @property
    def seq_starts(self) -> torch.Tensor:
        """Bool ``[N]``: True at the first token of each sequence."""
        return self.position_ids.reshape(-1)[self.tokens] == 0

    def to(self, device: torch.device | str) -> PackedBatch:
        """The same batch with every tensor on ``device``."""
        return attrs.evolve(
            self,
            input_ids=self.input_ids.to(device),
            position_ids=self.position_ids.to(device),
            tokens=self.tokens.to(device),
            cu_seqlens=self.cu_seqlens.to(device),
            seq_ids=self.seq_ids.to(device),
            shared=self.shared.to(device) if self.shared is not None else None,
            scored=self.scored.to(device) if self.scored is not None else None,
        )


def pack(sequences: Sequence[Sequence[int]], indices: Sequence[int]) -> PackedBatch:
    """Pack ``sequences[i] for i in indices`` (in that order) into rows as wide as the longest."""
    import torch

    chosen, lengths = _chosen(sequences, indices, "pack")
    width = max(lengths)
    rows = first_fit_decreasing(lengths, width)
    starts = [0] * len(lengths)  # flat offset of each sequence's first token
    used = [0] * len(rows)
    for r, row in enumerate(rows):
        for k in row:
            starts[k] = r * width + used[r]
            used[r] += lengths[k]
    cu, seq_ids = _boundaries(lengths)
    positions = torch.arange(int(cu[-1])) - cu[:-1].long()[seq_ids]
    tokens = torch.tensor(starts, dtype=torch.long)[seq_ids] + positions
    ids = torch.zeros(len(rows) * width, dtype=torch.long)
    ids[tokens] = torch.tensor([tok for s in chosen for tok in s], dtype=torch.long)
    pad_positions = (torch.arange(width)[None, :] - torch.tensor(used)[:, None]).clamp(min=0)  # each row's free tail
    grid_positions = pad_positions.reshape(-1)
    grid_positions[tokens] = positions
    return PackedBatch(
        input_ids=ids.view(len(rows), width),
        position_ids=grid_positions.view(len(rows), width),
        tokens=tokens,
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
    return torch.tensor([x for i in batch.indices for x in values[i]], dtype=dtype)


def unpack(flat: torch.Tensor, cu_seqlens: torch.Tensor) -> list[torch.Tensor]:
    """Split a packed ``[N, ...]`` tensor back into one tensor per sequence."""
    lengths = cu_seqlens.diff().tolist()
    if sum(lengths) != flat.shape[0]:
        raise ValueError(f"cu_seqlens covers {sum(lengths)} tokens but the tensor has {flat.shape[0]}")
    return list(flat.split(lengths))


def _chosen(
    sequences: Sequence[Sequence[int]], indices: Sequence[int], caller: str
) -> tuple[list[Sequence[int]], list[int]]:
    """``sequences[i] for i in indices`` and their lengths (each >= 1; at least one index)."""
    if not indices:
        raise ValueError(f"{caller} needs at least one sequence index; got an empty bin")
    chosen = [sequences[i] for i in indices]
    lengths = [len(s) for s in chosen]
    _check_lengths(lengths, indices)
    return chosen, lengths


def _boundaries(lengths: Sequence[int]) -> tuple[torch.Tensor, torch.Tensor]:
    """``cu_seqlens`` (int32, ``[n + 1]``) and each packed token's sequence index (long)."""
    import torch

    lens = torch.tensor(lengths, dtype=torch.long)
    cu = torch.zeros(len(lengths) + 1, dtype=torch.int32)
    cu[1:] = lens.cumsum(0)
    return cu, torch.repeat_interleave(torch.arange(len(lengths)), lens)


def pack_in_one_row(sequences: Sequence[Sequence[int]], indices: Sequence[int], multiple: int) -> PackedBatch:
    """Pack ``sequences[i] for i in indices`` back to back into one row, padded with one block to
    a multiple of ``multiple`` tokens (sequence parallelism splits the row into that many slices)."""
    import torch

    chosen, lengths = _chosen(sequences, indices, "pack_in_one_row")
    n = sum(lengths)
    width = -(-n // multiple) * multiple
    cu, seq_ids = _boundaries(lengths)
    ids = torch.zeros(width, dtype=torch.long)
    ids[:n] = torch.tensor([tok for s in chosen for tok in s], dtype=torch.long)
    positions = torch.arange(width) - torch.cat([cu[:-1].long()[seq_ids], torch.full((width - n,), n)])
    return PackedBatch(
        input_ids=ids.view(1, width),
        position_ids=positions.view(1, width),
        tokens=torch.arange(n),
        cu_seqlens=cu,
        seq_ids=seq_ids,
        indices=tuple(int(i) for i in indices),
    )


def packed_hidden_states(
    model: torch.nn.Module, batch: PackedBatch, positions: torch.Tensor | None = None, **forward_kwargs: object
) -> torch.Tensor:
    """Final (normed) decoder hidden states ``[N, hidden]`` of a HF causal LM over a packed batch,
    in packed token order (padding dropped); with ``positions`` (long, packed token positions), only
    those tokens' states, in that order. ``forward_kwargs`` go to the model's forward (and
    from there to its attention calls). A batch with a :attr:`PackedBatch.shared` layout runs that
    layout instead (``areal_core/train/shared_prefix.py``).

    Masking: transformers' own packed-sequence path. With ``attention_mask=None``, no cache and
    position ids that restart at 0, ``create_causal_mask`` detects the sequence boundaries in each
    row and builds a block-diagonal causal mask (one ``[R, 1, W, W]`` bool mask shared by all
    layers for sdpa, an additive one for eager, a BlockMask for flex), and flash-attention derives
    varlen ``cu_seqlens`` from the position ids (no mask at all). So no token attends across
    sequences (or padding blocks), whatever attention implementation the model was loaded with.

    The forward goes through the root module (``model(...)``) rather than ``model.get_decoder()``
    directly, so FSDP2's root hooks all-gather the embedding/norm/head parameters; the decoder's
    output is captured with a forward hook and the head runs on zero positions.
    """
    import torch

    captured: list[torch.Tensor] = []

    def _grab(_module: torch.nn.Module, _args: object, output: object) -> None:
        captured.append(output.last_hidden_state)

    rows, gather = batch, batch.tokens  # what the model runs, and where each packed token's state is in it
    if batch.shared is not None:
        from areal_core.train.shared_prefix import LAYOUT_KWARG

        rows, gather = batch.shared, batch.shared.expand
        forward_kwargs = {**forward_kwargs, LAYOUT_KWARG: batch.shared}
    handle = model.get_decoder().register_forward_hook(_grab)
    try:
        model(
            input_ids=rows.input_ids,
            position_ids=rows.position_ids,
            attention_mask=None,
            use_cache=False,
            logits_to_keep=torch.empty(0, dtype=torch.long, device=batch.input_ids.device),
            **forward_kwargs,
        )
    finally:
        handle.remove()
    if len(captured) != 1:
        raise RuntimeError(f"expected one decoder forward per model forward, saw {len(captured)}")
    hidden = captured[0]
    return hidden.reshape(-1, hidden.shape[-1])[gather if positions is None else gather[positions]]


def _check_lengths(lengths: Sequence[int], names: Sequence[int] | None = None) -> None:
    for pos, n in enumerate(lengths):
        if n < 1:
            name = names[pos] if names is not None else pos
            raise ValueError(f"sequence {name} has length {n}; every packed sequence needs >= 1 token")
