"""Shared prefixes (``actor.share_prefixes``): a micro-batch's sequences that start with the same
tokens run those tokens through the model once.

GRPO samples ``n`` answers per prompt, so a micro-batch holds each prompt ``n`` times; on short
answers the prompts are most of the tokens. Here sequences are grouped into *clusters* that share
a prefix (:func:`plan_clusters`: the partition that saves the most tokens, one level deep), and
each cluster is laid out as its prefix once followed by every member's remainder, in one row
(:class:`SharedLayout`). A remainder's tokens attend to the prefix and causally to their own
remainder, never to another member's; position ids carry on from the prefix. Every token then
computes what it would alone: the prefix's keys and values are the same for every member, so the
decoder's hidden states of the packed sequences are the layout's, gathered back with
:attr:`SharedLayout.expand` (its backward adds up the prefix's gradients over the members, which
is what separate forwards would have summed). The log-probs and the loss downstream see the usual
packed order and do not change.

The attention is a transformers attention implementation (:data:`ATTENTION`): per cluster, causal
SDPA over the prefix, then for each remainder SDPA over the prefix's and its own keys (all of the
prefix, its own causally), so attention does the same work as without sharing, less the repeated
prefixes; a sequence that shares nothing is a cluster of one (its prefix is all of it).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import attrs
import torch

if TYPE_CHECKING:
    from areal_core.train.packing import PackedBatch

#: The transformers attention implementation of a policy that shares prefixes.
ATTENTION = "areal_shared_prefix"
#: The model-forward keyword that carries the :class:`SharedLayout` down to :func:`shared_prefix_attention`.
LAYOUT_KWARG = "areal_shared_layout"
#: The shortest prefix worth sharing (tokens): below it the tokens saved do not pay for a masked attention.
MIN_PREFIX = 8


@attrs.frozen
class Cluster:
    """Sequences ``members`` (indices into the caller's list) that share their first ``prefix`` tokens."""

    members: tuple[int, ...]
    prefix: int


def plan_clusters(sequences: Sequence[Sequence[int]], min_prefix: int) -> list[Cluster]:
    """Partition ``sequences`` into clusters that share a prefix of at least ``min_prefix`` tokens,
    saving the most tokens (``(members - 1) * prefix`` summed); the rest are clusters of one
    (``prefix`` = the whole sequence). Every member keeps at least one token of its own.

    Sorted, sequences with a common prefix are neighbours; a range of them shares the smallest
    common prefix of neighbouring pairs, or splits where that is smallest and its parts share more.
    """
    order = sorted(range(len(sequences)), key=lambda i: tuple(sequences[i]))
    common = [_common_prefix(sequences[a], sequences[b]) for a, b in zip(order, order[1:])]

    def best(lo: int, hi: int) -> tuple[int, list[Cluster]]:
        members = order[lo:hi]
        if hi - lo == 1:
            return 0, [Cluster((members[0],), len(sequences[members[0]]))]
        low = min(common[lo : hi - 1])
        prefix = min(low, min(len(sequences[i]) for i in members) - 1)
        whole = (hi - lo - 1) * prefix if prefix >= min_prefix else 0
        cuts = [lo] + [k + 1 for k in range(lo, hi - 1) if common[k] == low] + [hi]
        parts = [best(a, b) for a, b in zip(cuts, cuts[1:])] if len(cuts) > 2 else []
        split = sum(saved for saved, _ in parts)
        if parts and split >= whole:
            return split, [c for _, clusters in parts for c in clusters]
        if whole:
            return whole, [Cluster(tuple(sorted(members)), prefix)]
        return 0, [Cluster((i,), len(sequences[i])) for i in members]

    if not sequences:
        return []
    return sorted(best(0, len(order))[1], key=lambda c: c.members[0])


def micro_batches(sequences: Sequence[Sequence[int]], budget: int, min_prefix: int) -> list[list[int]]:
    """First-fit-decreasing bins of ``sequences`` (indices) by their size *after* sharing: each
    cluster goes whole into a bin, or in parts of members whose prefix + remainders fit ``budget``."""
    from areal_core.train.packing import first_fit_decreasing

    parts: list[list[int]] = []
    sizes: list[int] = []
    for cluster in plan_clusters(sequences, min_prefix):
        parts.append([])
        sizes.append(cluster.prefix)
        for i in sorted(cluster.members, key=lambda i: -len(sequences[i])):
            rest = len(sequences[i]) - cluster.prefix
            if parts[-1] and sizes[-1] + rest > budget:  # a cluster larger than the budget: in parts
                parts.append([])
                sizes.append(cluster.prefix)
            parts[-1].append(i)
            sizes[-1] += rest
    return [sorted(i for k in b for i in parts[k]) for b in first_fit_decreasing(sizes, budget)]


@attrs.frozen(eq=False)
class SharedLayout:
    """The model's input for a micro-batch with shared prefixes: one row of ``C`` tokens, and the
    attention calls over it, in row order: each cluster's prefix (causal over itself), then each
    member's remainder (over the prefix's keys and its own: all of the prefix, its own causally).

    A call's queries are the next ``query_sizes[i]`` row tokens; its keys are the next
    ``key_sizes[i]`` entries of ``key_index`` (row positions)."""

    input_ids: torch.Tensor  # long [1, C]
    position_ids: torch.Tensor  # long [1, C]
    expand: torch.Tensor  # long [N]: the row position of each packed token (packed order)
    query_sizes: tuple[int, ...]  # sums to C
    key_index: torch.Tensor  # long [sum(key_sizes)]
    key_sizes: tuple[int, ...]
    masks: tuple[torch.Tensor | None, ...]  # bool [queries, keys]; None: causal (a prefix)

    def to(self, device: torch.device | str) -> SharedLayout:
        return attrs.evolve(
            self,
            input_ids=self.input_ids.to(device),
            position_ids=self.position_ids.to(device),
            expand=self.expand.to(device),
            key_index=self.key_index.to(device),
            masks=tuple(None if m is None else m.to(device) for m in self.masks),
        )


def shared_layout(sequences: Sequence[Sequence[int]], clusters: Sequence[Cluster]) -> SharedLayout:
    """The row of ``clusters`` over ``sequences`` (the micro-batch's, in packed order)."""
    ids: list[int] = []
    positions: list[int] = []
    expand: dict[int, list[int]] = {}  # sequence -> the row position of each of its tokens
    query_sizes: list[int] = []
    keys: list[list[int]] = []
    masks: list[torch.Tensor | None] = []
    for cluster in clusters:
        start, p = len(ids), cluster.prefix
        prefix = list(range(start, start + p))
        ids += sequences[cluster.members[0]][:p]
        positions += range(p)
        query_sizes.append(p)
        keys.append(prefix)
        masks.append(None)
        for i in cluster.members:
            rest = sequences[i][p:]
            own = list(range(len(ids), len(ids) + len(rest)))
            expand[i] = prefix + own
            if rest:
                query_sizes.append(len(rest))
                keys.append(prefix + own)
                causal = torch.ones(len(rest), len(rest), dtype=torch.bool).tril()
                masks.append(torch.cat([torch.ones(len(rest), p, dtype=torch.bool), causal], dim=1))
            ids += rest
            positions += range(p, p + len(rest))
    return SharedLayout(
        input_ids=torch.tensor(ids, dtype=torch.long)[None],
        position_ids=torch.tensor(positions, dtype=torch.long)[None],
        expand=torch.tensor([t for i in range(len(sequences)) for t in expand[i]], dtype=torch.long),
        query_sizes=tuple(query_sizes),
        key_index=torch.tensor([t for k in keys for t in k], dtype=torch.long),
        key_sizes=tuple(map(len, keys)),
        masks=tuple(masks),
    )


def pack_sharing_prefixes(sequences: Sequence[Sequence[int]], indices: Sequence[int], min_prefix: int) -> PackedBatch:
    """:func:`areal_core.train.packing.pack_in_one_row` of ``sequences[i] for i in indices`` with the
    :class:`SharedLayout` of their clusters (prefixes of at least ``min_prefix`` tokens) for the model."""
    from areal_core.train.packing import pack_in_one_row

    batch = pack_in_one_row(sequences, indices, 1)
    chosen = [sequences[i] for i in indices]
    return attrs.evolve(batch, shared=shared_layout(chosen, plan_clusters(chosen, min_prefix)))


def _common_prefix(a: Sequence[int], b: Sequence[int]) -> int:
    n = 0
    for x, y in zip(a, b):
        if x != y:
            break
        n += 1
    return n


def shared_prefix_attention(
    module: torch.nn.Module, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor,
    attention_mask: torch.Tensor | None, scaling: float | None = None, dropout: float = 0.0,
    sliding_window: int | None = None, **kwargs: Any,
) -> tuple[torch.Tensor, None]:  # fmt: skip
    """A transformers attention function (``[1, heads, C, head_dim]`` in, ``[1, C, heads, head_dim]``
    out) over the :class:`SharedLayout` passed as :data:`LAYOUT_KWARG` to the model's forward."""
    layout: SharedLayout | None = kwargs.get(LAYOUT_KWARG)
    if layout is None:
        raise RuntimeError(f"attention {ATTENTION!r} needs the model forward's {LAYOUT_KWARG}= keyword")
    if sliding_window is not None:
        raise ValueError(
            f"actor.share_prefixes: {type(module).__name__} attends within a sliding window of {sliding_window} "
            "tokens, which shared prefixes do not implement; set actor.share_prefixes=false"
        )
    options = {"dropout_p": dropout, "scale": scaling, "enable_gqa": query.shape[1] != key.shape[1]}
    sdpa = torch.nn.functional.scaled_dot_product_attention
    # One split and one gather per tensor, not a slice per call: each slice's backward would fill a
    # whole-row gradient with zeros and add it up, a whole row per call.
    queries = query.split(layout.query_sizes, dim=2)
    keys = key.index_select(2, layout.key_index).split(layout.key_sizes, dim=2)
    values = value.index_select(2, layout.key_index).split(layout.key_sizes, dim=2)
    outs = [sdpa(q, k, v, attn_mask=mask, is_causal=mask is None, **options)
            for q, k, v, mask in zip(queries, keys, values, layout.masks)]  # fmt: skip
    out = outs[0] if len(outs) == 1 else torch.cat(outs, dim=2)
    return out.transpose(1, 2), None


def register_attention() -> None:
    """Make :data:`ATTENTION` a transformers attention implementation (idempotent)."""
    from areal_core.train.attention_registry import register_attention as register

    register(ATTENTION, shared_prefix_attention)
