"""Workflow protocol and the helpers the built-in workflows share.

A workflow is an async callable ``(engine, data) -> list[Trajectory] | None`` that runs one
episode: a group of trajectories sharing ``prompt_id``; ``None`` rejects the episode.
"""

from __future__ import annotations

import functools
import hashlib
import uuid
from collections.abc import Sequence
from typing import Any, Protocol

import attrs

from areal_core.config import GenerationConfig
from areal_core.api.engine import GenerationResponse, InferenceEngine, SamplingParams
from areal_core.api.trajectory import Trajectory


class Workflow(Protocol):
    async def __call__(self, engine: InferenceEngine, data: dict[str, Any]) -> list[Trajectory] | None: ...


class RewardScorer(Protocol):
    """What workflows need from :class:`areal_core.rollout.reward_runner.RewardRunner`."""

    async def score(self, prompt: str, completion: str, data: dict[str, Any]) -> float: ...

    async def score_many(self, jobs: Sequence[tuple[str, str, dict[str, Any]]]) -> list[float]:
        """``score(*job)`` for each job, in order (one round trip for a group)."""
        ...


def sampling_params(gconfig: GenerationConfig, tokenizer: Any, *, greedy: bool = False) -> SamplingParams:
    """Sampling from ``gconfig``; generation stops at the tokenizer's eos (and pad, if distinct)."""
    stop_ids = {t for t in (tokenizer.eos_token_id, tokenizer.pad_token_id) if t is not None}
    return SamplingParams(
        max_new_tokens=gconfig.max_new_tokens,
        temperature=gconfig.temperature,
        top_p=gconfig.top_p,
        greedy=greedy,
        stop_token_ids=tuple(sorted(stop_ids)),
    )


def encode_chat(
    tokenizer: Any, messages: list[dict[str, Any]], *, add_generation_prompt: bool, **template_kwargs: Any
) -> list[int]:
    """Token ids of ``messages`` rendered by the chat template (a dict in transformers 5);
    ``template_kwargs`` (``tools``, ``chat_template``, ...) go to ``apply_chat_template``."""
    encoded = tokenizer.apply_chat_template(
        messages, tokenize=True, add_generation_prompt=add_generation_prompt, **template_kwargs
    )
    ids = encoded["input_ids"] if not isinstance(encoded, list) else encoded
    return list(ids)


def decode_ids(tokenizer: Any, ids: list[int], *, skip_special_tokens: bool = True) -> str:
    """``tokenizer.decode(ids, skip_special_tokens=...)`` for a list of ints. A transformers
    tokenizer's stock ``decode`` first checks every id in Python (``to_py_obj``), about half the cost
    of decoding a completion, then calls ``_decode``: with the stock ``decode`` that is called directly."""
    if _has_stock_decode(type(tokenizer)):
        return tokenizer._decode(ids, skip_special_tokens=skip_special_tokens)
    return tokenizer.decode(ids, skip_special_tokens=skip_special_tokens)


@functools.cache
def _has_stock_decode(cls: type) -> bool:
    try:
        from transformers.tokenization_utils_base import PreTrainedTokenizerBase
    except ImportError:
        return False
    return getattr(cls, "decode", None) is PreTrainedTokenizerBase.decode


def stop_at_strings(tokenizer: Any, output_ids: list[int], stop: list[str]) -> int:
    """How many output tokens to keep: up to and including the first token completing a stop string.

    The engine stops on token ids only, so stop strings are applied after generation; the kept
    prefix is still a valid sample of the policy. A longer prefix's text extends a shorter one's,
    so the first such token is found by bisection: O(log n) decodes, not one per token.
    """

    def holds_stop(n: int) -> bool:
        text = decode_ids(tokenizer, output_ids[:n])
        return any(s in text for s in stop)

    if not stop or not holds_stop(len(output_ids)):
        return len(output_ids)
    shortest, longest = 1, len(output_ids)  # the first ``longest`` tokens hold a stop string
    while shortest < longest:
        middle = (shortest + longest) // 2
        if holds_stop(middle):
            longest = middle
        else:
            shortest = middle + 1
    return longest


def request_seed(*parts: object) -> int:
    """A stable 63-bit sampling seed from any printable parts (same parts -> same seed)."""
    digest = hashlib.blake2b(":".join(map(str, parts)).encode(), digest_size=8).digest()
    return int.from_bytes(digest, "little") >> 1


@attrs.define
class TokenSequence:
    """Builds one trajectory turn by turn: context tokens (masked out) and sampled output tokens."""

    input_ids: list[int] = attrs.Factory(list)
    loss_mask: list[int] = attrs.Factory(list)
    logprobs: list[float] = attrs.Factory(list)
    versions: list[int] = attrs.Factory(list)

    def add_context(self, ids: list[int]) -> None:
        self.input_ids += ids
        self.loss_mask += [0] * len(ids)
        self.logprobs += [0.0] * len(ids)
        self.versions += [-1] * len(ids)

    def add_output(self, response: GenerationResponse, n_tokens: int) -> None:
        """Append the first ``n_tokens`` sampled tokens of ``response``."""
        self.input_ids += response.output_ids[:n_tokens]
        self.loss_mask += [1] * n_tokens
        self.logprobs += response.logprobs[:n_tokens]
        self.versions += response.versions[:n_tokens]

    def to_trajectory(self, prompt_id: str, reward: float, info: dict[str, Any]) -> Trajectory:
        return Trajectory(
            uid=uuid.uuid4().hex,
            prompt_id=prompt_id,
            input_ids=list(self.input_ids),
            loss_mask=list(self.loss_mask),
            logprobs=list(self.logprobs),
            versions=list(self.versions),
            reward=reward,
            info=info,
        )
