"""Built-in tool-call parsers for the agent proxy (Hermes/Qwen, Llama 3 JSON, Mistral)."""

from areal_core.api import hookimpl


@hookimpl
def areal_register_tool_parsers(register):
    register("hermes", "areal_core.builtin.tool_parsers.parsers:hermes")
    register("llama3_json", "areal_core.builtin.tool_parsers.parsers:llama3_json")
    register("mistral", "areal_core.builtin.tool_parsers.parsers:mistral")
