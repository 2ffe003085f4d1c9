"""Decoupled agentic RL: an OpenAI-compatible proxy that turns an agent's LLM calls into trajectories.

The agent is any program or async function that talks to an OpenAI ``base_url`` (or Anthropic's)
with a session key as its API key; it never imports areal-core. See docs/agents.md.
"""

from areal_core.agent.export import ExportMode, discount, export_session
from areal_core.agent.openai_api import RequestError
from areal_core.agent.proxy import AgentProxy, Reply
from areal_core.agent.proxy_server import ProxyServer
from areal_core.agent.sessions import Completion, Session, SessionStore
from areal_core.agent.parser_choice import tool_parser
from areal_core.api.tool_call import ToolParser, ToolCall
from areal_core.agent.workflow import (
    AgentFn,
    AgentWorkflow,
    agent_workflow,
    parse_reward_line,
    run_agent_program,
)

__all__ = [
    "AgentFn",
    "AgentProxy",
    "AgentWorkflow",
    "Completion",
    "ExportMode",
    "ProxyServer",
    "Reply",
    "RequestError",
    "Session",
    "SessionStore",
    "ToolCall",
    "ToolParser",
    "agent_workflow",
    "discount",
    "export_session",
    "parse_reward_line",
    "run_agent_program",
    "tool_parser",
]
