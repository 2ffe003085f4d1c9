"""Exact-match rewards for the synthetic tasks in :mod:`areal_core.builtin.datasets.synthetic`."""

from __future__ import annotations


def exact_match(prompt: str, completion: str, answer: str, **_: object) -> float:
    """1.0 iff the completion, stripped of surrounding whitespace, is exactly ``answer``."""
    return 1.0 if completion.strip() == answer else 0.0


arith_reward = exact_match
reverse_reward = exact_match
