"""Flat weight buckets for collective updates: tensors' raw bytes, concatenated in name order.

The sender broadcasts ``flatten_bucket(tensors)`` (a uint8 tensor) from rank 0; receivers
allocate ``bucket_nbytes`` bytes, receive into it and ``unflatten_bucket`` it. Raw bytes let one
bucket mix dtypes.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import torch


def parse_dtype(name: str) -> torch.dtype:
    """``"bfloat16"`` or ``"torch.bfloat16"`` -> ``torch.bfloat16``."""
    dtype = getattr(torch, name.removeprefix("torch."), None)
    if not isinstance(dtype, torch.dtype):
        raise ValueError(f"unknown dtype {name!r}; use a torch dtype name such as 'float32' or 'bfloat16'")
    return dtype


def bucket_nbytes(dtypes: Sequence[str], shapes: Sequence[Sequence[int]]) -> int:
    return sum(math.prod(shape) * parse_dtype(d).itemsize for d, shape in zip(dtypes, shapes))


def flatten_bucket(tensors: Sequence[torch.Tensor]) -> torch.Tensor:
    """One contiguous uint8 tensor holding every tensor's bytes, in order."""
    return torch.cat([t.detach().contiguous().view(-1).view(torch.uint8) for t in tensors])


def unflatten_bucket(
    flat: torch.Tensor, dtypes: Sequence[str], shapes: Sequence[Sequence[int]]
) -> list[torch.Tensor]:
    """Tensors read from ``flat`` with the given dtypes and shapes (the inverse of ``flatten_bucket``).

    Aligned tensors are views of ``flat`` (no copy); the rest are copies.
    """
    expected = bucket_nbytes(dtypes, shapes)
    if flat.numel() != expected:
        raise ValueError(f"bucket holds {flat.numel()} bytes but names/dtypes/shapes describe {expected}")
    out, offset = [], 0
    for name, shape in zip(dtypes, shapes):
        dtype = parse_dtype(name)
        n = math.prod(shape) * dtype.itemsize
        part = flat[offset : offset + n]
        if offset % dtype.itemsize:  # ``view`` needs the byte offset aligned to the dtype: copy
            part = part.clone()
        out.append(part.view(dtype).view(tuple(shape)))
        offset += n
    return out
