"""The calculator agent written with the OpenAI Agents SDK (``openai-agents``), nothing else.

An ``Agent`` with one function tool (``calculator``) answers ``a+b=``; ``Runner.run`` drives the
loop (model call, tool call, tool result, model call, ...). Reward: 1 when the final output is
the right sum. It imports nothing from areal-core; run it against any OpenAI-compatible server::

    OPENAI_BASE_URL=http://127.0.0.1:8000/v1 OPENAI_API_KEY=... OPENAI_MODEL=my-model \\
        python examples/agent_sdk/sdk_calc_agent.py <<< '{"prompt": "3+4="}'

``AGENT_API=responses`` (default, the SDK's own default) or ``chat`` picks the Responses API or
Chat Completions (``OpenAIChatCompletionsModel``). The last stdout line is ``{"reward": r}``.
"""

from __future__ import annotations

import asyncio
import json
import os
import sys

from agents import (
    Agent,
    ModelSettings,
    OpenAIChatCompletionsModel,
    OpenAIResponsesModel,
    Runner,
    function_tool,
    set_tracing_disabled,
)
from openai import AsyncOpenAI

MAX_TURNS = 4  # model calls per problem, tool rounds included


def add(expression: str) -> str:
    """The value of ``a+b`` (non-negative integers), or an error message."""
    left, plus, right = expression.strip().rstrip("=").partition("+")
    if not plus or not left.strip().isdigit() or not right.strip().isdigit():
        return f"error: expected a+b, got {expression!r}"
    return str(int(left) + int(right))


@function_tool
def calculator(expression: str) -> str:
    """Add two non-negative integers written as 'a+b'."""
    return add(expression)


async def solve(task: dict) -> float:
    client = AsyncOpenAI(base_url=os.environ["OPENAI_BASE_URL"], api_key=os.environ["OPENAI_API_KEY"], max_retries=0)
    name = os.environ.get("OPENAI_MODEL", "default")
    chat = os.environ.get("AGENT_API", "responses") == "chat"
    model = OpenAIChatCompletionsModel(name, client) if chat else OpenAIResponsesModel(name, client)
    max_tokens = int(os.environ.get("AGENT_MAX_TOKENS", "256"))
    agent = Agent(name="calculator", tools=[calculator], model=model, model_settings=ModelSettings(max_tokens=max_tokens))
    try:
        result = await Runner.run(agent, task["prompt"], max_turns=MAX_TURNS)
    except Exception as exc:  # noqa: BLE001 - e.g. max turns exceeded: a wrong answer
        print(f"agent run failed: {exc!r}", file=sys.stderr)
        return 0.0
    return 1.0 if str(result.final_output).strip() == add(task["prompt"]) else 0.0


def main() -> None:
    set_tracing_disabled(True)  # no trace export to OpenAI
    task = json.loads(sys.stdin.read())
    print(json.dumps({"reward": asyncio.run(solve(task))}))


if __name__ == "__main__":
    main()
