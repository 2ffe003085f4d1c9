"""The server's receiving half of weight updates: HF safetensors from disk, or collective buckets.

Everything that touches parameters runs on the generator's model thread, between decode steps.
"""

from __future__ import annotations

import datetime
import logging
from pathlib import Path
from typing import Any

import torch

from areal_core.hf_engine.bucket import bucket_nbytes, unflatten_bucket
from areal_core.hf_engine.protocol import ReceiveWeightsBody, WeightGroupBody

log = logging.getLogger(__name__)


def check_load_path(path: str, allowed_root: Path) -> Path:
    """The resolved directory to load, or ValueError if it is outside ``allowed_root``.

    A component starting with "." (a writer's temporary directory) is refused too, so a
    half-written update can never be loaded.
    """
    root = allowed_root.resolve()
    target = Path(path).resolve()
    if not target.is_relative_to(root):
        raise ValueError(f"refusing to load {path!r}: it is outside the server's --allowed-root {str(root)!r}")
    hidden = [part for part in target.relative_to(root).parts if part.startswith(".")]
    if hidden:
        raise ValueError(f"refusing to load {path!r}: component {hidden[0]!r} starts with '.' (a temporary directory)")
    if not target.is_dir():
        raise ValueError(f"refusing to load {path!r}: not a directory")
    return target


def read_safetensors_dir(directory: Path) -> dict[str, torch.Tensor]:
    from safetensors.torch import load_file

    files = sorted(directory.glob("*.safetensors"))
    if not files:
        raise ValueError(f"no *.safetensors files in {str(directory)!r}; save the model with save_pretrained")
    state: dict[str, torch.Tensor] = {}
    for file in files:
        state.update(load_file(file))
    return state


def copy_into_model(model: Any, tensors: dict[str, torch.Tensor], *, complete: bool) -> None:
    """Copy named tensors into the model's parameters (and buffers), casting dtypes.

    ``complete`` requires every parameter to be present (a full checkpoint); names that are
    not the model's are an error either way. Tied parameters need to appear under one name.
    """
    targets = dict(model.named_parameters(remove_duplicate=False))
    targets.update(model.named_buffers())
    unknown = sorted(set(tensors) - set(targets))
    if unknown:
        raise ValueError(f"{len(unknown)} tensor(s) are not parameters of this model, e.g. {unknown[:3]}")
    if complete:
        loaded = {id(targets[name]) for name in tensors}
        missing = [name for name, p in model.named_parameters() if id(p) not in loaded]
        if missing:
            raise ValueError(f"{len(missing)} parameter(s) missing from the checkpoint, e.g. {missing[:3]}")
    for name, tensor in tensors.items():
        if tuple(tensor.shape) != tuple(targets[name].shape):
            expected = tuple(targets[name].shape)
            raise ValueError(f"{name}: shape {tuple(tensor.shape)} does not match the model's {expected}")
    with torch.no_grad():
        for name, tensor in tensors.items():
            targets[name].copy_(tensor)


class WeightGroup:
    """This server's membership in the trainer's broadcast group (trainer rank 0 sends)."""

    def __init__(self, body: WeightGroupBody, timeout_s: float) -> None:
        import torch.distributed as dist

        if body.backend != "gloo":
            raise ValueError(f"backend {body.backend!r} is not supported by the hf server; use 'gloo'")
        if not 0 < body.rank_offset < body.world_size:
            raise ValueError(f"rank_offset {body.rank_offset} must be in [1, world_size={body.world_size})")
        timeout = datetime.timedelta(seconds=timeout_s)
        store = dist.TCPStore(body.master_addr, body.master_port, body.world_size, is_master=False, timeout=timeout)
        self.rank = body.rank_offset
        prefixed = dist.PrefixStore(body.group_name, store)
        self.group = dist.ProcessGroupGloo(prefixed, self.rank, body.world_size, timeout)
        self.store = store  # the group keeps using it
        log.info("joined weight group %r as rank %d/%d", body.group_name, self.rank, body.world_size)

    def receive(self, body: ReceiveWeightsBody) -> dict[str, torch.Tensor]:
        """Receive one flat bucket broadcast from rank 0 and split it into named tensors."""
        if not len(body.names) == len(body.dtypes) == len(body.shapes):
            raise ValueError(
                f"names/dtypes/shapes lengths differ: {len(body.names)}/{len(body.dtypes)}/{len(body.shapes)}"
            )
        flat = torch.empty(bucket_nbytes(body.dtypes, body.shapes), dtype=torch.uint8)
        self.group.broadcast(flat, 0).wait()
        return dict(zip(body.names, unflatten_bucket(flat, body.dtypes, body.shapes)))
