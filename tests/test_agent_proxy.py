"""The agent proxy against a real hf server process: recording, isolation, bad input, workflows.

One hf server (tiny model) and one proxy per module; the engine's calls run on a background
event loop, as under the rollout controller. Agents are real: the ``openai`` client over HTTP,
and the example agent program as a subprocess.
"""

from __future__ import annotations

import http.client
import json
import sys
import urllib.error
import urllib.request
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import attrs
import httpx
import pytest
from openai import AsyncOpenAI, BadRequestError, OpenAI

from areal_core.agent import AgentProxy, AgentWorkflow, ProxyServer
from areal_core.config import Config, GenerationConfig, ModelConfig, RolloutConfig
from areal_core.builtin.engine_hf.client import HFEngine
from areal_core.builtin.platform_cpu.platform import CpuPlatform
from areal_core.rollout.runner import RolloutRunner
from areal_core.rollout.staleness import StalenessManager
from areal_core.api.workflow import encode_chat
from areal_core.scheduler.local import LocalScheduler
from areal_core.testing import LoopThread
from areal_core.tiny_model import ensure_tiny_model

pytestmark = pytest.mark.slow

REPO = Path(__file__).resolve().parents[1]
AGENT = REPO / "examples" / "agent" / "calc_agent.py"
#: Renders tools and tool calls, and closes assistant turns with eos like real chat templates.
TEMPLATE = (
    "{% if tools %}{% for t in tools %}{{ t['function']['name'] }};{% endfor %}{% endif %}"
    "{% if tool_choice is defined %}{{ tool_choice }}:{% endif %}"
    "{% for m in messages %}{{ m['content'] or '' }}"
    "{% for c in m.get('tool_calls') or [] %}{{ c['function']['name'] }}({{ c['function']['arguments'] }}){% endfor %}"
    "{% if m['role'] == 'assistant' %}{{ eos_token }}{% endif %}{% endfor %}"
)
CORPUS = ['0123456789+=abcdefghijklmnopqrstuvwxyz(){}":;,_ ']
GCONFIG = GenerationConfig(max_new_tokens=4, n_samples=3)
#: Runs the agent program, then fails (exit 3) if anything imported areal_core.
NO_AREAL = (
    "import runpy, sys; runpy.run_path(sys.argv[1], run_name='__main__'); "
    "bad = sorted(m for m in sys.modules if m.split('.')[0] == 'areal_core'); "
    "sys.exit(3 if bad else 0)"
)


@attrs.frozen
class Proxied:
    proxy: AgentProxy
    server: ProxyServer
    loop: LoopThread
    tokenizer: Any

    def session(self):
        return self.proxy.sessions.start(self.loop.loop)

    def client(self, key: str) -> OpenAI:
        return OpenAI(base_url=self.server.base_url, api_key=key, max_retries=0, timeout=120)

    def encode(self, messages: list[dict[str, Any]], **kwargs: Any) -> list[int]:
        return encode_chat(self.tokenizer, messages, add_generation_prompt=True, chat_template=TEMPLATE, **kwargs)


@pytest.fixture(scope="module")
def proxied(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Proxied]:
    from transformers import AutoTokenizer

    root = tmp_path_factory.mktemp("agent")
    model = ensure_tiny_model(Config().model.tiny, CORPUS, root / "models", seed=0)
    config = Config(
        fileroot=str(root),
        model=ModelConfig(path=str(model)),
        rollout=RolloutConfig(server_startup_timeout=120, request_timeout=120),
    )
    scheduler = LocalScheduler(CpuPlatform())
    loop = LoopThread()
    try:
        engine = HFEngine(config, CpuPlatform())
        engine.launch_servers(scheduler)
        tokenizer = AutoTokenizer.from_pretrained(model)
        proxy = AgentProxy(engine, tokenizer, GCONFIG, chat_template=TEMPLATE, max_body_bytes=4096)
        with ProxyServer(proxy) as server:
            yield Proxied(proxy, server, loop, tokenizer)
    finally:
        loop.close()
        scheduler.stop_all()


def post(url: str, body: bytes, headers: dict[str, str]) -> tuple[int, dict]:
    request = urllib.request.Request(url, body, {"Content-Type": "application/json", **headers}, method="POST")
    try:
        with urllib.request.urlopen(request, timeout=60) as resp:
            return resp.status, json.loads(resp.read())
    except urllib.error.HTTPError as exc:
        return exc.code, json.loads(exc.read())


# --------------------------------------------------------------------------- recording


def test_records_exactly_what_the_model_saw(proxied: Proxied) -> None:
    session = proxied.session()
    client = proxied.client(session.key)
    messages = [{"role": "user", "content": "1+2="}]
    first = client.chat.completions.create(model="any", messages=messages, max_tokens=3)
    messages += [{"role": "assistant", "content": first.choices[0].message.content}, {"role": "user", "content": "no"}]
    second = client.chat.completions.create(model="any", messages=messages)

    c1, c2 = session.completions
    assert c1.prompt_ids == proxied.encode(messages[:1])  # the template, applied once by the proxy
    assert c2.prompt_ids == proxied.encode(messages)  # a re-tokenisation of the whole conversation
    for c, reply in ((c1, first), (c2, second)):
        assert len(c.output_ids) == len(c.logprobs) == len(c.versions) >= 1
        assert all(lp <= 0 for lp in c.logprobs) and set(c.versions) == {0}
        assert reply.id == c.id and reply.choices[0].message.content == c.text
        assert c.text == proxied.tokenizer.decode(c.output_ids, skip_special_tokens=True)
        assert (reply.usage.prompt_tokens, reply.usage.completion_tokens) == (len(c.prompt_ids), len(c.output_ids))
    assert len(c1.output_ids) <= 3 and len(c2.output_ids) <= GCONFIG.max_new_tokens  # max_tokens, capped
    if c1.output_ids[-1] != proxied.tokenizer.pad_token_id:  # eos or length: history re-renders exactly
        assert c2.prompt_ids[: len(c1.prompt_ids) + len(c1.output_ids)] == c1.prompt_ids + c1.output_ids


def test_versions_follow_the_weights_across_turns(proxied: Proxied) -> None:
    """Each turn's tokens carry the version that produced them; concatenation keeps them apart."""
    from areal_core.agent import export_session

    session = proxied.session()
    client = proxied.client(session.key)
    messages = [{"role": "user", "content": "2+2="}]
    first = client.chat.completions.create(model="any", messages=messages, max_tokens=2)
    proxied.proxy.engine.set_version(7)
    try:
        messages += [{"role": "assistant", "content": first.choices[0].message.content}, {"role": "user", "content": "no"}]
        client.chat.completions.create(model="any", messages=messages)
    finally:
        proxied.proxy.engine.set_version(0)
    assert [set(c.versions) for c in session.completions] == [{0}, {7}]
    session.set_reward(1.0)
    trajectories = export_session(session, gamma=1.0, mode="concat", prompt_id="v", info={})
    versions = [v for t in trajectories for v, m in zip(t.versions, t.loss_mask) if m]
    assert versions == session.completions[0].versions + session.completions[1].versions


def test_tool_calls_pass_through_to_the_template(proxied: Proxied) -> None:
    session = proxied.session()
    tools = [{"type": "function", "function": {"name": "calc", "parameters": {"type": "object"}}}]
    call = {"id": "call_1", "type": "function", "function": {"name": "calc", "arguments": '{"e":"2+3"}'}}
    messages = [
        {"role": "user", "content": "2+3="},
        {"role": "assistant", "content": None, "tool_calls": [call]},
        {"role": "tool", "tool_call_id": "call_1", "content": "5"},
    ]
    client = proxied.client(session.key)
    reply = client.chat.completions.create(model="any", messages=messages, tools=tools, tool_choice="auto")
    assert session.completions[0].prompt_ids == proxied.encode(messages, tools=tools, tool_choice="auto")
    rendered = proxied.tokenizer.decode(session.completions[0].prompt_ids)
    assert rendered == 'calc;auto:2+3=calc({"e":"2+3"})<eos>5'  # the conversation exactly as the agent sent it
    assert reply.choices[0].message.role == "assistant"


def test_streamed_calls_record_what_unstreamed_calls_record(proxied: Proxied) -> None:
    """Same seed, streamed or not: the same recorded tokens, and the stream carries the same reply."""
    messages = [{"role": "user", "content": "1+4="}]
    plain, streamed = proxied.session(), proxied.session()
    reply = proxied.client(plain.key).chat.completions.create(model="m", messages=messages, seed=11)
    chunks = list(
        proxied.client(streamed.key).chat.completions.create(
            model="m", messages=messages, seed=11, stream=True, stream_options={"include_usage": True}
        )
    )
    (a,), (b,) = plain.completions, streamed.completions
    assert (a.prompt_ids, a.output_ids, a.logprobs) == (b.prompt_ids, b.output_ids, b.logprobs)
    assert "".join(c.choices[0].delta.content or "" for c in chunks if c.choices) == reply.choices[0].message.content
    assert chunks[-1].choices == [] and chunks[-1].usage.completion_tokens == len(b.output_ids)
    assert {c.id for c in chunks} == {b.id}

    text_plain, text_streamed = proxied.session(), proxied.session()
    proxied.client(text_plain.key).completions.create(model="m", prompt="2+2=", seed=5)
    pieces = list(proxied.client(text_streamed.key).completions.create(model="m", prompt="2+2=", seed=5, stream=True))
    assert text_plain.completions[0].output_ids == text_streamed.completions[0].output_ids
    assert "".join(p.choices[0].text for p in pieces) == text_streamed.completions[0].text


def test_n_samples_are_recorded_one_completion_each(proxied: Proxied) -> None:
    session = proxied.session()
    client = proxied.client(session.key)
    reply = client.chat.completions.create(model="m", messages=[{"role": "user", "content": "3+1="}], n=3, seed=2)
    assert [c.id for c in session.completions] == [reply.id, f"{reply.id}-1", f"{reply.id}-2"]
    assert [ch.message.content for ch in reply.choices] == [c.text for c in session.completions]
    assert len({c.prompt_ids == session.completions[0].prompt_ids for c in session.completions}) == 1
    assert reply.usage.completion_tokens == sum(len(c.output_ids) for c in session.completions)
    streamed = list(client.completions.create(model="m", prompt="3+1=", n=2, stream=True))
    assert {p.choices[0].index for p in streamed} == {0, 1} and len(session.completions) == 5


def test_text_completions_take_text_or_token_ids(proxied: Proxied) -> None:
    session = proxied.session()
    client = proxied.client(session.key)
    ids = proxied.tokenizer.encode("4+4=", add_special_tokens=False)
    by_text = client.completions.create(model="any", prompt="4+4=", max_tokens=2)
    by_ids = client.completions.create(model="any", prompt=ids, max_tokens=2)
    assert [c.prompt_ids for c in session.completions] == [ids, ids]
    assert by_text.choices[0].text == session.completions[0].text and by_ids.id == session.completions[1].id


# --------------------------------------------------------------------------- sessions


def test_concurrent_sessions_are_isolated(proxied: Proxied) -> None:
    sessions = [proxied.session() for _ in range(6)]
    prompts = [f"{i}+{i}=" for i in range(6)]

    def agent(i: int) -> None:
        client = proxied.client(sessions[i].key)
        for _ in range(2):
            client.chat.completions.create(model="any", messages=[{"role": "user", "content": prompts[i]}])

    with ThreadPoolExecutor(6) as pool:
        list(pool.map(agent, range(6)))
    for session, prompt in zip(sessions, prompts):
        assert [c.prompt_ids for c in session.completions] == [proxied.encode([{"role": "user", "content": prompt}])] * 2

    url = proxied.server.base_url
    a, b = sessions[0], sessions[1]
    status, body = post(f"{url}/reward", json.dumps({"reward": 1, "completion_id": b.completions[0].id}).encode(), {"Authorization": f"Bearer {a.key}"})
    assert status == 404 and "not part of this session" in body["error"]["message"]
    assert b.rewards == {} and a.rewards == {}
    summary = httpx.get(f"{url}/session", headers={"X-Areal-Session": a.key}).json()
    assert [c["id"] for c in summary["completions"]] == [c.id for c in a.completions]


def test_rewards_per_completion_and_final(proxied: Proxied) -> None:
    session = proxied.session()
    client = proxied.client(session.key)
    reply = client.chat.completions.create(model="any", messages=[{"role": "user", "content": "3+3="}])
    url, auth = f"{proxied.server.base_url}/reward", {"Authorization": f"Bearer {session.key}"}
    assert post(url, json.dumps({"reward": 0.25, "completion_id": reply.id}).encode(), auth)[0] == 200
    assert post(url, b'{"reward": 1}', auth)[0] == 200
    assert post(url, b'{"reward": "high"}', auth)[0] == 400
    assert session.rewards == {reply.id: 0.25} and session.final_reward == 1.0
    assert post(f"{proxied.server.base_url}/session/end", b"{}", auth)[0] == 200
    assert post(url, b'{"reward": 2}', auth)[0] == 409 and session.final_reward == 1.0


def test_sessions_over_http_need_the_admin_key(proxied: Proxied) -> None:
    url = f"{proxied.server.base_url}/sessions"
    assert post(url, b"{}", {"Authorization": "Bearer nope"})[0] == 401
    status, body = post(url, b"{}", {"Authorization": f"Bearer {proxied.proxy.admin_key}"})
    assert status == 200 and proxied.proxy.sessions.get(body["session_key"]) is not None


def test_binds_localhost_by_default(proxied: Proxied) -> None:
    assert proxied.server.host == "127.0.0.1" and proxied.server.base_url.startswith("http://127.0.0.1:")


# --------------------------------------------------------------------------- bad input


def test_malformed_and_oversized_requests_get_clear_4xx(proxied: Proxied) -> None:
    key = proxied.session().key
    url = f"{proxied.server.base_url}/chat/completions"
    auth = {"Authorization": f"Bearer {key}"}
    cases = [
        (b"{not json", auth, 400, "not valid JSON"),
        (b'{"messages": [{"role": "wizard", "content": "x"}]}', auth, 400, "messages[0].role"),
        (b'{"messages": [{"role": "user", "content": "x"}], "n": 0}', auth, 400, "n: must be"),
        (json.dumps({"messages": [{"role": "user", "content": "1+1=\u00e9\u4e2d"}]}).encode(), auth, 400, "cannot render"),
        (b'{"messages": [{"role": "user", "content": "1+1="}]}', {}, 401, "session key"),
        (b'{"messages": [{"role": "user", "content": "1+1="}]}', {"Authorization": "Bearer guess"}, 401, "session key"),
        (json.dumps({"messages": [{"role": "user", "content": "1" * 5000}]}).encode(), auth, 413, "limit of 4096"),
    ]
    for body, headers, status, words in cases:
        got, reply = post(url, body, headers)
        assert (got, words in reply["error"]["message"]) == (status, True), (body[:60], reply)

    # a chunked body declares no length: the limit applies while reading it
    host, port = proxied.server.host, proxied.server.port
    conn = http.client.HTTPConnection(host, port, timeout=60)
    chunks = iter([b'{"messages": [{"role": "user", "content": "'] + [b"1" * 1000] * 8 + [b'"}]}'])
    conn.request("POST", "/v1/chat/completions", body=chunks, headers=auth, encode_chunked=True)
    response = conn.getresponse()
    assert response.status == 413 and "limit" in json.loads(response.read())["error"]["message"]
    conn.close()

    with pytest.raises(BadRequestError, match="n: must be an integer"):  # the openai client sees a normal 400
        proxied.client(key).chat.completions.create(model="m", messages=[{"role": "user", "content": "1"}], n=100)
    ok = proxied.client(key).chat.completions.create(model="m", messages=[{"role": "user", "content": "1+1="}])
    assert ok.choices[0].finish_reason in ("stop", "length")  # still serving


# --------------------------------------------------------------------------- workflows


def _workflow(proxied: Proxied, agent: Any, **kwargs: Any) -> AgentWorkflow:
    return AgentWorkflow(proxied.server, agent, n_samples=GCONFIG.n_samples, **kwargs)


def test_agent_program_runs_without_areal_core(proxied: Proxied) -> None:
    """The example agent as a subprocess (asserting it never imports areal_core), exported concatenated."""
    workflow = _workflow(proxied, [sys.executable, "-c", NO_AREAL, str(AGENT)], gamma=0.5, export="concat")
    data = {"id": "p1", "prompt": "2+3=", "answer": "5"}
    open_sessions = len(proxied.proxy.sessions)
    trajectories = proxied.loop.submit(workflow(proxied.proxy.engine, data)).result(timeout=300)
    assert trajectories and {t.prompt_id for t in trajectories} == {"p1"}
    by_agent: dict[int, list] = {}
    for t in trajectories:
        by_agent.setdefault(t.info["sample_index"], []).append(t)
        assert len(t.input_ids) == len(t.loss_mask) == len(t.logprobs) == len(t.versions)
        assert all((v >= 0) == bool(m) for v, m in zip(t.versions, t.loss_mask))  # loss on model tokens only
        assert t.info["agent_reward"] in (0.0, 1.0)
    assert sorted(by_agent) == list(range(GCONFIG.n_samples))
    for runs in by_agent.values():
        first = runs[0]
        expected = first.info["agent_reward"] * 0.5 ** (sum(r.info["turns"] for r in runs) - 1)
        assert first.reward == pytest.approx(expected)
    assert len(proxied.proxy.sessions) == open_sessions  # every agent's session was closed after export


def test_agent_function_with_per_completion_rewards(proxied: Proxied) -> None:
    async def agent(base_url: str, api_key: str, data: dict[str, Any]) -> float:
        async with AsyncOpenAI(base_url=base_url, api_key=api_key, max_retries=0) as client:
            messages = [{"role": "user", "content": data["prompt"]}]
            first = await client.chat.completions.create(model="m", messages=messages)
            messages += [{"role": "assistant", "content": first.choices[0].message.content}, {"role": "user", "content": "no"}]
            await client.chat.completions.create(model="m", messages=messages)
            await client.post("/reward", body={"reward": 0.5, "completion_id": first.id}, cast_to=httpx.Response)
        return 1.0

    workflow = _workflow(proxied, agent, gamma=0.9, export="individual")
    trajectories = proxied.loop.submit(workflow(proxied.proxy.engine, {"id": "p2", "prompt": "1+3="})).result(timeout=300)
    assert len(trajectories) == 2 * GCONFIG.n_samples
    for index in range(GCONFIG.n_samples):
        first, second = [t for t in trajectories if t.info["sample_index"] == index]
        assert (first.reward, second.reward) == (pytest.approx(0.5 + 0.9 * 1.0), 1.0)
        assert second.input_ids[: len(first.input_ids)] == first.input_ids or first.input_ids[-1] == 0


def test_controller_runs_agents_under_the_staleness_bound(proxied: Proxied) -> None:
    workflow = _workflow(proxied, [sys.executable, str(AGENT)])
    engine = proxied.proxy.engine
    staleness = StalenessManager(batch_size=2, max_head_offpolicyness=0, max_concurrent=3)
    items = iter([{"id": f"q{i}", "prompt": f"{i}+1="} for i in range(4)])
    with RolloutRunner(engine, staleness) as controller:
        batch = controller.prepare_batch(items, workflow, timeout=300)
        assert staleness.submitted <= 2  # max_head_offpolicyness 0: no episode beyond this version's batch
    assert {t.prompt_id for t in batch} == {"q0", "q1"}
    assert {t.info["sample_index"] for t in batch} == set(range(GCONFIG.n_samples))
