"""Generation throughput of an inference engine on the tiny model at several concurrencies.

    python bench/rollout_throughput.py [--engine hf] [--concurrency 1 8 32] [--max-new-tokens 64]

Starts the engine's servers with the local scheduler, sends ``rounds`` waves of ``c`` concurrent
sampled requests per concurrency ``c`` (each decodes exactly ``max_new_tokens``: the model's
end-of-sequence id is removed) and prints engine | concurrency | tokens/s | mean latency.
"""

from __future__ import annotations

import argparse
import asyncio
import random
import tempfile
import time
from pathlib import Path

from areal_core.config import Config, ModelConfig, RolloutConfig, TinyModelSpec
from areal_core.engine import GenerationRequest, GenerationResponse, InferenceEngine, SamplingParams
from areal_core.platform import CpuPlatform
from areal_core.plugins import load_plugins
from areal_core.scheduler.local import LocalScheduler
from areal_core.tiny_model import ensure_tiny_model

CORPUS = ["0123456789+-=* abcdefghijklmnopqrstuvwxyz"]


async def _wave(engine: InferenceEngine, c: int, max_new_tokens: int, rng: random.Random) -> list[GenerationResponse]:
    params = SamplingParams(max_new_tokens=max_new_tokens, temperature=1.0)
    prompts = [[rng.randrange(2, 20) for _ in range(16)] for _ in range(c)]
    requests = [GenerationRequest(input_ids=prompt, sampling=params) for prompt in prompts]
    return await asyncio.gather(*(engine.agenerate(r) for r in requests))


def measure(engine: InferenceEngine, c: int, max_new_tokens: int, rounds: int) -> tuple[float, float]:
    """(output tokens per second, mean request latency in seconds) over ``rounds`` waves."""
    rng = random.Random(c)
    start = time.perf_counter()
    responses = [r for _ in range(rounds) for r in asyncio.run(_wave(engine, c, max_new_tokens, rng))]
    elapsed = time.perf_counter() - start
    tokens = sum(len(r.output_ids) for r in responses)
    return tokens / elapsed, sum(r.latency for r in responses) / len(responses)


def _without_eos(model_dir: Path, out: Path) -> Path:
    """A copy of the model that never stops early, so every request decodes max_new_tokens."""
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(model_dir)
    model.config.eos_token_id = model.generation_config.eos_token_id = None
    model.save_pretrained(out)
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--engine", default="hf")
    parser.add_argument("--concurrency", type=int, nargs="+", default=[1, 8, 32])
    parser.add_argument("--max-new-tokens", type=int, default=64)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--threads", type=int, default=1, help="CPU threads per server")
    args = parser.parse_args()

    platform = CpuPlatform()
    with tempfile.TemporaryDirectory() as tmp:
        tiny = ensure_tiny_model(TinyModelSpec(), CORPUS, Path(tmp) / "models", seed=0)
        model = _without_eos(tiny, Path(tmp) / "model")
        config = Config(
            fileroot=str(Path(tmp) / "runs"),
            model=ModelConfig(path=str(model)),
            rollout=RolloutConfig(engine=args.engine, threads_per_server=args.threads),
        )
        engine = load_plugins().get("engine", args.engine)(config, platform)
        with LocalScheduler(platform) as scheduler:
            engine.launch_servers(scheduler)
            measure(engine, 1, 8, rounds=1)  # warm-up
            rows = [(c, *measure(engine, c, args.max_new_tokens, args.rounds)) for c in args.concurrency]
            engine.close()
    print(f"{'engine':<8} | {'concurrency':>11} | {'tokens/s':>9} | {'mean latency':>12}")
    print(f"{'-' * 8} | {'-' * 11} | {'-' * 9} | {'-' * 12}")
    for c, tps, latency in rows:
        print(f"{args.engine:<8} | {c:>11} | {tps:>9.1f} | {latency:>11.2f}s")


if __name__ == "__main__":
    main()
