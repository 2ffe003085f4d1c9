"""Resumable training checkpoints with torch.distributed.checkpoint (DCP).

Model and optimizer are saved sharded by DCP (each rank writes its shards, so resuming at another
world size works); frozen parameters (a LoRA policy's base weights) are not saved, they come
from the model directory again. The LR schedule, the step and every rank's RNG state go to a small
``extra_rank{r}.pt`` per rank.
"""

from __future__ import annotations

import random
from pathlib import Path
from typing import TYPE_CHECKING

from areal_core.train.optim import keeping_kernel

if TYPE_CHECKING:
    import torch
    from torch.distributed.checkpoint.state_dict import StateDictOptions


def _rng_state(device_type: str) -> dict:
    import torch

    state = {"python": random.getstate(), "torch": torch.get_rng_state()}
    if device_type != "cpu":
        state["device"] = torch.get_device_module(device_type).get_rng_state()
    return state


def _set_rng_state(state: dict, device_type: str) -> None:
    import torch

    random.setstate(state["python"])
    torch.set_rng_state(state["torch"])
    if "device" in state:
        torch.get_device_module(device_type).set_rng_state(state["device"])


def _options(model: torch.nn.Module) -> StateDictOptions:
    """Leave frozen parameters out; DCP's load still fails on any trainable one it lacks."""
    from torch.distributed.checkpoint.state_dict import StateDictOptions

    frozen = any(not p.requires_grad for p in model.parameters())
    return StateDictOptions(ignore_frozen_params=frozen, strict=not frozen)


def save_checkpoint(
    path: str | Path,
    model: torch.nn.Module,
    optimizer: torch.optim.Optimizer,
    scheduler: torch.optim.lr_scheduler.LRScheduler,
    step: int,
    device_type: str,
) -> None:
    """Collective: every rank writes its shards of model + optimizer and its extra state."""
    import torch
    import torch.distributed as dist
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.state_dict import get_state_dict

    path = Path(path)
    path.mkdir(parents=True, exist_ok=True)
    model_sd, optim_sd = get_state_dict(model, optimizer, options=_options(model))
    dcp.save({"model": model_sd, "optim": optim_sd}, checkpoint_id=str(path))
    extra = {"scheduler": scheduler.state_dict(), "step": step, "rng": _rng_state(device_type)}
    torch.save(extra, path / f"extra_rank{dist.get_rank()}.pt")
    dist.barrier()


def load_checkpoint(
    path: str | Path,
    model: torch.nn.Module,
    optimizer: torch.optim.Optimizer,
    scheduler: torch.optim.lr_scheduler.LRScheduler,
    device_type: str,
) -> int:
    """Collective: restore what :func:`save_checkpoint` wrote; returns the saved step."""
    import torch
    import torch.distributed as dist
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.state_dict import get_state_dict, set_state_dict

    path = Path(path)
    extra_file = path / f"extra_rank{dist.get_rank()}.pt"
    if not (path / ".metadata").is_file():
        raise FileNotFoundError(
            f"{path} is not a DCP checkpoint (no .metadata); pass a directory written by save_checkpoint"
        )
    options = _options(model)
    model_sd, optim_sd = get_state_dict(model, optimizer, options=options)
    state = {"model": model_sd, "optim": optim_sd}
    dcp.load(state, checkpoint_id=str(path))
    with keeping_kernel(optimizer):
        set_state_dict(model, optimizer, model_state_dict=state["model"], optim_state_dict=state["optim"], options=options)
    if not extra_file.is_file():  # saved at a smaller world size: take rank 0's schedule and step
        extra_file = path / "extra_rank0.pt"
    extra = torch.load(extra_file, weights_only=False)
    scheduler.load_state_dict(extra["scheduler"])
    _set_rng_state(extra["rng"], device_type)
    dist.barrier()
    return int(extra["step"])
