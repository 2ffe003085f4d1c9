"""The OpenAI Responses API (``POST /v1/responses``) as chat messages in, a response object out.

Input items become chat messages for the template: messages (text parts joined),
``function_call`` items the assistant's ``tool_calls``, ``function_call_output`` items ``tool``
messages (``reasoning`` items are dropped; the template sees no reasoning). ``instructions`` is
a system message for this call only. ``previous_response_id`` continues a conversation of the
same session: its messages, the reply included, come before the new input.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Callable
from typing import Any

from areal_core.agent.openai_api import (
    ChatRequest,
    bad,
    chat_tool_call,
    check_object,
    flag,
    model_name,
    sampling,
    text_of,
)
from areal_core.agent.proxy import Reply
from areal_core.agent.sse import Event

TEXT_PARTS = ("input_text", "output_text", "text")
ROLES = ("system", "developer", "user", "assistant")


def _tools(tools: Any) -> list[dict[str, Any]] | None:
    if tools is None or tools == []:
        return None
    if not isinstance(tools, list) or not all(
        isinstance(t, dict) and t.get("type") == "function" and isinstance(t.get("name"), str) for t in tools
    ):
        raise bad("tools", 'must be a list of {"type": "function", "name": ..., "parameters": ...} (function tools only)')
    keys = ("name", "description", "parameters")
    return [{"type": "function", "function": {k: t[k] for k in keys if k in t}} for t in tools]


def _tool_choice(choice: Any) -> str | dict[str, Any] | None:
    if choice is None or choice in ("none", "auto", "required"):
        return choice
    if isinstance(choice, dict) and choice.get("type") == "function" and isinstance(choice.get("name"), str):
        return {"type": "function", "function": {"name": choice["name"]}}
    raise bad("tool_choice", f'must be "none", "auto", "required" or {{"type": "function", "name": ...}}, got {choice!r}')


def input_messages(items: Any) -> list[dict[str, Any]]:
    """Chat messages for the ``input`` of a request (a string or a list of items)."""
    if isinstance(items, str):
        return [{"role": "user", "content": items}]
    if not isinstance(items, list) or not items:
        raise bad("input", "must be a non-empty string or a non-empty list of input items")
    messages: list[dict[str, Any]] = []
    for i, item in enumerate(items):
        kind = item.get("type", "message") if isinstance(item, dict) else None
        if kind == "message" and item.get("role") in ROLES:
            messages.append({"role": item["role"], "content": text_of(item.get("content"), f"input[{i}].content", TEXT_PARTS)})
        elif kind == "function_call" and all(isinstance(item.get(k), str) for k in ("call_id", "name", "arguments")):
            call = chat_tool_call(item["call_id"], item["name"], item["arguments"])
            last = messages[-1] if messages else None
            if last is None or last["role"] != "assistant":
                last = {"role": "assistant", "content": None}
                messages.append(last)
            last.setdefault("tool_calls", []).append(call)
        elif kind == "function_call_output" and isinstance(item.get("call_id"), str):
            output = text_of(item.get("output"), f"input[{i}].output", TEXT_PARTS)
            messages.append({"role": "tool", "tool_call_id": item["call_id"], "content": output})
        elif kind != "reasoning":
            raise bad(
                f"input[{i}]",
                f"must be a message ({'/'.join(ROLES)}), function_call, function_call_output or reasoning item, got {item!r:.80}",
            )
    return messages


def parse_responses(body: Any, history: Callable[[str], list[dict[str, Any]]]) -> tuple[ChatRequest, list[dict[str, Any]]]:
    """The chat request a ``/v1/responses`` body comes down to, and the conversation to store for
    the reply (without ``instructions``). ``history(id)`` returns a previous response's messages."""
    body = check_object(body)
    previous = body.get("previous_response_id")
    if previous is not None and not isinstance(previous, str):
        raise bad("previous_response_id", f"must be a response id string, got {previous!r}")
    conversation = [*(history(previous) if previous else []), *input_messages(body.get("input"))]
    instructions = body.get("instructions")
    if instructions is not None and not isinstance(instructions, str):
        raise bad("instructions", f"must be a string, got {instructions!r:.80}")
    system = [{"role": "system", "content": instructions}] if instructions else []
    request = ChatRequest(
        model=model_name(body),
        messages=system + conversation,
        tools=_tools(body.get("tools")),
        tool_choice=_tool_choice(body.get("tool_choice")),
        sampling=sampling(body, ("max_output_tokens",)),
        stream=flag(body, "stream"),
    )
    return request, conversation


def assistant_message(reply: Reply) -> dict[str, Any]:
    """The reply as the chat message a later turn's template renders."""
    message: dict[str, Any] = {"role": "assistant", "content": reply.content or (None if reply.tool_calls else "")}
    if reply.tool_calls:
        message["tool_calls"] = [chat_tool_call(c.id, c.name, c.arguments) for c in reply.tool_calls]
    return message


def _output_items(reply: Reply) -> list[dict[str, Any]]:
    items: list[dict[str, Any]] = []
    if reply.content or not reply.tool_calls:
        part = {"type": "output_text", "text": reply.content, "annotations": [], "logprobs": []}
        items.append({"type": "message", "id": f"msg_{uuid.uuid4().hex}", "status": "completed", "role": "assistant", "content": [part]})
    for call in reply.tool_calls:
        items.append(
            {"type": "function_call", "id": f"fc_{uuid.uuid4().hex}", "call_id": call.id, "name": call.name, "arguments": call.arguments, "status": "completed"}
        )
    return items


def response_object(body: dict[str, Any], reply: Reply) -> dict[str, Any]:
    """A ``response`` object for ``reply``."""
    c = reply.completion
    n_in, n_out = len(c.prompt_ids), len(c.output_ids)
    truncated = reply.finish_reason == "length"
    return {
        "id": c.id,
        "object": "response",
        "created_at": int(time.time()),
        "status": "incomplete" if truncated else "completed",
        "incomplete_details": {"reason": "max_output_tokens"} if truncated else None,
        "error": None,
        "model": model_name(body),
        "instructions": body.get("instructions"),
        "previous_response_id": body.get("previous_response_id"),
        "output": _output_items(reply),
        "parallel_tool_calls": body.get("parallel_tool_calls", True),
        "tool_choice": body.get("tool_choice") or "auto",
        "tools": body.get("tools") or [],
        "temperature": body.get("temperature"),
        "top_p": body.get("top_p"),
        "max_output_tokens": body.get("max_output_tokens"),
        "metadata": body.get("metadata") or {},
        "text": {"format": {"type": "text"}},
        "truncation": "disabled",
        "usage": {
            "input_tokens": n_in,
            "input_tokens_details": {"cached_tokens": 0},
            "output_tokens": n_out,
            "output_tokens_details": {"reasoning_tokens": 0},
            "total_tokens": n_in + n_out,
        },
    }


def _item_events(index: int, item: dict[str, Any]) -> list[tuple[str, dict[str, Any]]]:
    where = {"item_id": item["id"], "output_index": index}
    if item["type"] == "function_call":
        opened = {**item, "arguments": "", "status": "in_progress"}
        return [
            ("response.output_item.added", {"output_index": index, "item": opened}),
            ("response.function_call_arguments.delta", {**where, "delta": item["arguments"]}),
            ("response.function_call_arguments.done", {**where, "name": item["name"], "arguments": item["arguments"]}),
            ("response.output_item.done", {"output_index": index, "item": item}),
        ]
    part = item["content"][0]
    at = {**where, "content_index": 0}
    return [
        ("response.output_item.added", {"output_index": index, "item": {**item, "status": "in_progress", "content": []}}),
        ("response.content_part.added", {**at, "part": {**part, "text": ""}}),
        ("response.output_text.delta", {**at, "delta": part["text"], "logprobs": []}),
        ("response.output_text.done", {**at, "text": part["text"], "logprobs": []}),
        ("response.content_part.done", {**at, "part": part}),
        ("response.output_item.done", {"output_index": index, "item": item}),
    ]


def response_events(body: dict[str, Any], reply: Reply) -> list[Event]:
    """The Responses API stream: created, in progress, each output item, completed."""
    final = response_object(body, reply)
    started = {**final, "status": "in_progress", "incomplete_details": None, "output": [], "usage": None}
    typed = [("response.created", {"response": started}), ("response.in_progress", {"response": started})]
    for index, item in enumerate(final["output"]):
        typed += _item_events(index, item)
    typed.append(("response.completed", {"response": final}))
    return [(kind, {"type": kind, "sequence_number": n, **data}) for n, (kind, data) in enumerate(typed)]
