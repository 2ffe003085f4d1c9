"""What a tool-call parser returns: the calls a model's output asks for (see ``areal_register_tool_parsers``)."""

from __future__ import annotations

import uuid
from collections.abc import Callable

import attrs


@attrs.frozen
class ToolCall:
    """One call the model asked for; ``arguments`` is JSON text, as in the OpenAI API."""

    name: str
    arguments: str
    id: str = attrs.field(factory=lambda: f"call_{uuid.uuid4().hex[:24]}")


ToolParser = Callable[[str], tuple[str, list[ToolCall]]]
