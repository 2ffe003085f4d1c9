"""Tool-call parsers: a model's raw output text -> the content and the tool calls it holds.

A parser is ``parse(text) -> (content, calls)``; ``text`` is the output decoded with special
tokens kept (``[TOOL_CALLS]`` and ``<|python_tag|>`` are special tokens). A text it does not
recognise comes back unchanged with no calls. Built in: ``hermes`` (Hermes/Qwen
``<tool_call>`` blocks, the default), ``llama3_json`` and ``mistral``; a plugin adds more through
``areal_register_tool_parsers`` (docs/plugins.md). ``agent.tool_parser: auto`` picks one from
the chat template.
"""

from __future__ import annotations

import json
import re
from typing import Any

from areal_core.api.tool_call import ToolCall


_HERMES = re.compile(r"<tool_call>\s*(.*?)\s*</tool_call>", re.DOTALL)
_MISTRAL_V11 = re.compile(r"([A-Za-z0-9_.\-]+)\[ARGS\]")
_DECODER = json.JSONDecoder()


def _call(obj: Any, arguments_key: str = "arguments") -> ToolCall | None:
    """A call from ``{"name": ..., "<arguments_key>": ...}``, else None."""
    if not isinstance(obj, dict) or not isinstance(obj.get("name"), str):
        return None
    arguments = obj.get(arguments_key, obj.get("arguments", {}))
    return ToolCall(obj["name"], arguments if isinstance(arguments, str) else json.dumps(arguments))


def hermes(text: str) -> tuple[str, list[ToolCall]]:
    """``<tool_call>{"name": ..., "arguments": ...}</tool_call>`` blocks (Hermes, Qwen 2.5/3).

    A block that is not valid JSON with a ``name`` stays in the content untouched.
    """
    calls: list[ToolCall] = []

    def take(match: re.Match[str]) -> str:
        try:
            call = _call(json.loads(match.group(1)))
        except ValueError:
            call = None
        if call is None:
            return match.group(0)
        calls.append(call)
        return ""

    content = _HERMES.sub(take, text)
    return (content.strip() if calls else content), calls


def _json_values(text: str, separator: str) -> list[Any] | None:
    """The JSON values ``text`` consists of, ``separator``-separated; None if it is anything else."""
    values, pos = [], 0
    while True:
        while pos < len(text) and (text[pos].isspace() or (values and text[pos] == separator)):
            pos += 1
        if pos == len(text):
            return values
        try:
            value, pos = _DECODER.raw_decode(text, pos)
        except ValueError:
            return None
        values.append(value)


def llama3_json(text: str) -> tuple[str, list[ToolCall]]:
    """Llama 3.1+ JSON calls: the whole output is ``{"name": ..., "parameters": {...}}`` (several
    joined by ``;``), optionally after ``<|python_tag|>``; trailing end-of-turn tokens allowed."""
    body = re.sub(r"<\|(eot_id|eom_id|end_of_text)\|>\s*$", "", text.strip()).strip()
    body = body.removeprefix("<|python_tag|>")
    values = _json_values(body, ";")
    calls = [_call(v, "parameters") for v in values or []]
    if not calls or None in calls:
        return text, []
    return "", [c for c in calls if c is not None]


def mistral(text: str) -> tuple[str, list[ToolCall]]:
    """Mistral ``[TOOL_CALLS]``: a JSON list of ``{"name", "arguments"}`` (v3 tokenizers), or
    ``name[ARGS]{...}`` repeated (v11+). The text before ``[TOOL_CALLS]`` is the content."""
    content, marker, rest = text.partition("[TOOL_CALLS]")
    if not marker:
        return text, []
    rest = rest.replace("[TOOL_CALLS]", " ").removesuffix("</s>").strip()
    calls: list[ToolCall | None] = []
    values = _json_values(rest, ",")
    if values is not None:
        for value in values:
            calls += [_call(v) for v in (value if isinstance(value, list) else [value])]
    else:
        parts = _MISTRAL_V11.split(rest)  # ['', name, args, name, args, ...]
        if parts[0].strip():
            return text, []
        for name, arguments in zip(parts[1::2], parts[2::2]):
            parsed = _json_values(arguments, ",")
            calls.append(_call({"name": name, "arguments": parsed[0]}) if parsed and len(parsed) == 1 else None)
    if not calls or None in calls:
        return text, []
    return content.strip(), [c for c in calls if c is not None]
