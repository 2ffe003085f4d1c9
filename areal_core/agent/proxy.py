"""The OpenAI-compatible proxy: renders chats once, generates through the InferenceEngine, records.

Routes (a session key goes in ``Authorization: Bearer <key>`` or ``X-Areal-Session: <key>``):

- ``POST /v1/chat/completions``, ``POST /v1/completions``: OpenAI schemas, ``n >= 1``, streamed or not.
- ``POST /v1/responses``: the OpenAI Responses API (``previous_response_id`` within a session).
- ``POST /v1/messages``: Anthropic's Messages API (the key may also come as ``x-api-key``).
- ``POST /v1/reward`` ``{"reward": r, "completion_id": id?}``: reward one completion or the final answer.
- ``GET /v1/session``: this session's completions and rewards; ``POST /v1/session/end`` closes it.
- ``POST /v1/sessions`` (admin key): start a session for an agent the trainer does not launch.
- ``GET /v1/models``.

Threading: :class:`ProxyServer` runs uvicorn on its own thread and event loop, so it starts and
stops independently of the rollout runner. Each session remembers the event loop that
started it (the rollout loop, where the engine's async calls live) and its model calls run
there, so pausing for weight updates, re-submission and per-token versions work unchanged.
"""

from __future__ import annotations

import asyncio
import logging
import secrets
from typing import Any

import attrs

from areal_core.agent.openai_api import RequestError, Sampling
from areal_core.agent.sessions import (
    Completion,
    Session,
    SessionStore,
    new_completion_id,
)
from areal_core.builtin.tool_parsers.parsers import hermes
from areal_core.api.tool_call import ToolParser, ToolCall
from areal_core.config import GenerationConfig
from areal_core.api.engine import (
    GenerationRequest,
    GenerationResponse,
    InferenceEngine,
    SamplingParams,
)
from areal_core.api.workflow import decode_ids, encode_chat, sampling_params, stop_at_strings

logger = logging.getLogger(__name__)
LOOP_STOPPED = "this session's rollout loop has stopped; the episode is over"


@attrs.frozen
class Reply:
    """What the model said in one completion, in API terms (the same for every API shape)."""

    completion: Completion
    content: str
    tool_calls: list[ToolCall]
    finish_reason: str  # "stop", "length" or "tool_calls"


class AgentProxy:
    """Sessions plus the completion logic; :meth:`app` serves it over HTTP.

    Sampling: by default the trained policy's settings (``gconfig`` temperature and top-p) are
    used whatever the agent asks, so recorded log-probs match what the trainer recomputes; the
    agent's ``max_tokens`` is honoured up to ``gconfig.max_new_tokens``. With
    ``honour_request_sampling`` (serving, benchmarks) the request's temperature (0: greedy) and
    top-p win.
    """

    def __init__(
        self,
        engine: InferenceEngine,
        tokenizer: Any,
        gconfig: GenerationConfig,
        *,
        chat_template: str | None = None,
        max_body_bytes: int = 1 << 20,
        honour_request_sampling: bool = False,
        admin_key: str | None = None,
        tool_parser: ToolParser = hermes,
    ) -> None:
        self.engine = engine
        self.tokenizer = tokenizer
        self.gconfig = gconfig
        self.chat_template = chat_template or None
        self.max_body_bytes = max_body_bytes
        self.honour_request_sampling = honour_request_sampling
        self.admin_key = admin_key or secrets.token_urlsafe(32)
        self.tool_parser = tool_parser
        self.sessions = SessionStore()
        self._special = [t for t in tokenizer.all_special_tokens if t] if tokenizer is not None else []
        self._base = sampling_params(gconfig, tokenizer)

    # ------------------------------------------------------------------ completion logic
    def render_chat(
        self, messages: list[dict[str, Any]], tools: list[dict[str, Any]] | None = None, tool_choice: Any = None
    ) -> list[int]:
        """The prompt ids the model sees: the chat template applied once, with a generation prompt.

        ``tools`` and ``tool_choice`` are template variables, as in ``apply_chat_template``.
        """
        kwargs: dict[str, Any] = {}
        if tools:
            kwargs["tools"] = tools
        if tool_choice is not None:
            kwargs["tool_choice"] = tool_choice
        if self.chat_template:
            kwargs["chat_template"] = self.chat_template
        try:
            return encode_chat(self.tokenizer, messages, add_generation_prompt=True, **kwargs)
        except Exception as exc:  # noqa: BLE001 - jinja errors, characters the tokenizer cannot encode, ...
            raise RequestError(400, f"messages: the chat template/tokenizer cannot render them: {exc}", "messages") from None

    def render_text(self, prompt: str | list[int]) -> list[int]:
        """``/v1/completions`` prompt ids: the text tokenized as is, or the given ids checked."""
        if isinstance(prompt, list):
            if max(prompt) >= len(self.tokenizer):
                raise RequestError(400, f"prompt: token id {max(prompt)} is outside the vocabulary", "prompt")
            return list(prompt)
        try:
            return list(self.tokenizer.encode(prompt, add_special_tokens=False))
        except Exception as exc:  # noqa: BLE001 - reported to the agent as a 400
            raise RequestError(400, f"prompt: the tokenizer cannot encode it: {exc}", "prompt") from None

    def sampling_for(self, request: Sampling) -> SamplingParams:
        """Engine sampling for a request: see the class docstring (``seed`` is always honoured)."""
        cap = self.gconfig.max_new_tokens
        max_new = cap if request.max_tokens is None else min(request.max_tokens, cap)
        base = attrs.evolve(self._base, max_new_tokens=max_new, seed=request.seed)
        if not self.honour_request_sampling:
            return base
        return attrs.evolve(
            base,
            temperature=request.temperature or base.temperature,
            top_p=base.top_p if request.top_p is None else request.top_p,
            greedy=request.temperature == 0.0,
        )

    async def _generate(self, session: Session, request: GenerationRequest) -> GenerationResponse:
        """Run ``engine.agenerate`` on the session's engine loop (this loop when it has none)."""
        loop = session.engine_loop
        try:
            if loop is None or loop is asyncio.get_running_loop():
                return await self.engine.agenerate(request)
            future = asyncio.run_coroutine_threadsafe(self._generate_unless_cancelled(request), loop)
            response = await asyncio.wrap_future(future)
        except RuntimeError as exc:
            if loop is not None and loop.is_closed():
                raise RequestError(409, LOOP_STOPPED) from exc
            raise
        if response is None:
            raise RequestError(409, LOOP_STOPPED)
        return response

    async def _generate_unless_cancelled(self, request: GenerationRequest) -> GenerationResponse | None:
        """``engine.agenerate`` on the engine loop, or None when that loop's stop cancels it (a
        result, not an exception: no one may be left to retrieve it when the caller went first)."""
        try:
            return await self.engine.agenerate(request)
        except asyncio.CancelledError:
            return None

    async def complete(
        self, session: Session, prompt_ids: list[int], sampling: Sampling, kind: str, n: int = 1
    ) -> list[Completion]:
        """Sample ``n`` completions of ``prompt_ids`` and record them in ``session`` in index order.

        Completion ``i > 0`` has id ``<id of completion 0>-<i>`` and seed ``seed + i``.
        """
        if session.ended:
            raise RequestError(409, "this session has ended; start a new one")
        base = new_completion_id(kind)
        samples = [
            attrs.evolve(sampling, seed=None if sampling.seed is None else (sampling.seed + i) % 2**63) for i in range(n)
        ]
        completions = await asyncio.gather(
            *(self._sample(session, prompt_ids, s, f"{base}-{i}" if i else base) for i, s in enumerate(samples))
        )
        for completion in completions:
            session.add(completion)
        return list(completions)

    async def _sample(self, session: Session, prompt_ids: list[int], sampling: Sampling, completion_id: str) -> Completion:
        params = self.sampling_for(sampling)
        response = await self._generate(session, GenerationRequest(input_ids=prompt_ids, sampling=params))
        stops = list(self.gconfig.stop) + sampling.stop
        n_kept = stop_at_strings(self.tokenizer, response.output_ids, stops)
        stopped_early = n_kept < len(response.output_ids)
        return Completion(
            id=completion_id,
            prompt_ids=list(prompt_ids),
            output_ids=response.output_ids[:n_kept],
            logprobs=response.logprobs[:n_kept],
            versions=response.versions[:n_kept],
            finish_reason="stop" if stopped_early or response.stop_reason == "stop" else "length",
            text=decode_ids(self.tokenizer, response.output_ids[:n_kept]),
        )

    def reply(self, completion: Completion, parse_tools: bool) -> Reply:
        """The completion's content and, with ``parse_tools``, the tool calls parsed out of it."""
        if parse_tools:
            raw = decode_ids(self.tokenizer, completion.output_ids, skip_special_tokens=False)
            content, calls = self.tool_parser(raw)
            if calls:
                for token in self._special:
                    content = content.replace(token, "")
                return Reply(completion, content.strip(), calls, "tool_calls")
        return Reply(completion, completion.text, [], completion.finish_reason)
