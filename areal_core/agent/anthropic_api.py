"""Anthropic's Messages API (``POST /v1/messages``) as chat messages in, a message object out.

``system`` becomes a system message; an assistant turn's ``tool_use`` blocks its ``tool_calls``
(input as JSON arguments); a user turn's ``tool_result`` blocks ``tool`` messages, before the
turn's text. Replies carry ``text`` and ``tool_use`` blocks and a ``stop_reason``.
"""

from __future__ import annotations

import json
from typing import Any

from areal_core.agent.openai_api import (
    ChatRequest,
    RequestError,
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

TEXT = ("text",)
STOP_REASONS = {"stop": "end_turn", "length": "max_tokens", "tool_calls": "tool_use"}


def _system(system: Any) -> list[dict[str, Any]]:
    if system is None or system == "":
        return []
    return [{"role": "system", "content": text_of(system, "system", TEXT)}]


def _blocks(content: Any, param: str) -> list[dict[str, Any]]:
    if isinstance(content, str):
        return [{"type": "text", "text": content}]
    if not isinstance(content, list) or not all(isinstance(b, dict) for b in content):
        raise bad(param, f"must be a string or a list of content blocks, got {content!r:.80}")
    return content


def _turn(message: Any, i: int) -> list[dict[str, Any]]:
    """Chat messages for one Anthropic message."""
    if not isinstance(message, dict) or message.get("role") not in ("user", "assistant"):
        raise bad(f"messages[{i}].role", f"must be user or assistant, got {message!r:.80}")
    role, texts, calls, results = message["role"], [], [], []
    for j, block in enumerate(_blocks(message.get("content"), f"messages[{i}].content")):
        where, kind = f"messages[{i}].content[{j}]", block.get("type")
        if kind == "text":
            texts.append(str(block.get("text", "")))
        elif kind == "tool_use" and role == "assistant" and isinstance(block.get("id"), str) and isinstance(block.get("name"), str):
            calls.append(chat_tool_call(block["id"], block["name"], json.dumps(block.get("input") or {})))
        elif kind == "tool_result" and role == "user" and isinstance(block.get("tool_use_id"), str):
            output = text_of(block.get("content", ""), f"{where}.content", TEXT)
            results.append({"role": "tool", "tool_call_id": block["tool_use_id"], "content": output})
        elif kind not in ("thinking", "redacted_thinking"):
            allowed = "text and tool_use" if role == "assistant" else "text and tool_result"
            raise bad(where, f"a {role} turn takes {allowed} blocks, got {block!r:.80}")
    if role == "assistant":
        turn: dict[str, Any] = {"role": "assistant", "content": "".join(texts) or (None if calls else "")}
        return [{**turn, "tool_calls": calls} if calls else turn]
    return results + ([{"role": "user", "content": "".join(texts)}] if texts or not results else [])


def _tools(tools: Any) -> list[dict[str, Any]] | None:
    if tools is None or tools == []:
        return None
    if not isinstance(tools, list) or not all(isinstance(t, dict) and isinstance(t.get("name"), str) for t in tools):
        raise bad("tools", 'must be a list of {"name": ..., "description": ..., "input_schema": {...}} objects')
    return [
        {"type": "function", "function": {"name": t["name"], "description": t.get("description", ""), "parameters": t.get("input_schema", {})}}
        for t in tools
    ]


def _tool_choice(choice: Any) -> str | dict[str, Any] | None:
    kind = choice.get("type") if isinstance(choice, dict) else None
    if choice is None:
        return None
    if kind in ("auto", "none"):
        return kind
    if kind == "any":
        return "required"
    if kind == "tool" and isinstance(choice.get("name"), str):
        return {"type": "function", "function": {"name": choice["name"]}}
    raise bad("tool_choice", f'must be {{"type": "auto"|"any"|"none"}} or {{"type": "tool", "name": ...}}, got {choice!r}')


def parse_messages(body: Any) -> ChatRequest:
    """The chat request a ``/v1/messages`` body comes down to."""
    body = check_object(body)
    turns = body.get("messages")
    if not isinstance(turns, list) or not turns:
        raise bad("messages", "must be a non-empty list of {role, content} objects")
    messages = _system(body.get("system")) + [m for i, t in enumerate(turns) for m in _turn(t, i)]
    return ChatRequest(
        model=model_name(body),
        messages=messages,
        tools=_tools(body.get("tools")),
        tool_choice=_tool_choice(body.get("tool_choice")),
        sampling=sampling(body, ("max_tokens",), stop_key="stop_sequences"),
        stream=flag(body, "stream"),
    )


def _content(reply: Reply) -> list[dict[str, Any]]:
    blocks: list[dict[str, Any]] = []
    if reply.content or not reply.tool_calls:
        blocks.append({"type": "text", "text": reply.content})
    for call in reply.tool_calls:
        try:
            arguments = json.loads(call.arguments)
        except ValueError:
            arguments = {"arguments": call.arguments}
        blocks.append({"type": "tool_use", "id": call.id, "name": call.name, "input": arguments})
    return blocks


def message_object(model: str, reply: Reply) -> dict[str, Any]:
    """A ``message`` object for ``reply``."""
    c = reply.completion
    return {
        "id": c.id,
        "type": "message",
        "role": "assistant",
        "model": model,
        "content": _content(reply),
        "stop_reason": STOP_REASONS[reply.finish_reason],
        "stop_sequence": None,
        "usage": {"input_tokens": len(c.prompt_ids), "output_tokens": len(c.output_ids)},
    }


def message_events(model: str, reply: Reply) -> list[Event]:
    """Anthropic's stream: message_start, per block start/delta/stop, message_delta, message_stop."""
    final = message_object(model, reply)
    start = {**final, "content": [], "stop_reason": None, "usage": {**final["usage"], "output_tokens": 0}}
    typed: list[tuple[str, dict[str, Any]]] = [("message_start", {"message": start})]
    for index, block in enumerate(final["content"]):
        if block["type"] == "text":
            opened, delta = {"type": "text", "text": ""}, {"type": "text_delta", "text": block["text"]}
        else:
            opened = {**block, "input": {}}
            delta = {"type": "input_json_delta", "partial_json": json.dumps(block["input"])}
        typed += [
            ("content_block_start", {"index": index, "content_block": opened}),
            ("content_block_delta", {"index": index, "delta": delta}),
            ("content_block_stop", {"index": index}),
        ]
    stop = {"stop_reason": final["stop_reason"], "stop_sequence": None}
    typed += [("message_delta", {"delta": stop, "usage": {"output_tokens": final["usage"]["output_tokens"]}}), ("message_stop", {})]
    return [(kind, {"type": kind, **data}) for kind, data in typed]


def error_body(exc: RequestError) -> dict[str, Any]:
    """An error in Anthropic's shape."""
    return {"type": "error", "error": {"type": exc.kind, "message": str(exc)}}
