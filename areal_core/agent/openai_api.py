"""The OpenAI wire format the proxy speaks: request checking, response objects, tool-call parsing.

Only what the proxy acts on is checked; other fields (``user``, ``logit_bias``, ...) are ignored
like an OpenAI-compatible server that does not support them. Every rejection is a
:class:`RequestError` whose message names the field and what to send instead.
"""

from __future__ import annotations

import json
import re
import time
import uuid
from typing import Any

import attrs

from areal_core.errors import ArealError

ROLES = ("system", "developer", "user", "assistant", "tool")
_TOOL_CALL = re.compile(r"<tool_call>\s*(.*?)\s*</tool_call>", re.DOTALL)


class RequestError(ArealError):
    """A request the proxy refuses; ``status`` is the HTTP code (4xx)."""

    def __init__(self, status: int, message: str, param: str | None = None) -> None:
        super().__init__(message)
        self.status, self.param = status, param

    def body(self) -> dict[str, Any]:
        kind = {401: "authentication_error", 404: "not_found_error", 413: "request_too_large"}
        return {
            "error": {
                "message": str(self),
                "type": kind.get(self.status, "invalid_request_error"),
                "param": self.param,
                "code": None,
            }
        }


@attrs.frozen(kw_only=True)
class Sampling:
    """The sampling fields of a request; ``None`` means the proxy's default."""

    max_tokens: int | None = None
    temperature: float | None = None
    top_p: float | None = None
    stop: list[str] = attrs.Factory(list)
    seed: int | None = None


@attrs.frozen(kw_only=True)
class ChatRequest:
    model: str
    messages: list[dict[str, Any]]  # passed to the chat template unchanged
    tools: list[dict[str, Any]] | None
    tool_choice: str | dict[str, Any] | None  # a template variable, like tools
    sampling: Sampling


@attrs.frozen(kw_only=True)
class TextRequest:
    model: str
    prompt: str | list[int]  # text, or token ids used as they are
    sampling: Sampling


def _bad(param: str, message: str) -> RequestError:
    return RequestError(400, f"{param}: {message}", param)


def _number(body: dict[str, Any], key: str, low: float, high: float) -> float | None:
    value = body.get(key)
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not low <= value <= high:
        raise _bad(key, f"must be a number in [{low}, {high}], got {value!r}")
    return float(value)


def _positive_int(body: dict[str, Any], key: str) -> int | None:
    value = body.get(key)
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise _bad(key, f"must be a positive integer, got {value!r}")
    return value


def _sampling(body: dict[str, Any]) -> Sampling:
    if body.get("stream"):
        raise _bad("stream", "streaming is not supported by the training proxy; send stream=false")
    n = body.get("n", 1)
    if n != 1:
        raise _bad("n", f"only n=1 is supported (one recorded completion per call), got {n!r}")
    stop = body.get("stop")
    if isinstance(stop, str):
        stop = [stop]
    elif stop is None:
        stop = []
    elif not isinstance(stop, list) or not all(isinstance(s, str) and s for s in stop):
        raise _bad("stop", f"must be a string or a list of non-empty strings, got {stop!r}")
    seed = body.get("seed")
    if seed is not None and (isinstance(seed, bool) or not isinstance(seed, int)):
        raise _bad("seed", f"must be an integer, got {seed!r}")
    max_tokens = _positive_int(body, "max_completion_tokens") or _positive_int(body, "max_tokens")
    return Sampling(
        max_tokens=max_tokens,
        temperature=_number(body, "temperature", 0.0, 2.0),
        top_p=_number(body, "top_p", 1e-9, 1.0),
        stop=stop,
        seed=None if seed is None else seed % 2**63,
    )


def _model(body: dict[str, Any]) -> str:
    model = body.get("model", "")
    if not isinstance(model, str):
        raise _bad("model", f"must be a string, got {model!r}")
    return model


def _check_object(body: Any) -> dict[str, Any]:
    if not isinstance(body, dict):
        raise RequestError(400, f"the request body must be a JSON object, got {type(body).__name__}")
    return body


def parse_chat(body: Any) -> ChatRequest:
    """Check a ``/v1/chat/completions`` body."""
    body = _check_object(body)
    messages = body.get("messages")
    if not isinstance(messages, list) or not messages:
        raise _bad("messages", "must be a non-empty list of {role, content} objects")
    for i, message in enumerate(messages):
        if not isinstance(message, dict) or message.get("role") not in ROLES:
            role = message.get("role") if isinstance(message, dict) else message
            raise _bad(f"messages[{i}].role", f"must be one of {', '.join(ROLES)}, got {role!r}")
        content = message.get("content")
        if content is not None and not isinstance(content, (str, list)):
            raise _bad(f"messages[{i}].content", f"must be a string, a list of parts or null, got {content!r:.80}")
        if content is None and not message.get("tool_calls"):
            raise _bad(f"messages[{i}].content", "is missing (only an assistant message with tool_calls may omit it)")
    tools = body.get("tools")
    if tools is not None:
        if not isinstance(tools, list) or not all(
            isinstance(t, dict) and isinstance(t.get("function"), dict) and isinstance(t["function"].get("name"), str)
            for t in tools
        ):
            raise _bad("tools", 'must be a list of {"type": "function", "function": {"name": ..., ...}} objects')
        tools = tools or None
    tool_choice = body.get("tool_choice")
    if tool_choice is not None and tool_choice not in ("none", "auto", "required") and not isinstance(tool_choice, dict):
        raise _bad("tool_choice", f'must be "none", "auto", "required" or a {{"type": "function", ...}} object, got {tool_choice!r}')
    return ChatRequest(
        model=_model(body), messages=messages, tools=tools, tool_choice=tool_choice, sampling=_sampling(body)
    )


def parse_text(body: Any) -> TextRequest:
    """Check a ``/v1/completions`` body (a prompt string, a one-string list, or token ids)."""
    body = _check_object(body)
    prompt = body.get("prompt")
    if isinstance(prompt, list) and len(prompt) == 1 and isinstance(prompt[0], str):
        prompt = prompt[0]
    token_ids = isinstance(prompt, list) and prompt and all(isinstance(t, int) and not isinstance(t, bool) and t >= 0 for t in prompt)
    if not (isinstance(prompt, str) and prompt) and not token_ids:
        raise _bad("prompt", "must be a non-empty string or a non-empty list of token ids (one prompt per call)")
    return TextRequest(model=_model(body), prompt=prompt, sampling=_sampling(body))


def parse_tool_calls(text: str) -> tuple[str, list[dict[str, Any]]]:
    """Split ``<tool_call>{"name": ..., "arguments": ...}</tool_call>`` blocks (the Hermes/Qwen
    format) out of ``text``; returns the remaining content and OpenAI ``tool_calls``.

    A block that is not valid JSON with a ``name`` stays in the content untouched.
    """
    calls: list[dict[str, Any]] = []

    def take(match: re.Match[str]) -> str:
        try:
            call = json.loads(match.group(1))
        except ValueError:
            return match.group(0)
        if not isinstance(call, dict) or not isinstance(call.get("name"), str):
            return match.group(0)
        arguments = call.get("arguments", {})
        calls.append(
            {
                "id": f"call_{uuid.uuid4().hex[:24]}",
                "type": "function",
                "function": {
                    "name": call["name"],
                    "arguments": arguments if isinstance(arguments, str) else json.dumps(arguments),
                },
            }
        )
        return ""

    content = _TOOL_CALL.sub(take, text)
    return (content.strip() if calls else content), calls


def _usage(prompt_tokens: int, completion_tokens: int) -> dict[str, int]:
    return {
        "prompt_tokens": prompt_tokens,
        "completion_tokens": completion_tokens,
        "total_tokens": prompt_tokens + completion_tokens,
    }


def chat_response(
    completion_id: str,
    model: str,
    text: str,
    finish_reason: str,
    prompt_tokens: int,
    completion_tokens: int,
    parse_tools: bool,
) -> dict[str, Any]:
    """A ``chat.completion`` object; with ``parse_tools`` tool-call blocks become ``tool_calls``."""
    content, calls = parse_tool_calls(text) if parse_tools else (text, [])
    message: dict[str, Any] = {"role": "assistant", "content": content}
    if calls:
        message["tool_calls"] = calls
        finish_reason = "tool_calls"
    return {
        "id": completion_id,
        "object": "chat.completion",
        "created": int(time.time()),
        "model": model,
        "choices": [{"index": 0, "message": message, "finish_reason": finish_reason, "logprobs": None}],
        "usage": _usage(prompt_tokens, completion_tokens),
    }


def text_response(
    completion_id: str, model: str, text: str, finish_reason: str, prompt_tokens: int, completion_tokens: int
) -> dict[str, Any]:
    """A ``text_completion`` object."""
    return {
        "id": completion_id,
        "object": "text_completion",
        "created": int(time.time()),
        "model": model,
        "choices": [{"index": 0, "text": text, "finish_reason": finish_reason, "logprobs": None}],
        "usage": _usage(prompt_tokens, completion_tokens),
    }
