"""A calculator agent on ``a+b=`` problems, written only against the OpenAI API.

It asks the model, and on a wrong answer says so and lets it try again (up to ``MAX_ANSWERS``
answers). A local Python tool (``calculator``) checks each answer; a model that emits tool calls
(the ``calculator`` tool is offered) gets the tool's result back as a ``tool`` message. The
reward is 1 for a correct final answer, else 0.

This file imports nothing from areal-core: run it against any OpenAI-compatible server::

    OPENAI_BASE_URL=http://127.0.0.1:8000/v1 OPENAI_API_KEY=... OPENAI_MODEL=my-model \\
        python examples/agent/calc_agent.py <<< '{"prompt": "3+4="}'

It prints ``{"reward": r}`` as its last line. ``AGENT_SYSTEM_PROMPT`` (e.g. "Answer with the
number only.") and ``AGENT_MAX_TOKENS`` (default 256; the training proxy caps it at
``gconfig.max_new_tokens``) adapt it to a chat model. The trainer runs it per sample (``agent.command``)
or awaits :func:`solve` in-process (faster: no interpreter start per episode).
"""

from __future__ import annotations

import asyncio
import json
import os
import sys
import weakref
from typing import Any

from openai import AsyncOpenAI

FEEDBACK = "no"  # the retry turn (short: the tiny model's tokenizer is built to cover it)
MAX_ANSWERS = 2
MAX_CALLS = 4  # model calls per problem, tool rounds included
TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "calculator",
            "description": "Add two non-negative integers written as 'a+b'.",
            "parameters": {
                "type": "object",
                "properties": {"expression": {"type": "string"}},
                "required": ["expression"],
            },
        },
    }
]


_CLIENTS: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, dict[str, AsyncOpenAI]] = weakref.WeakKeyDictionary()


def client_for(base_url: str, api_key: str) -> AsyncOpenAI:
    """One HTTP client per event loop and endpoint (building one costs ~30 ms), a key per run."""
    clients = _CLIENTS.setdefault(asyncio.get_running_loop(), {})
    if base_url not in clients:
        clients[base_url] = AsyncOpenAI(base_url=base_url, api_key="unset", timeout=300)
    return clients[base_url].with_options(api_key=api_key)


def calculator(expression: str) -> str:
    """The local tool: the value of ``a+b`` (non-negative integers), or an error message."""
    left, plus, right = expression.strip().rstrip("=").partition("+")
    if not plus or not left.strip().isdigit() or not right.strip().isdigit():
        return f"error: expected a+b, got {expression!r}"
    return str(int(left) + int(right))


def _tool_result(call: Any) -> str:
    try:
        arguments = json.loads(call.function.arguments or "{}")
    except ValueError:
        return "error: arguments are not JSON"
    if call.function.name != "calculator" or not isinstance(arguments, dict):
        return f"error: unknown tool {call.function.name!r}"
    return calculator(str(arguments.get("expression", "")))


async def solve(base_url: str, api_key: str, task: dict[str, Any], model: str | None = None) -> float:
    """Solve ``task["prompt"]`` (``"a+b="``) with the model behind ``base_url``; returns the reward."""
    model = model or os.environ.get("OPENAI_MODEL", "default")
    truth = calculator(task["prompt"])
    system = os.environ.get("AGENT_SYSTEM_PROMPT", "")
    messages: list[dict[str, Any]] = [{"role": "system", "content": system}] if system else []
    messages.append({"role": "user", "content": task["prompt"]})
    max_tokens = int(os.environ.get("AGENT_MAX_TOKENS", "256"))
    answers = 0
    client = client_for(base_url, api_key)
    for _ in range(MAX_CALLS):
        reply = await client.chat.completions.create(
            model=model, messages=messages, tools=TOOLS, max_tokens=max_tokens, temperature=1.0
        )
        message = reply.choices[0].message
        if message.tool_calls:  # the model asked for the calculator: run it, feed the result back
            messages.append(message.model_dump(exclude_none=True))
            for call in message.tool_calls:
                messages.append({"role": "tool", "tool_call_id": call.id, "content": _tool_result(call)})
            continue
        answer = (message.content or "").strip()
        answers += 1
        if answer == truth:
            return 1.0
        if answers == MAX_ANSWERS:
            break
        messages += [{"role": "assistant", "content": message.content or ""}, {"role": "user", "content": FEEDBACK}]
    return 0.0


def main() -> None:
    task = json.loads(sys.stdin.read())
    reward = asyncio.run(solve(os.environ["OPENAI_BASE_URL"], os.environ["OPENAI_API_KEY"], task))
    print(json.dumps({"reward": reward}))


if __name__ == "__main__":
    main()
