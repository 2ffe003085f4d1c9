"""Which tool-call parser a session uses: the one ``agent.tool_parser`` names, or for ``auto`` the
built-in format its chat template calls for."""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from areal_core.api.tool_call import ToolParser
    from areal_core.plugins import Plugins


def detect(chat_template: str | None) -> str:
    """The built-in parser a chat template's tool format calls for (``hermes`` when unsure)."""
    template = chat_template or ""
    if "[TOOL_CALLS]" in template:
        return "mistral"
    if "<|python_tag|>" in template or "ipython" in template:
        return "llama3_json"
    return "hermes"


def tool_parser(name: str, chat_template: str | None, plugins: Plugins) -> ToolParser:
    """The parser ``agent.tool_parser`` names (``auto``: :func:`detect` on ``chat_template``)."""
    return plugins.get("tool_parser", detect(chat_template) if name == "auto" else name)
