"""The server end of SGLang 0.5.23's weight group, for FakeSGLangServer and the handshake test.

Where ``sglang`` imports (``AREAL_SGLANG_PYTHON`` names such a Python in CI), :data:`init_custom_process_group`
and :data:`FlattenedTensorBucket` are SGLang's own (``sglang.srt.utils.common`` and
``sglang.srt.weight_sync.tensor_bucket``), so a trainer that joins or packs differently fails
here as it would against a real server. Elsewhere they are FAKEs written from those sources
(the same torch calls, the same checks), named so: ``FAKE_init_custom_process_group`` and
``FakeFlattenedTensorBucket``. :data:`SOURCE` says which ones this process uses.

:func:`join` and :func:`receive_flattened_bucket` are what SGLang's model-runner ``WeightUpdater``
does with them (``init_weights_update_group``, ``_receive_bucketed_weights_from_distributed``).
"""

from __future__ import annotations

import math
from typing import Any

import torch


def FAKE_init_custom_process_group(
    backend: str | None = None,
    init_method: str | None = None,
    timeout: Any = None,
    world_size: int = -1,
    rank: int = -1,
    group_name: str | None = None,
) -> Any:
    """FAKE of ``sglang.srt.utils.common.init_custom_process_group`` (for the ``init_method`` form
    SGLang's weight updater uses): rendezvous, a ``group_name`` prefix, torch's group helper."""
    from torch.distributed import distributed_c10d as c10d

    timeout = c10d.default_pg_timeout if timeout is None else timeout
    store, rank, world_size = next(c10d.rendezvous(init_method, rank, world_size, timeout=timeout))
    store.set_timeout(timeout)
    pg, _ = c10d._new_process_group_helper(
        world_size,
        rank,
        [],
        c10d.Backend(backend) if backend else c10d.Backend("undefined"),
        c10d.PrefixStore(group_name, store),
        group_name=group_name,
        backend_options=None,
        timeout=timeout,
        device_id=None,
    )
    c10d._world.pg_group_ranks[pg] = {i: i for i in range(world_size)}
    return pg


class FakeFlattenedTensorBucket:
    """FAKE of ``sglang.srt.weight_sync.tensor_bucket.FlattenedTensorBucket``'s receiving half."""

    def __init__(self, flattened_tensor: torch.Tensor, metadata: list[tuple[str, torch.Size, torch.dtype, int]]):
        self.flattened_tensor = flattened_tensor
        self.metadata = metadata  # (name, shape, dtype, start byte)

    @classmethod
    def empty(cls, names: list[str], dtypes: list[Any], shapes: list[Any], device: Any) -> FakeFlattenedTensorBucket:
        metadata, offset = [], 0
        for name, dtype, shape in zip(names, dtypes, shapes, strict=True):
            dtype = dtype if isinstance(dtype, torch.dtype) else getattr(torch, dtype)
            shape = torch.Size(shape)
            if any(dim < 0 for dim in shape):
                raise ValueError(f"Negative dimension in received tensor {name}: {shape}")
            if offset % dtype.itemsize:
                raise ValueError(f"Unaligned received tensor {name}: byte offset {offset}, dtype {dtype}")
            metadata.append((name, shape, dtype, offset))
            offset += math.prod(shape) * dtype.itemsize
        if not metadata:
            raise ValueError("Cannot create empty tensor bucket")
        return cls(torch.empty(offset, dtype=torch.uint8, device=device), metadata)

    def get_flattened_tensor(self) -> torch.Tensor:
        return self.flattened_tensor

    def reconstruct_tensors(self) -> list[tuple[str, torch.Tensor]]:
        flat = self.flattened_tensor
        return [
            (name, flat[start : start + shape.numel() * dtype.itemsize].view(dtype).reshape(shape))
            for name, shape, dtype, start in self.metadata
        ]


try:
    from sglang.srt.utils.common import init_custom_process_group
    from sglang.srt.weight_sync.tensor_bucket import FlattenedTensorBucket
    from sglang.version import __version__ as _sglang_version

    SOURCE = f"sglang {_sglang_version}'s own init_custom_process_group and FlattenedTensorBucket"
except ImportError as _exc:  # no sglang, or one that does not import here (it needs triton)
    init_custom_process_group = FAKE_init_custom_process_group
    FlattenedTensorBucket = FakeFlattenedTensorBucket
    SOURCE = f"FAKE_init_custom_process_group and FakeFlattenedTensorBucket (sglang does not import: {_exc})"


def join(master_address: str, master_port: int, rank: int, world_size: int, group_name: str, backend: str) -> Any:
    """``WeightUpdater.init_weights_update_group``'s call (tp rank 0: ``rank`` is ``rank_offset``)."""
    return init_custom_process_group(
        backend=backend,
        init_method=f"tcp://{master_address}:{master_port}",
        world_size=world_size,
        rank=rank,
        group_name=group_name,
    )


def receive_flattened_bucket(
    group: Any, names: list[str], dtypes: list[str], shapes: list[list[int]]
) -> list[tuple[str, torch.Tensor]]:
    """One ``flattened_bucket`` broadcast from rank 0, split as SGLang splits it."""
    bucket = FlattenedTensorBucket.empty(names, dtypes, shapes, "cpu")
    torch.distributed.broadcast(bucket.get_flattened_tensor(), src=0, group=group)
    return bucket.reconstruct_tensors()


def main(argv: list[str] | None = None) -> None:
    """``python sglang_weight_group.py PORT RANK WORLD_SIZE GROUP BUCKETS_JSON``: print :data:`SOURCE`,
    join as ``RANK`` (backend gloo), receive each bucket (``[[names], [dtypes], [shapes]]``) and print
    one JSON line per bucket: ``{name: sha256 of its bytes}``; then destroy the group."""
    import hashlib
    import json
    import sys

    port, rank, world_size, group_name, buckets = (sys.argv[1:] if argv is None else argv)[:5]
    print(f"SOURCE {SOURCE}", flush=True)
    group = join("127.0.0.1", int(port), int(rank), int(world_size), group_name, "gloo")
    for names, dtypes, shapes in json.loads(buckets):
        tensors = receive_flattened_bucket(group, names, dtypes, shapes)
        raw = {name: t.contiguous().view(-1).view(torch.uint8).numpy().tobytes() for name, t in tensors}
        print(json.dumps({name: hashlib.sha256(b).hexdigest() for name, b in raw.items()}), flush=True)
    torch.distributed.destroy_process_group(group)


if __name__ == "__main__":
    main()
