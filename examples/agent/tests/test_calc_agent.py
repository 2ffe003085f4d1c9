"""The example agent: its local tool, and a short training run of examples/agent/train.py."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest

EXAMPLE = Path(__file__).resolve().parents[1]
REPO = EXAMPLE.parents[1]
sys.path.insert(0, str(EXAMPLE))

from calc_agent import calculator

SHORT_RUN = [
    "total_train_steps=3",
    "gconfig.n_samples=4",
    "train_dataset.batch_size=4",
    "valid_dataset.size=4",
    "stats.eval_every=3",
    "stats.progress=false",
]


def test_calculator_tool():
    assert calculator("3+4=") == "7" and calculator(" 12 + 30 ") == "42"
    assert calculator("3*4").startswith("error") and calculator("a+1").startswith("error")


class FakeToolModelServer(ThreadingHTTPServer):
    """A fake of another OpenAI-compatible server (no real tool-calling model runs here): its
    "model" calls the calculator tool first, then answers with the tool's result. It follows the
    chat-completions schema and records the requests it got."""

    def __init__(self) -> None:
        self.requests: list[dict[str, Any]] = []
        super().__init__(("127.0.0.1", 0), _FakeHandler)


class _FakeHandler(BaseHTTPRequestHandler):
    server: FakeToolModelServer

    def do_POST(self) -> None:
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        self.server.requests.append(body)
        tool_results = [m["content"] for m in body["messages"] if m["role"] == "tool"]
        if tool_results:
            message: dict[str, Any] = {"role": "assistant", "content": tool_results[-1]}
        else:
            expression = body["messages"][-1]["content"]
            call = {"name": body["tools"][0]["function"]["name"], "arguments": json.dumps({"expression": expression})}
            message = {"role": "assistant", "content": None, "tool_calls": [{"id": "call_0", "type": "function", "function": call}]}
        reply = {
            "id": "chatcmpl-fake", "object": "chat.completion", "created": 0, "model": body["model"],
            "choices": [{"index": 0, "message": message, "finish_reason": "tool_calls" if not tool_results else "stop"}],
            "usage": {"prompt_tokens": 1, "completion_tokens": 1, "total_tokens": 2},
        }  # fmt: skip
        data = json.dumps(reply).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def log_message(self, *args: object) -> None:
        pass


def test_agent_uses_the_tool_with_another_openai_server() -> None:
    """The unchanged agent file against another endpoint: tool call, local tool, tool message, answer."""
    server = FakeToolModelServer()
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        env = {
            **os.environ,
            "OPENAI_BASE_URL": f"http://127.0.0.1:{server.server_address[1]}/v1",
            "OPENAI_API_KEY": "sk-anything",
            "OPENAI_MODEL": "some-model",
        }
        done = subprocess.run(
            [sys.executable, str(EXAMPLE / "calc_agent.py")],
            input='{"prompt": "12+30="}', env=env, capture_output=True, text=True, timeout=120, check=False,
        )  # fmt: skip
    finally:
        server.shutdown()
        server.server_close()
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout.splitlines()[-1]) == {"reward": 1.0}
    first, second = server.requests
    assert first["model"] == "some-model" and first["tools"][0]["function"]["name"] == "calculator"
    assistant, tool = second["messages"][-2:]
    assert assistant["tool_calls"][0]["id"] == "call_0"  # the tool call goes back unchanged
    assert tool == {"role": "tool", "tool_call_id": "call_0", "content": "42"}


@pytest.mark.slow
def test_example_trains_through_the_proxy(tmp_path: Path) -> None:
    """Three steps of the example config: every episode goes through the proxy, none fails."""
    cmd = [
        sys.executable, "-m", "areal_core.launcher.local", str(EXAMPLE / "train.py"),
        "--config", str(EXAMPLE / "config.yaml"), f"fileroot={tmp_path}", *SHORT_RUN,
    ]  # fmt: skip
    done = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True, timeout=600, check=False)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    rows = [json.loads(line) for line in (tmp_path / "agent" / "trial0" / "stats.jsonl").read_text().splitlines()]
    assert len(rows) == 3
    for row in rows:
        assert row["rollout/failed"] == 0 and row["perf/output_tokens"] > 0
    assert "eval/accuracy" in rows[-1]
    assert (tmp_path / "agent" / "trial0" / "checkpoints" / "final" / "config.json").exists()
