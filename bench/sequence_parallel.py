"""Ulysses sequence parallelism: memory per rank and step time for one long sequence, sp=1 vs sp=2.

    python bench/sequence_parallel.py [--lengths 2048,4096,8192,16384,32768] [--budget-mb 768]
        [--hidden 512] [--layers 4] [--repeats 1]

One run trains one sequence of each length (a train step of the framework's own ``FSDPPolicy``:
the fused proximal pass, the loss, the backward and AdamW) at ``sp=1`` (one rank) and then at
``sp=2`` (two gloo ranks, ``actor.world_size=2 actor.sequence_parallel=2``), on a tiny Qwen3 built
locally (``--hidden``, ``--layers``; 8 heads, 4 kv heads, a character vocabulary). Each rank runs
one thread.

Memory is the step's peak resident memory over what the process held before it (freed heap is
returned first with ``malloc_trim`` and the kernel's peak counter reset: ``/proc/self/clear_refs``),
the largest over the ranks: activations,
gradients and what the step allocates, not the weights and optimizer state held across steps. A
setting stops at the first length whose step goes over ``--budget-mb``. The table prints both
settings per length, the ratio sp=2 / sp=1 of memory and of step time, and the longest length each
setting fits under the budget. With ``--repeats N`` each figure is min/median/max of N steps.
"""

from __future__ import annotations

import argparse
import ctypes
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

import torch

from spread import spread
from train_step import make_trajs

from areal_core.config import TinyModelSpec, load_config
from areal_core.process_memory import peak_rss_bytes, rss_bytes
from areal_core.tiny_model import ensure_tiny_model

CORPUS = ["0123456789+-=? abcdefghijklmnopqrstuvwxyz"]
_LIBC = ctypes.CDLL("libc.so.6")


def measure(engine, length: int, repeats: int) -> tuple[list[float], list[float]]:
    """(extra peak MB, seconds) of each of ``repeats`` train steps on one sequence of ``length``."""
    import torch.distributed as dist

    trajs = make_trajs([length], engine.model.lm.config.vocab_size, seed=length)
    megabytes, seconds = [], []
    pid = os.getpid()
    for _ in range(repeats):
        dist.barrier()
        _LIBC.malloc_trim(0)  # give freed heap back, so what the last step left cached does not count as held
        Path("/proc/self/clear_refs").write_text("5")  # VmHWM := VmRSS
        before = rss_bytes(pid)
        start = time.perf_counter()
        engine.ppo_update(trajs, [1.0], recompute_prox=True)
        seconds.append(time.perf_counter() - start)
        megabytes.append((peak_rss_bytes(pid) - before) / 2**20)
    return megabytes, seconds


def _worker(rank: int, world: int, store: str, model_path: str, lengths: list[int], budget_mb: float,
            repeats: int, out: str) -> None:  # fmt: skip
    import torch.distributed as dist

    from areal_core.builtin.platform_cpu import CpuPlatform
    from areal_core.plugins import load_plugins
    from areal_core.train.fsdp_policy import FSDPPolicy

    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"file://{store}", rank=rank, world_size=world)
    try:
        config = load_config(None, [f"model.path={model_path}", f"actor.world_size={world}",
                                    f"actor.sequence_parallel={world}", f"actor.max_tokens_per_mb={max(lengths)}",
                                    "actor.optimizer.lr=1e-6", "total_train_steps=1000"])  # fmt: skip
        algorithm = load_plugins(autoload=False).get("algorithm", "grpo")(config.actor)
        engine = FSDPPolicy(config, CpuPlatform(), model_path, algorithm)
        engine.initialize()
        measure(engine, 256, 1)  # warm-up: first-step allocations are not a length's
        rows = {}
        for length in lengths:
            megabytes, seconds = measure(engine, length, repeats)
            peaks = [None] * world
            dist.all_gather_object(peaks, max(megabytes))
            rows[length] = (megabytes, seconds, max(peaks))
            if max(peaks) > budget_mb:
                break
        if rank == 0:
            torch.save(rows, out)
        dist.barrier()
    finally:
        dist.destroy_process_group()
    os._exit(0)


def run(world: int, model_path: str, lengths: list[int], budget_mb: float, repeats: int, tmp: Path):
    import torch.multiprocessing as mp

    out = tmp / f"sp{world}.pt"
    args = (world, str(tmp / f"store{world}"), model_path, lengths, budget_mb, repeats, str(out))
    mp.spawn(_worker, args=args, nprocs=world, join=True)
    return torch.load(out)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--lengths", default="2048,4096,8192,16384,32768")
    parser.add_argument("--budget-mb", type=float, default=768.0)
    parser.add_argument("--hidden", type=int, default=512)
    parser.add_argument("--layers", type=int, default=4)
    parser.add_argument("--repeats", type=int, default=1)
    args = parser.parse_args()
    lengths = [int(x) for x in args.lengths.split(",")]
    with tempfile.TemporaryDirectory(prefix="sp-bench-") as tmp:
        spec = TinyModelSpec(hidden_size=args.hidden, num_layers=args.layers, num_heads=8, num_kv_heads=4,
                             head_dim=args.hidden // 8, intermediate_size=args.hidden * 2,
                             max_position_embeddings=max(lengths))  # fmt: skip
        model_path = str(ensure_tiny_model(spec, CORPUS, Path(tmp) / "models", seed=0))
        results = {sp: run(sp, model_path, lengths, args.budget_mb, args.repeats, Path(tmp)) for sp in (1, 2)}
    print(f"tiny Qwen3: hidden {args.hidden}, {args.layers} layers, 8 heads / 4 kv heads; one thread per rank; "
          f"budget {args.budget_mb:.0f} MB per rank")  # fmt: skip
    print("| tokens | sp=1 MB | sp=2 MB per rank | memory sp2/sp1 | sp=1 s | sp=2 s | time sp2/sp1 |")
    print("|---|---|---|---|---|---|---|")
    for length in lengths:
        one, two = results[1].get(length), results[2].get(length)
        cells = [str(length)]
        for row in (one, two):
            cells.append(spread(row[0], "{:.0f}") if row else "over")
        cells.append(f"{statistics.median(two[0]) / statistics.median(one[0]):.2f}" if one and two else "-")
        for row in (one, two):
            cells.append(spread(row[1], "{:.2f}") if row else "-")
        cells.append(f"{statistics.median(two[1]) / statistics.median(one[1]):.2f}" if one and two else "-")
        print("| " + " | ".join(cells) + " |")
    for sp in (1, 2):
        fits = [n for n, row in results[sp].items() if row[2] <= args.budget_mb]
        print(f"sp={sp}: longest sequence under {args.budget_mb:.0f} MB per rank: {max(fits) if fits else 'none'} tokens")
    return 0


if __name__ == "__main__":
    sys.exit(main())
