"""Ulysses sequence parallelism: memory per rank and step time for one long sequence, sp=1 vs sp=2.

    python bench/sequence_parallel.py [--lengths 2048,4096,8192,16384,32768] [--budget-mb 768]
        [--hidden 512] [--layers 4] [--repeats 1]

One run trains one sequence of each length (a train step of the framework's own ``FSDPPolicy``:
the fused proximal pass, the loss, the backward and AdamW) at ``sp=1`` (one rank) and then at
``sp=2`` (two gloo ranks, ``actor.world_size=2 actor.sequence_parallel=2``), on a tiny Qwen3 built
locally (``--hidden``, ``--layers``; 8 heads, 4 kv heads, a character vocabulary). Each rank runs
one thread.

Two memory figures per rank, each the largest over the ranks:

- **activations**: the bytes autograd keeps for the backward (every distinct tensor storage that a
  ``saved_tensors_hooks`` pack hook sees during the step, views of trainable parameters excluded):
  what sequence parallelism divides. One sequence per step is one micro-batch, so this is the
  micro-batch's whole saved state; it does not swing between repeats.
- **peak**: the step's peak resident memory over what the process held before it (freed heap is
  returned first with ``malloc_trim`` and the kernel's peak counter reset: ``/proc/self/clear_refs``):
  activations, gradients, gathered weights and every transient buffer, not the weights and
  optimizer state held across steps.

A setting stops at the first length whose peak goes over ``--budget-mb``. The table prints both
settings per length, the ratios sp=2 / sp=1 of activations, peak and step time, and the longest
length each setting fits under the budget. With ``--repeats N`` peak and time are min/median/max of
N steps.
"""

from __future__ import annotations

import argparse
import contextlib
import ctypes
import os
import statistics
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import attrs
import torch

from spread import spread
from train_step import make_trajs

from areal_core.config import TinyModelSpec, load_config
from areal_core.process_memory import peak_rss_bytes, rss_bytes
from areal_core.tiny_model import ensure_tiny_model

CORPUS = ["0123456789+-=? abcdefghijklmnopqrstuvwxyz"]
_LIBC = ctypes.CDLL("libc.so.6")


@contextlib.contextmanager
def saved_activations() -> Iterator[dict[int, int]]:
    """Within it, ``{storage address: bytes}`` of every tensor autograd saves for the backward,
    except views of trainable parameters (FSDP's gathered weights, which are not activations)."""
    storages: dict[int, int] = {}

    def pack(tensor: torch.Tensor) -> torch.Tensor:
        base = tensor._base if tensor._base is not None else tensor
        if not (base.is_leaf and base.requires_grad):
            storage = tensor.untyped_storage()
            storages[storage.data_ptr()] = storage.nbytes()
        return tensor

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda tensor: tensor):
        yield storages


def measure(engine, length: int, repeats: int) -> tuple[float, list[float], list[float]]:
    """(activation MB, [extra peak MB], [seconds]) of ``repeats`` train steps on one sequence of ``length``."""
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
    with saved_activations() as storages:  # one more step: the hook's bookkeeping stays out of the timings
        engine.ppo_update(trajs, [1.0], recompute_prox=True)
    return sum(storages.values()) / 2**20, megabytes, seconds


@attrs.frozen
class Row:
    """One setting at one length: activation MB (the largest over the ranks), peak MB per repeat (of
    the rank that peaked highest) and seconds per repeat (rank 0's; the ranks step in lockstep)."""

    activations: float
    peaks: list[float]
    seconds: list[float]


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
            activations, megabytes, seconds = measure(engine, length, repeats)
            per_rank = [None] * world
            dist.all_gather_object(per_rank, (activations, megabytes))
            highest = max((p for _, p in per_rank), key=max)
            rows[length] = attrs.asdict(Row(max(a for a, _ in per_rank), highest, seconds))
            if max(highest) > budget_mb:
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
    return {length: Row(**row) for length, row in torch.load(out).items()}


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
    print("| tokens | sp=1 activations MB | sp=2 activations MB | activations sp2/sp1 | sp=1 peak MB | sp=2 peak MB "
          "| peak sp2/sp1 | sp=1 s | sp=2 s | time sp2/sp1 |")  # fmt: skip
    print("|---|---|---|---|---|---|---|---|---|---|")
    for length in [n for n in lengths if n in results[1] or n in results[2]]:
        one, two = results[1].get(length), results[2].get(length)
        both = one is not None and two is not None
        cells = [str(length)]
        cells += [f"{row.activations:.0f}" if row else "over" for row in (one, two)]
        cells.append(f"{two.activations / one.activations:.2f}" if both else "-")
        cells += [spread(row.peaks, "{:.0f}") if row else "over" for row in (one, two)]
        cells.append(f"{statistics.median(two.peaks) / statistics.median(one.peaks):.2f}" if both else "-")
        cells += [spread(row.seconds, "{:.2f}") if row else "-" for row in (one, two)]
        cells.append(f"{statistics.median(two.seconds) / statistics.median(one.seconds):.2f}" if both else "-")
        print("| " + " | ".join(cells) + " |")
    for sp in (1, 2):
        fits = [n for n, row in results[sp].items() if max(row.peaks) <= args.budget_mb]
        longest = f"{max(fits)} tokens" if fits else "none"
        print(f"sp={sp}: longest sequence under {args.budget_mb:.0f} MB per rank: {longest}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
