"""AdamW and its learning-rate schedule (linear warm-up, then constant or cosine decay)."""

from __future__ import annotations

import contextlib
import functools
import math
from collections.abc import Iterator
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import torch

    from areal_core.config import OptimizerConfig


def lr_factor(step: int, config: OptimizerConfig, total_steps: int) -> float:
    """Multiplier on ``config.lr`` for optimizer step ``step`` (0-based) of ``total_steps``."""
    if step < config.warmup_steps:
        return (step + 1) / config.warmup_steps
    if config.schedule == "constant":
        return 1.0
    decay_steps = max(1, total_steps - config.warmup_steps)
    progress = min(1.0, (step - config.warmup_steps) / decay_steps)
    cosine = 0.5 * (1.0 + math.cos(math.pi * progress))
    return config.min_lr_ratio + (1.0 - config.min_lr_ratio) * cosine


def build_optimizer(
    params: list[torch.nn.Parameter], config: OptimizerConfig, total_steps: int
) -> tuple[torch.optim.AdamW, torch.optim.lr_scheduler.LambdaLR]:
    """AdamW over ``params`` and a LambdaLR stepping once per optimizer step."""
    import torch

    optimizer = torch.optim.AdamW(
        params,
        lr=config.lr,
        betas=(config.beta1, config.beta2),
        eps=config.eps,
        weight_decay=config.weight_decay,
        **_fastest_kernel(params),
    )
    schedule = functools.partial(lr_factor, config=config, total_steps=total_steps)
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, schedule)
    return optimizer, scheduler


# torch's one-pass AdamW kernel exists for these; elsewhere (e.g. an NPU) the multi-tensor loop
FUSED_ADAMW_DEVICES = frozenset({"cpu", "cuda"})


def _fastest_kernel(params: list[torch.nn.Parameter]) -> dict[str, bool]:
    """AdamW's ``fused`` kernel (one pass over each tensor) where torch has it, else ``foreach``
    (torch's default off CUDA is the per-tensor loop: the same math, ~3x slower on CPU). On
    SmolLM2-135M, one CPU thread: 0.17 s a step against foreach's 0.57 (bench/optimizer_step.py)."""
    if {p.device.type for p in params} <= FUSED_ADAMW_DEVICES:
        return {"fused": True}
    return {"foreach": True}


@contextlib.contextmanager
def keeping_kernel(optimizer: torch.optim.Optimizer) -> Iterator[None]:
    """Loading a state dict inside keeps the AdamW kernel this build chose: torch takes the saved
    groups' ``fused``/``foreach`` flags, so a checkpoint written with the multi-tensor loop (before
    the fused kernel) would otherwise run it on. The fused kernel keeps step counts on the
    parameter's device, where the loop's stay on the CPU."""
    import torch

    kernels = [{k: group.get(k) for k in ("fused", "foreach")} for group in optimizer.param_groups]
    yield
    for group, kernel in zip(optimizer.param_groups, kernels, strict=True):
        group.update(kernel)
        if not group.get("fused"):
            continue
        for param in group["params"]:
            state = optimizer.state.get(param, {})
            if "step" in state:
                state["step"] = state["step"].to(device=param.device, dtype=torch.float32)


def clip_grad_norm(params: list[torch.nn.Parameter], max_norm: float) -> float:
    """Global grad norm over all ranks' shards; clips to ``max_norm`` unless it is 0."""
    import torch
    from torch.distributed.tensor import DTensor

    norm = torch.nn.utils.clip_grad_norm_(params, max_norm if max_norm > 0 else float("inf"))
    if isinstance(norm, DTensor):
        norm = norm.full_tensor()
    return float(norm)
