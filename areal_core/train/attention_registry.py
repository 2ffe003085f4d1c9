"""Registering the trainer's own attention functions with transformers (sequence parallelism,
shared prefixes): each comes with no mask of transformers' making, since it masks by the layout
its forward keyword carries."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any


def _no_mask(*_: Any, **__: Any) -> None:
    return None


def register_attention(name: str, function: Callable[..., Any]) -> None:
    """Make ``function`` the transformers attention implementation ``name``, with no mask built (idempotent)."""
    from transformers import AttentionInterface
    from transformers.masking_utils import AttentionMaskInterface

    AttentionInterface.register(name, function)
    AttentionMaskInterface.register(name, _no_mask)
