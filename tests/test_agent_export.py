"""Agent proxy logic without processes: turn discount, export layouts, sessions, request checks."""

from __future__ import annotations

import json

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from areal_core.api import hookimpl
from areal_core.agent import (
    AgentProxy,
    Completion,
    SessionStore,
    discount,
    export_session,
    parse_reward_line,
)
from areal_core.agent.anthropic_api import (
    message_events,
    message_object,
    parse_messages,
)
from areal_core.agent.openai_api import RequestError, Sampling, parse_chat, parse_text
from areal_core.agent.openai_out import chat_chunks
from areal_core.agent.proxy import Reply
from areal_core.agent.responses_api import parse_responses, response_events
from areal_core.agent.sessions import UnknownCompletion
from areal_core.agent.sse import DONE
from areal_core.builtin.tool_parsers.parsers import hermes, llama3_json, mistral
from areal_core.agent.parser_choice import tool_parser
from areal_core.config import GenerationConfig
from areal_core.api.errors import ConfigError, PluginError
from areal_core.tiny_model import build_char_tokenizer


def completion(cid: str, prompt: list[int], output: list[int], version: int = 0) -> Completion:
    return Completion(
        id=cid,
        prompt_ids=prompt,
        output_ids=output,
        logprobs=[-0.5] * len(output),
        versions=[version] * len(output),
        finish_reason="stop",
        text="",
    )


# --------------------------------------------------------------------------- turn discount


def test_discount_values_by_hand():
    assert discount([0.0, 0.0, 1.0], 0.5) == [0.25, 0.5, 1.0]
    assert discount([1.0, 0.0, 2.0], 0.9) == pytest.approx([1.0 + 0.9 * 1.8, 1.8, 2.0])
    assert discount([], 0.7) == []


@settings(max_examples=50, deadline=None)
@given(st.lists(st.floats(-10, 10), max_size=8), st.floats(0.01, 1.0))
def test_discount_is_the_discounted_return(rewards, gamma):
    expected = [sum(gamma**k * r for k, r in enumerate(rewards[i:])) for i in range(len(rewards))]
    assert discount(rewards, gamma) == pytest.approx(expected, abs=1e-6)


# --------------------------------------------------------------------------- sessions and export


def _two_turn_session(store: SessionStore, second_prompt: list[int]):
    session = store.start()
    session.add(completion("c1", [5, 6, 7], [8, 1], version=0))
    session.add(completion("c2", second_prompt, [9], version=1))
    return session


def test_concat_joins_turns_with_the_loss_on_outputs_only():
    session = _two_turn_session(SessionStore(), [5, 6, 7, 8, 1, 3, 4])
    session.set_reward(1.0)  # final answer
    [traj] = export_session(session, gamma=0.5, mode="concat", prompt_id="p", info={"sample_index": 2})
    assert traj.input_ids == [5, 6, 7, 8, 1, 3, 4, 9]
    assert traj.loss_mask == [0, 0, 0, 1, 1, 0, 0, 1]
    assert traj.versions == [-1, -1, -1, 0, 0, -1, -1, 1]
    assert traj.logprobs == [0.0, 0.0, 0.0, -0.5, -0.5, 0.0, 0.0, -0.5]
    assert traj.reward == 0.5  # the return from the first turn: gamma * final
    assert traj.info["turns"] == 2 and traj.info["sample_index"] == 2


def test_individual_export_discounts_each_completion():
    session = _two_turn_session(SessionStore(), [5, 6, 7, 8, 1, 3, 4])
    session.set_reward(0.25, "c1")
    session.set_reward(1.0)
    first, second = export_session(session, gamma=0.5, mode="individual", prompt_id="p", info={})
    assert (first.input_ids, first.loss_mask) == ([5, 6, 7, 8, 1], [0, 0, 0, 1, 1])
    assert (second.input_ids, second.loss_mask) == ([5, 6, 7, 8, 1, 3, 4, 9], [0] * 7 + [1])
    assert (first.reward, second.reward) == (0.25 + 0.5 * 1.0, 1.0)


def test_concat_starts_a_new_trajectory_when_history_was_rerendered():
    """The second prompt drops the first output's last token: joining would misstate the context."""
    session = _two_turn_session(SessionStore(), [5, 6, 7, 8, 3, 4])
    session.set_reward(1.0)
    first, second = export_session(session, gamma=0.5, mode="concat", prompt_id="p", info={})
    assert first.input_ids == [5, 6, 7, 8, 1] and second.input_ids == [5, 6, 7, 8, 3, 4, 9]
    assert (first.reward, second.reward) == (0.5, 1.0)


def test_rewards_only_for_own_completions_and_keys_are_unguessable():
    store = SessionStore()
    a, b = store.start(), store.start()
    a.add(completion("ca", [1], [2]))
    with pytest.raises(UnknownCompletion):
        b.set_reward(1.0, "ca")
    assert len(a.key) >= 40 and a.key != b.key
    assert store.get(a.key) is a and store.get("guess") is None
    assert store.end(a.key) is a and a.ended and store.get(a.key) is None


# --------------------------------------------------------------------------- wire format


@pytest.mark.parametrize(
    "body, field",
    [
        ([], "body"),
        ({}, "messages"),
        ({"messages": []}, "messages"),
        ({"messages": [{"role": "wizard", "content": "x"}]}, "messages[0].role"),
        ({"messages": [{"role": "user"}]}, "messages[0].content"),
        ({"messages": [{"role": "user", "content": 3}]}, "messages[0].content"),
        ({"messages": [{"role": "user", "content": "x"}], "n": 0}, "n"),
        ({"messages": [{"role": "user", "content": "x"}], "n": 65}, "n"),
        ({"messages": [{"role": "user", "content": "x"}], "stream": "yes"}, "stream"),
        ({"messages": [{"role": "user", "content": "x"}], "stream": True, "stream_options": []}, "stream_options"),
        ({"messages": [{"role": "user", "content": "x"}], "temperature": "hot"}, "temperature"),
        ({"messages": [{"role": "user", "content": "x"}], "max_tokens": 0}, "max_tokens"),
        ({"messages": [{"role": "user", "content": "x"}], "stop": [1]}, "stop"),
        ({"messages": [{"role": "user", "content": "x"}], "tools": [{"type": "function"}]}, "tools"),
        ({"messages": [{"role": "user", "content": "x"}], "tool_choice": "always"}, "tool_choice"),
    ],
)
def test_bad_chat_requests_name_the_field(body, field):
    with pytest.raises(RequestError) as info:
        parse_chat(body)
    assert info.value.status == 400
    assert field in str(info.value) or (field == "body" and "JSON object" in str(info.value))


def test_chat_request_passes_messages_and_tools_unchanged():
    messages = [
        {"role": "user", "content": "2+2="},
        {"role": "assistant", "content": None, "tool_calls": [{"id": "t", "type": "function", "function": {}}]},
        {"role": "tool", "tool_call_id": "t", "content": "4"},
    ]
    tools = [{"type": "function", "function": {"name": "calculator"}}]
    body = {"messages": messages, "tools": tools, "tool_choice": "auto", "max_completion_tokens": 5, "stop": "x", "seed": -1}
    parsed = parse_chat(body)
    assert parsed.messages is messages and parsed.tools is tools and parsed.tool_choice == "auto"
    assert (parsed.sampling.max_tokens, parsed.sampling.stop, parsed.sampling.seed) == (5, ["x"], 2**63 - 1)


def test_text_prompt_forms():
    assert parse_text({"prompt": ["1+2="]}).prompt == "1+2="
    assert parse_text({"prompt": [3, 4]}).prompt == [3, 4]
    for bad in ("", [], [-1], [True], [["a"]]):
        with pytest.raises(RequestError):
            parse_text({"prompt": bad})


def test_tool_calls_are_parsed_from_hermes_blocks():
    text = 'Let me add.<tool_call>\n{"name": "calculator", "arguments": {"expression": "2+3"}}\n</tool_call><|im_end|>'
    content, calls = hermes(text)
    assert content == "Let me add.<|im_end|>"  # the proxy strips special tokens from the content
    assert [(c.name, c.arguments) for c in calls] == [("calculator", json.dumps({"expression": "2+3"}))]
    assert calls[0].id.startswith("call_")
    broken = "<tool_call>{not json}</tool_call>"
    assert hermes(broken) == (broken, [])


@pytest.mark.parametrize(
    "parser, text, content, calls",
    [
        (llama3_json, '<|python_tag|>{"name": "calc", "parameters": {"e": "1+2"}}<|eom_id|>', "", [("calc", '{"e": "1+2"}')]),
        (llama3_json, '{"name": "a", "parameters": {}}; {"name": "b", "parameters": {"x": 1}}', "", [("a", "{}"), ("b", '{"x": 1}')]),
        (llama3_json, "The answer is 3.", "The answer is 3.", []),
        (llama3_json, '{"answer": 3}', '{"answer": 3}', []),
        (mistral, 'Sure.[TOOL_CALLS][{"name": "calc", "arguments": {"e": "2"}}]</s>', "Sure.", [("calc", '{"e": "2"}')]),
        (mistral, '[TOOL_CALLS]calc[ARGS]{"e": "2"}[TOOL_CALLS]other[ARGS]{}', "", [("calc", '{"e": "2"}'), ("other", "{}")]),
        (mistral, "[TOOL_CALLS]not json", "[TOOL_CALLS]not json", []),
        (mistral, "no calls", "no calls", []),
    ],
)
def test_llama3_and_mistral_tool_calls(parser, text, content, calls):
    got_content, got = parser(text)
    assert got_content == content and [(c.name, c.arguments) for c in got] == calls


def test_tool_parser_from_config_or_template(areal_plugins):
    class Shouty:
        @hookimpl
        def areal_register_tool_parsers(self, register):
            register("shouty", lambda text: (text.upper(), []))

    areal_plugins.add(Shouty(), "shouty")
    plugins = areal_plugins.load()
    assert tool_parser("auto", "{{ '[TOOL_CALLS]' }}", plugins) is mistral
    assert tool_parser("auto", "<|start_header_id|>ipython<|end_header_id|>", plugins) is llama3_json
    assert tool_parser("auto", None, plugins) is hermes
    assert tool_parser("shouty", None, plugins)("hi") == ("HI", [])
    with pytest.raises(PluginError, match="installed tool_parsers: hermes, llama3_json, mistral, shouty"):
        tool_parser("pythonic", None, plugins)


def test_unknown_tool_parser_names_the_config_key():
    from areal_core.config import AgentConfig, Config
    from areal_core.plugins import load_plugins
    from areal_core.resolve import resolve_config

    config = Config(agent=AgentConfig(tool_parser="pythonic"))
    with pytest.raises(ConfigError, match=r"^agent.tool_parser: tool_parser 'pythonic' is not installed"):
        resolve_config(config, load_plugins(), require_available=False)


@pytest.mark.parametrize(
    "stdout, reward",
    [('log\n{"reward": 0.5}\n', 0.5), ("1\n", 1.0), ('{"reward": null}', None), ("done", None), ("", None), ("true", None)],
)
def test_reward_from_the_last_stdout_line(stdout, reward):
    assert parse_reward_line(stdout) == reward


def test_sampling_is_the_trained_policy_unless_serving():
    gconfig = GenerationConfig(max_new_tokens=6, temperature=0.7, top_p=0.9)
    tokenizer = build_char_tokenizer(["0123+="])
    asked = Sampling(max_tokens=50, temperature=0.0, top_p=0.5, seed=7)
    trained = AgentProxy(None, tokenizer, gconfig).sampling_for(asked)  # type: ignore[arg-type]
    assert (trained.max_new_tokens, trained.temperature, trained.top_p, trained.greedy, trained.seed) == (6, 0.7, 0.9, False, 7)
    assert trained.stop_token_ids == (tokenizer.pad_token_id, tokenizer.eos_token_id)
    served = AgentProxy(None, tokenizer, gconfig, honour_request_sampling=True).sampling_for(asked)  # type: ignore[arg-type]
    assert (served.max_new_tokens, served.top_p, served.greedy) == (6, 0.5, True)
    assert AgentProxy(None, tokenizer, gconfig).sampling_for(Sampling()).max_new_tokens == 6  # type: ignore[arg-type]


# --------------------------------------------------------------------------- API shapes


def _reply(content: str = "hi", calls: list | None = None, finish: str = "stop") -> Reply:
    c = completion("resp-1", [1, 2, 3], [4, 5])
    return Reply(c, content, calls or [], "tool_calls" if calls else finish)


def test_responses_items_become_chat_messages():
    items = [
        {"role": "user", "content": [{"type": "input_text", "text": "2+3"}, {"type": "input_text", "text": "="}]},
        {"type": "reasoning", "summary": []},
        {"type": "function_call", "call_id": "c1", "name": "add", "arguments": "{}"},
        {"type": "function_call", "call_id": "c2", "name": "add", "arguments": "{}"},
        {"type": "function_call_output", "call_id": "c1", "output": "5"},
    ]
    history = [{"role": "user", "content": "before"}]
    request, conversation = parse_responses({"input": items, "instructions": "be brief", "previous_response_id": "r0"}, lambda rid: history)
    assert request.messages[0] == {"role": "system", "content": "be brief"} and request.messages[1:] == conversation
    assert conversation[:2] == [history[0], {"role": "user", "content": "2+3="}]
    assert [c["id"] for c in conversation[2]["tool_calls"]] == ["c1", "c2"] and conversation[2]["content"] is None
    assert conversation[3] == {"role": "tool", "tool_call_id": "c1", "content": "5"}
    for bad_body, field in [({"input": [{"type": "image"}]}, "input[0]"), ({"input": "x", "tools": [{"type": "web_search"}]}, "tools")]:
        with pytest.raises(RequestError, match=field.replace("[", r"\[")):
            parse_responses(bad_body, lambda rid: [])


def test_anthropic_blocks_become_chat_messages():
    body = {
        "system": [{"type": "text", "text": "sys"}],
        "messages": [
            {"role": "user", "content": "2+3="},
            {"role": "assistant", "content": [{"type": "text", "text": "adding"}, {"type": "tool_use", "id": "t1", "name": "add", "input": {"a": 2}}]},
            {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "t1", "content": [{"type": "text", "text": "5"}]}, {"type": "text", "text": "ok?"}]},
        ],
        "tools": [{"name": "add", "input_schema": {"type": "object"}}],
        "tool_choice": {"type": "any"},
        "stop_sequences": ["\n"],
        "max_tokens": 7,
    }
    request = parse_messages(body)
    assert [m["role"] for m in request.messages] == ["system", "user", "assistant", "tool", "user"]
    assert request.messages[2]["tool_calls"][0]["function"] == {"name": "add", "arguments": '{"a": 2}'}
    assert request.messages[3] == {"role": "tool", "tool_call_id": "t1", "content": "5"}
    assert request.tool_choice == "required" and request.tools[0]["function"]["parameters"] == {"type": "object"}
    assert (request.sampling.max_tokens, request.sampling.stop) == (7, ["\n"])
    with pytest.raises(RequestError, match=r"messages\[0\].content\[0\]"):
        parse_messages({"messages": [{"role": "user", "content": [{"type": "tool_use", "id": "x", "name": "y"}]}]})


def test_streams_carry_the_same_reply_as_the_objects():
    from areal_core.api.tool_call import ToolCall

    reply = _reply("", [ToolCall("add", '{"a": 2}', "call_1")])
    events = response_events({"model": "m"}, reply)
    assert [e[1]["sequence_number"] for e in events] == list(range(len(events)))
    assert events[0][0] == "response.created" and events[-1][0] == "response.completed"
    assert events[-1][1]["response"]["output"][0]["call_id"] == "call_1"
    message = message_events("m", reply)
    assert message[0][0] == "message_start" and message[-2][1]["delta"]["stop_reason"] == "tool_use"
    assert message_object("m", reply)["content"] == [{"type": "tool_use", "id": "call_1", "name": "add", "input": {"a": 2}}]
    chunks = chat_chunks("m", [_reply("a"), _reply("b", finish="length")], include_usage=True)
    assert chunks[-1] == DONE and chunks[-2][1]["usage"]["completion_tokens"] == 4
    assert [(c[1]["choices"][0]["index"], c[1]["choices"][0]["finish_reason"]) for c in chunks[:-2] if c[1]["choices"][0]["finish_reason"]] == [(0, "stop"), (1, "length")]
