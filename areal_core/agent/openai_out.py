"""What the chat and text completion routes send back: OpenAI objects, or their stream chunks."""

from __future__ import annotations

import time
from typing import Any

from areal_core.agent.openai_api import chat_tool_call
from areal_core.agent.proxy import Reply
from areal_core.agent.sse import DONE, Event
from areal_core.api.tool_call import ToolCall


def usage(replies: list[Reply]) -> dict[str, int]:
    """Token counts of one call: the prompt once, the outputs of all its samples."""
    prompt = len(replies[0].completion.prompt_ids)
    output = sum(len(r.completion.output_ids) for r in replies)
    return {"prompt_tokens": prompt, "completion_tokens": output, "total_tokens": prompt + output}


def tool_call_json(call: ToolCall, index: int | None = None) -> dict[str, Any]:
    """An OpenAI ``tool_calls`` entry (with ``index`` in a stream delta)."""
    entry = chat_tool_call(call.id, call.name, call.arguments)
    return entry if index is None else {"index": index, **entry}


def _head(replies: list[Reply], obj: str, model: str) -> dict[str, Any]:
    return {"id": replies[0].completion.id, "object": obj, "created": int(time.time()), "model": model}


def chat_response(model: str, replies: list[Reply]) -> dict[str, Any]:
    """A ``chat.completion`` object, one choice per reply."""
    choices = []
    for index, reply in enumerate(replies):
        message: dict[str, Any] = {"role": "assistant", "content": reply.content}
        if reply.tool_calls:
            message["tool_calls"] = [tool_call_json(c) for c in reply.tool_calls]
            message["content"] = reply.content or None
        choices.append({"index": index, "message": message, "finish_reason": reply.finish_reason, "logprobs": None})
    return {**_head(replies, "chat.completion", model), "choices": choices, "usage": usage(replies)}


def text_response(model: str, replies: list[Reply]) -> dict[str, Any]:
    """A ``text_completion`` object, one choice per reply."""
    choices = [
        {"index": i, "text": r.content, "finish_reason": r.finish_reason, "logprobs": None} for i, r in enumerate(replies)
    ]
    return {**_head(replies, "text_completion", model), "choices": choices, "usage": usage(replies)}


def _chunks(head: dict[str, Any], choices: list[dict[str, Any]], replies: list[Reply], include_usage: bool) -> list[Event]:
    extra = {"usage": None} if include_usage else {}
    events: list[Event] = [(None, {**head, "choices": [choice], **extra}) for choice in choices]
    if include_usage:
        events.append((None, {**head, "choices": [], "usage": usage(replies)}))
    return [*events, DONE]


def chat_chunks(model: str, replies: list[Reply], include_usage: bool) -> list[Event]:
    """``chat.completion.chunk`` events: per choice its role, content, tool calls and finish reason."""
    choices: list[dict[str, Any]] = []
    for index, reply in enumerate(replies):
        deltas: list[dict[str, Any]] = [{"role": "assistant", "content": ""}]
        if reply.content:
            deltas.append({"content": reply.content})
        if reply.tool_calls:
            deltas.append({"tool_calls": [tool_call_json(c, j) for j, c in enumerate(reply.tool_calls)]})
        choices += [{"index": index, "delta": d, "finish_reason": None, "logprobs": None} for d in deltas]
        choices.append({"index": index, "delta": {}, "finish_reason": reply.finish_reason, "logprobs": None})
    return _chunks(_head(replies, "chat.completion.chunk", model), choices, replies, include_usage)


def text_chunks(model: str, replies: list[Reply], include_usage: bool) -> list[Event]:
    """``text_completion`` chunk events: per choice its text, then its finish reason."""
    choices: list[dict[str, Any]] = []
    for index, reply in enumerate(replies):
        choices.append({"index": index, "text": reply.content, "finish_reason": None, "logprobs": None})
        choices.append({"index": index, "text": "", "finish_reason": reply.finish_reason, "logprobs": None})
    return _chunks(_head(replies, "text_completion", model), choices, replies, include_usage)
