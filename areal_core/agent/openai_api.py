"""Request checking for the OpenAI chat and text completion APIs, and the checks every API shape shares.

Only what the proxy acts on is checked; other fields (``user``, ``logit_bias``, ...) are ignored
like an OpenAI-compatible server that does not support them. Every rejection is a
:class:`RequestError` whose message names the field and what to send instead. Every API shape
comes down to a :class:`ChatRequest` (or a :class:`TextRequest`): chat messages in the OpenAI
format, which the chat template renders.
"""

from __future__ import annotations

from typing import Any

import attrs

from areal_core.api.errors import ArealError

ROLES = ("system", "developer", "user", "assistant", "tool")
MAX_N = 64


class RequestError(ArealError):
    """A request the proxy refuses; ``status`` is the HTTP code (4xx)."""

    def __init__(self, status: int, message: str, param: str | None = None) -> None:
        super().__init__(message)
        self.status, self.param = status, param

    @property
    def kind(self) -> str:
        """The error type name (the same in OpenAI's and Anthropic's error bodies)."""
        kinds = {401: "authentication_error", 404: "not_found_error", 413: "request_too_large"}
        return kinds.get(self.status, "invalid_request_error")

    def body(self) -> dict[str, Any]:
        """The error in OpenAI's shape."""
        return {
            "error": {
                "message": str(self),
                "type": self.kind,
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
    tools: list[dict[str, Any]] | None  # OpenAI chat format: {"type": "function", "function": {...}}
    tool_choice: str | dict[str, Any] | None  # a template variable, like tools
    sampling: Sampling
    n: int = 1  # independent samples, each its own recorded completion
    stream: bool = False
    include_usage: bool = False  # stream_options.include_usage: a last chunk with the token counts


@attrs.frozen(kw_only=True)
class TextRequest:
    model: str
    prompt: str | list[int]  # text, or token ids used as they are
    sampling: Sampling
    n: int = 1
    stream: bool = False
    include_usage: bool = False


def bad(param: str, message: str) -> RequestError:
    return RequestError(400, f"{param}: {message}", param)


def _number(body: dict[str, Any], key: str, low: float, high: float) -> float | None:
    value = body.get(key)
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not low <= value <= high:
        raise bad(key, f"must be a number in [{low}, {high}], got {value!r}")
    return float(value)


def _positive_int(body: dict[str, Any], key: str) -> int | None:
    value = body.get(key)
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise bad(key, f"must be a positive integer, got {value!r}")
    return value


def flag(body: dict[str, Any], key: str) -> bool:
    value = body.get(key, False)
    if not isinstance(value, bool) and value is not None:
        raise bad(key, f"must be true or false, got {value!r}")
    return bool(value)


def delivery(body: dict[str, Any]) -> dict[str, Any]:
    """``n``, ``stream`` and ``include_usage`` (from ``stream_options``) of a chat/text request."""
    n = body.get("n")
    if n is None:
        n = 1
    elif isinstance(n, bool) or not isinstance(n, int) or not 1 <= n <= MAX_N:
        raise bad("n", f"must be an integer in [1, {MAX_N}] (each sample is its own recorded completion), got {n!r}")
    options = body.get("stream_options")
    options = {} if options is None else options
    if not isinstance(options, dict):
        raise bad("stream_options", f'must be an object like {{"include_usage": true}}, got {options!r}')
    return {"n": n, "stream": flag(body, "stream"), "include_usage": flag(options, "include_usage")}


def sampling(body: dict[str, Any], max_tokens_keys: tuple[str, ...] = ("max_completion_tokens", "max_tokens"), stop_key: str = "stop") -> Sampling:
    """The sampling fields, under the names the API shape uses for them."""
    stop = body.get(stop_key)
    if isinstance(stop, str):
        stop = [stop]
    elif stop is None:
        stop = []
    elif not isinstance(stop, list) or not all(isinstance(s, str) and s for s in stop):
        raise bad(stop_key, f"must be a string or a list of non-empty strings, got {stop!r}")
    seed = body.get("seed")
    if seed is not None and (isinstance(seed, bool) or not isinstance(seed, int)):
        raise bad("seed", f"must be an integer, got {seed!r}")
    max_tokens = next((m for m in (_positive_int(body, k) for k in max_tokens_keys) if m is not None), None)
    return Sampling(
        max_tokens=max_tokens,
        temperature=_number(body, "temperature", 0.0, 2.0),
        top_p=_number(body, "top_p", 1e-9, 1.0),
        stop=stop,
        seed=None if seed is None else seed % 2**63,
    )


def model_name(body: dict[str, Any]) -> str:
    model = body.get("model", "")
    if not isinstance(model, str):
        raise bad("model", f"must be a string, got {model!r}")
    return model


def check_object(body: Any) -> dict[str, Any]:
    if not isinstance(body, dict):
        raise RequestError(400, f"the request body must be a JSON object, got {type(body).__name__}")
    return body


def parse_chat(body: Any) -> ChatRequest:
    """Check a ``/v1/chat/completions`` body."""
    body = check_object(body)
    messages = body.get("messages")
    if not isinstance(messages, list) or not messages:
        raise bad("messages", "must be a non-empty list of {role, content} objects")
    for i, message in enumerate(messages):
        if not isinstance(message, dict) or message.get("role") not in ROLES:
            role = message.get("role") if isinstance(message, dict) else message
            raise bad(f"messages[{i}].role", f"must be one of {', '.join(ROLES)}, got {role!r}")
        content = message.get("content")
        if content is not None and not isinstance(content, (str, list)):
            raise bad(f"messages[{i}].content", f"must be a string, a list of parts or null, got {content!r:.80}")
        if content is None and not message.get("tool_calls"):
            raise bad(f"messages[{i}].content", "is missing (only an assistant message with tool_calls may omit it)")
    tools = body.get("tools")
    if tools is not None:
        if not isinstance(tools, list) or not all(
            isinstance(t, dict) and isinstance(t.get("function"), dict) and isinstance(t["function"].get("name"), str)
            for t in tools
        ):
            raise bad("tools", 'must be a list of {"type": "function", "function": {"name": ..., ...}} objects')
        tools = tools or None
    tool_choice = body.get("tool_choice")
    if tool_choice is not None and tool_choice not in ("none", "auto", "required") and not isinstance(tool_choice, dict):
        raise bad("tool_choice", f'must be "none", "auto", "required" or a {{"type": "function", ...}} object, got {tool_choice!r}')
    return ChatRequest(
        model=model_name(body),
        messages=messages,
        tools=tools,
        tool_choice=tool_choice,
        sampling=sampling(body),
        **delivery(body),
    )


def parse_text(body: Any) -> TextRequest:
    """Check a ``/v1/completions`` body (a prompt string, a one-string list, or token ids)."""
    body = check_object(body)
    prompt = body.get("prompt")
    if isinstance(prompt, list) and len(prompt) == 1 and isinstance(prompt[0], str):
        prompt = prompt[0]
    token_ids = isinstance(prompt, list) and prompt and all(isinstance(t, int) and not isinstance(t, bool) and t >= 0 for t in prompt)
    if not (isinstance(prompt, str) and prompt) and not token_ids:
        raise bad("prompt", "must be a non-empty string or a non-empty list of token ids (one prompt per call)")
    return TextRequest(model=model_name(body), prompt=prompt, sampling=sampling(body), **delivery(body))


def text_of(content: Any, param: str, part_types: tuple[str, ...]) -> str:
    """The text of a string or of a list of text parts (``{"type": <one of part_types>, "text": ...}``)."""
    if isinstance(content, str):
        return content
    if isinstance(content, list) and all(isinstance(p, dict) and p.get("type") in part_types for p in content):
        return "".join(str(p.get("text", "")) for p in content)
    raise bad(param, f"must be a string or a list of {'/'.join(part_types)} parts (text only), got {content!r:.80}")


def chat_tool_call(call_id: str, name: str, arguments: str) -> dict[str, Any]:
    """An assistant message's ``tool_calls`` entry in the chat format the template renders."""
    return {"id": call_id, "type": "function", "function": {"name": name, "arguments": arguments}}
