"""The hf server's continuous batching vs waves, side by side on one closed loop.

    python bench/hf_batching.py [--groups 300] [--slots 24] [--repeats 3]

The hf server's :class:`Generator` (in-process, one model thread and one torch thread, as the
server runs it) serves a closed loop: ``--slots`` groups of 8 sampled requests in flight (24 as in
``bench/async_vs_sync.py``), prompts of 6 to 11 tokens, up to 24 new tokens with end-of-sequence
kept, so lengths have the random-init tiny model's long tail, until ``--groups`` groups are done.
Two schedules take turns, ``--repeats`` times each:

- ``continuous`` (the default): queued requests are prefilled on their own and join the running
  batch on its KV cache;
- ``waves`` (the fallback for caches that cannot be joined): a wave down to half the batch goes
  back to the queue and is prefilled again, prompt + output, with the newcomers.

Each run prints groups/s, output tokens/s and the share of model time spent in prefills; the last
line gives min / median / max of continuous's groups/s over waves', pair by pair.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import random
import tempfile
import time
from collections.abc import Iterator
from typing import Any

import torch
from spread import spread

from areal_core.api.wire import GenerateBody
from areal_core.builtin.engine_hf import generator
from areal_core.builtin.engine_hf.server import load_served_model
from areal_core.config import TinyModelSpec
from areal_core.tiny_model import ensure_tiny_model

GROUP, MAX_NEW_TOKENS, MAX_BATCH = 8, 24, 64
CORPUS = ["0123456789+-=* abcdefghijklmnopqrstuvwxyz"]


@contextlib.contextmanager
def schedule(name: str, seconds: dict[str, float]) -> Iterator[None]:
    """Serve with schedule ``name``, adding each model call's seconds to ``seconds`` by kind."""
    originals = {kind: getattr(generator._Batch, kind) for kind in ("prefill", "step")}
    joinable = generator._plain_growing

    def timed(kind: str) -> Any:
        def call(self: Any, *args: Any) -> Any:
            start = time.perf_counter()
            try:
                return originals[kind](self, *args)
            finally:
                seconds[kind] += time.perf_counter() - start

        return call

    try:
        for kind in originals:
            setattr(generator._Batch, kind, timed(kind))
        if name == "waves":
            generator._plain_growing = lambda cache: False
        yield
    finally:
        for kind, original in originals.items():
            setattr(generator._Batch, kind, original)
        generator._plain_growing = joinable


async def closed_loop(model: Any, eos: frozenset[int], pad: int, groups: int, slots: int) -> tuple[float, float]:
    """(groups/s, output tokens/s) of ``slots`` groups in flight until ``groups`` are done."""
    gen = generator.Generator(model, eos_ids=eos, pad_id=pad, max_batch_size=MAX_BATCH, seed=0)
    server = asyncio.create_task(gen.serve_forever())
    rng = random.Random(0)
    prompts = [[rng.randrange(2, 20) for _ in range(rng.randrange(6, 12))] for _ in range(groups)]
    todo = iter(range(groups))
    tokens = 0

    async def slot() -> None:
        nonlocal tokens
        for g in todo:
            bodies = [GenerateBody(rid=f"{g}-{i}", input_ids=prompts[g], max_new_tokens=MAX_NEW_TOKENS, seed=g * GROUP + i)
                      for i in range(GROUP)]  # fmt: skip
            tokens += sum(len(r.output_ids) for r in await gen.generate_many(bodies))

    start = time.perf_counter()
    try:
        await asyncio.gather(*(slot() for _ in range(slots)))
    finally:
        server.cancel()
    wall = time.perf_counter() - start
    return groups / wall, tokens / wall


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--groups", type=int, default=300)
    parser.add_argument("--slots", type=int, default=24)
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
    if min(args.groups, args.slots, args.repeats) < 1:
        parser.error("--groups, --slots and --repeats take at least 1")
    torch.set_num_threads(1)
    with tempfile.TemporaryDirectory(prefix="areal-bench-") as tmp:
        path = ensure_tiny_model(TinyModelSpec(), CORPUS, tmp, seed=0)
        model, eos, pad = load_served_model(str(path), "float32")
    ratios = []
    print(f"{'repeat':>6} {'schedule':>10} {'groups/s':>9} {'tokens/s':>9} {'prefill share':>14}")
    for repeat in range(args.repeats):
        rates = {}
        for name in ("continuous", "waves"):
            seconds = {"prefill": 0.0, "step": 0.0}
            with schedule(name, seconds):
                rates[name], tokens_per_s = asyncio.run(closed_loop(model, eos, pad, args.groups, args.slots))
            share = seconds["prefill"] / (seconds["prefill"] + seconds["step"])
            print(f"{repeat + 1:>6} {name:>10} {rates[name]:>9.1f} {tokens_per_s:>9.0f} {100 * share:>13.0f}%", flush=True)
        ratios.append(rates["continuous"] / rates["waves"])
    print(f"\ncontinuous / waves groups/s, min / median / max of {args.repeats}: {spread(ratios, '{:.2f}', ' / ')}")


if __name__ == "__main__":
    main()
