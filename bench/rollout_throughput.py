"""Generation throughput of an inference engine on the tiny model at several concurrencies.

    python bench/rollout_throughput.py [--engine hf vllm] [--concurrency 1 8 32] [--max-new-tokens 64]

For each engine in turn (``vllm`` needs plugins/engine_vllm installed; it is skipped with a note
when it is not), starts its servers with the local scheduler, sends ``rounds`` waves of ``c``
concurrent sampled requests per concurrency ``c`` (each decodes exactly ``max_new_tokens``: the
end-of-sequence id is removed from the model and the tokenizer) and prints engine | concurrency
| tokens/s | mean latency, then each engine's tokens/s relative to the first one.
"""

from __future__ import annotations

import argparse
import asyncio
import random
import tempfile
import time
from pathlib import Path

from areal_core.config import Config, ModelConfig, RolloutConfig, TinyModelSpec
from areal_core.api.engine import GenerationRequest, GenerationResponse, InferenceEngine, SamplingParams
from areal_core.builtin.platform_cpu.platform import CpuPlatform
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
    from transformers import AutoModelForCausalLM, AutoTokenizer

    model = AutoModelForCausalLM.from_pretrained(model_dir)
    model.config.eos_token_id = model.generation_config.eos_token_id = None
    model.save_pretrained(out)
    tokenizer = AutoTokenizer.from_pretrained(model_dir)  # vLLM stops at the tokenizer's eos
    tokenizer.eos_token = None
    tokenizer.save_pretrained(out)
    return out


def run_engine(name: str, model: Path, fileroot: Path, args: argparse.Namespace) -> list[tuple[int, float, float]]:
    """(concurrency, tokens/s, mean latency) rows for engine ``name``."""
    platform = CpuPlatform()
    config = Config(
        fileroot=str(fileroot),
        model=ModelConfig(path=str(model)),
        rollout=RolloutConfig(engine=name, threads_per_server=args.threads),
    )
    engine = load_plugins().get("engine", name)(config, platform)
    with LocalScheduler(platform) as scheduler:
        engine.launch_servers(scheduler)
        measure(engine, 1, 8, rounds=1)  # warm-up
        rows = [(c, *measure(engine, c, args.max_new_tokens, args.rounds)) for c in args.concurrency]
        engine.close()
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--engine", nargs="+", default=["hf", "vllm"])
    parser.add_argument("--concurrency", type=int, nargs="+", default=[1, 8, 32])
    parser.add_argument("--max-new-tokens", type=int, default=64)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--threads", type=int, default=1, help="CPU threads per server")
    args = parser.parse_args()

    installed = set(load_plugins().names("engine"))
    results: dict[str, list[tuple[int, float, float]]] = {}
    with tempfile.TemporaryDirectory() as tmp:
        tiny = ensure_tiny_model(TinyModelSpec(), CORPUS, Path(tmp) / "models", seed=0)
        model = _without_eos(tiny, Path(tmp) / "model")
        for name in args.engine:
            if name not in installed:
                print(f"skipping engine {name!r}: not installed (installed: {', '.join(sorted(installed))})")
                continue
            results[name] = run_engine(name, model, Path(tmp) / "runs" / name, args)
    print(f"{'engine':<8} | {'concurrency':>11} | {'tokens/s':>9} | {'mean latency':>12}")
    print(f"{'-' * 8} | {'-' * 11} | {'-' * 9} | {'-' * 12}")
    for name, rows in results.items():
        for c, tps, latency in rows:
            print(f"{name:<8} | {c:>11} | {tps:>9.1f} | {latency:>11.2f}s")
    if len(results) > 1:
        (first, base), *others = results.items()
        for name, rows in others:
            ratios = ", ".join(f"c={c}: {tps / b:.2f}x" for (c, tps, _), (_, b, _) in zip(rows, base))
            print(f"{name} vs {first} tokens/s: {ratios}")


if __name__ == "__main__":
    main()
