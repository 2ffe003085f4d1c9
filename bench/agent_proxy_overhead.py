"""Per-completion cost of the agent proxy vs calling the engine directly, side by side in one run.

    python bench/agent_proxy_overhead.py [--concurrency 1 8] [--rounds 20] [--max-new-tokens 4]

One hf server with the tiny model. For each concurrency ``c``, ``rounds`` waves of ``c`` chat
completions run on the engine's event loop (as the rollout runner runs workflows):
``encode_chat`` + ``engine.agenerate`` (direct, what a built-in workflow does); a raw HTTP POST
to the proxy (the proxy's own cost: HTTP, JSON, template, engine hop, recording); and the
``openai`` ``AsyncOpenAI`` client through the proxy (what an in-process agent pays, client
included): chat completions, the same streamed (SSE, read to the end), and the Responses API.
Prints mean latency per completion, completions/s, and the ratios to direct.
"""

from __future__ import annotations

import argparse
import asyncio
import tempfile
import time
from pathlib import Path

from areal_core.agent import AgentProxy, ProxyServer
from areal_core.agent.openai_api import Sampling
from areal_core.config import Config, GenerationConfig, ModelConfig, RolloutConfig
from areal_core.api.engine import GenerationRequest
from areal_core.builtin.engine_hf.client import HFEngine
from areal_core.builtin.platform_cpu.platform import CpuPlatform
from areal_core.api.workflow import encode_chat
from areal_core.scheduler.local import LocalScheduler
from areal_core.testing import LoopThread
from areal_core.tiny_model import ensure_tiny_model

PROMPTS = [f"{a}+{b}=" for a in range(10) for b in range(10)]


async def _direct(proxy: AgentProxy, prompt: str) -> float:
    start = time.perf_counter()
    ids = encode_chat(proxy.tokenizer, [{"role": "user", "content": prompt}], add_generation_prompt=True)
    await proxy.engine.agenerate(GenerationRequest(input_ids=ids, sampling=proxy.sampling_for(Sampling())))
    return time.perf_counter() - start


async def _proxied(client: object, key: str, prompt: str) -> float:
    start = time.perf_counter()
    await client.with_options(api_key=key).chat.completions.create(  # type: ignore[attr-defined]
        model="areal-policy", messages=[{"role": "user", "content": prompt}]
    )
    return time.perf_counter() - start


async def _streamed(client: object, key: str, prompt: str) -> float:
    start = time.perf_counter()
    stream = await client.with_options(api_key=key).chat.completions.create(  # type: ignore[attr-defined]
        model="areal-policy", messages=[{"role": "user", "content": prompt}], stream=True
    )
    async for _ in stream:
        pass
    return time.perf_counter() - start


async def _responses(client: object, key: str, prompt: str) -> float:
    start = time.perf_counter()
    await client.with_options(api_key=key).responses.create(model="areal-policy", input=prompt)  # type: ignore[attr-defined]
    return time.perf_counter() - start


async def _raw(http: object, url: str, key: str, prompt: str) -> float:
    start = time.perf_counter()
    body = {"model": "areal-policy", "messages": [{"role": "user", "content": prompt}]}
    response = await http.post(url, json=body, headers={"Authorization": f"Bearer {key}"})  # type: ignore[attr-defined]
    response.raise_for_status()
    return time.perf_counter() - start


async def _waves(run: object, c: int, rounds: int) -> tuple[float, float]:
    """(mean latency per completion, completions per second)."""
    latencies: list[float] = []
    start = time.perf_counter()
    for r in range(rounds):
        latencies += await asyncio.gather(*(run(PROMPTS[(r * c + i) % len(PROMPTS)]) for i in range(c)))  # type: ignore[operator]
    return sum(latencies) / len(latencies), len(latencies) / (time.perf_counter() - start)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--concurrency", type=int, nargs="+", default=[1, 8])
    parser.add_argument("--rounds", type=int, default=20)
    parser.add_argument("--max-new-tokens", type=int, default=4)
    args = parser.parse_args()

    import httpx
    from openai import AsyncOpenAI
    from transformers import AutoTokenizer

    with tempfile.TemporaryDirectory() as tmp:
        model = ensure_tiny_model(Config().model.tiny, ["0123456789+="], Path(tmp) / "models", seed=0)
        config = Config(fileroot=tmp, model=ModelConfig(path=str(model)), rollout=RolloutConfig(request_timeout=120))
        scheduler = LocalScheduler(CpuPlatform())
        loop = LoopThread()
        try:
            engine = HFEngine(config, CpuPlatform())
            engine.launch_servers(scheduler)
            proxy = AgentProxy(
                engine, AutoTokenizer.from_pretrained(model), GenerationConfig(max_new_tokens=args.max_new_tokens)
            )
            with ProxyServer(proxy) as server:
                key = proxy.sessions.start(loop.loop).key
                client = loop.submit(_make_client(AsyncOpenAI, server.base_url)).result()
                http = loop.submit(_make_client(httpx.AsyncClient, None)).result()
                url = f"{server.base_url}/chat/completions"
                modes = {
                    "direct": lambda p: _direct(proxy, p),
                    "proxy (raw HTTP)": lambda p: _raw(http, url, key, p),
                    "proxy (openai client)": lambda p: _proxied(client, key, p),
                    "proxy (streamed)": lambda p: _streamed(client, key, p),
                    "proxy (responses)": lambda p: _responses(client, key, p),
                }
                for run in modes.values():  # warm-up
                    loop.submit(_waves(run, 1, 3)).result()
                print(f"{'mode':>22} | {'c':>2} | {'ms/completion':>13} | {'completions/s':>13} | x direct latency")
                for c in args.concurrency:
                    base = None
                    for name, run in modes.items():
                        latency, rate = loop.submit(_waves(run, c, args.rounds)).result()
                        base = base or latency
                        print(f"{name:>22} | {c:>2} | {latency * 1e3:>13.1f} | {rate:>13.1f} | {latency / base:.2f}")
                loop.submit(client.close()).result()
                loop.submit(http.aclose()).result()
        finally:
            loop.close()
            scheduler.stop_all()


async def _make_client(cls: type, base_url: str | None) -> object:
    """Clients are built on the loop that uses them."""
    if base_url is None:
        return cls(timeout=120)
    return cls(base_url=base_url, api_key="unused", max_retries=0)


if __name__ == "__main__":
    main()
