"""The weight-update group: a process group of its own (never the training group).

Trainer rank 0 and every inference worker join it through a TCPStore rendezvous hosted by the
weight updater. The backend (gloo, nccl, hccl, ...) comes from the platform and is built by
torch's stateless process-group factories (``torch.distributed._dist2``); a platform whose
backend torch does not ship registers a factory in ``Platform.init_process`` (see
``areal_platform_npu.stateless``).
"""

from __future__ import annotations

import datetime
from typing import Any


def join_weight_group(
    *,
    backend: str,
    master_addr: str,
    master_port: int,
    group_name: str,
    rank: int,
    world_size: int,
    timeout_s: float,
    device: Any,
) -> tuple[Any, Any]:
    """Join group ``group_name`` as ``rank``; returns ``(group, store)`` (keep the store alive).

    Blocks until all ``world_size`` members have joined or ``timeout_s`` passes.
    """
    import torch.distributed as dist
    from torch.distributed import _dist2

    factory = _dist2._BACKENDS.get(backend)
    if factory is None:
        raise ValueError(
            f"backend {backend!r} has no stateless process-group factory in this process "
            f"(registered: {', '.join(sorted(_dist2._BACKENDS))}); the platform plugin must register one "
            "with torch.distributed._dist2.register_backend in init_process()"
        )
    if not 0 <= rank < world_size:
        raise ValueError(f"rank {rank} must be in [0, world_size={world_size})")
    timeout = datetime.timedelta(seconds=timeout_s)
    store = dist.TCPStore(master_addr, master_port, world_size, is_master=False, timeout=timeout)
    group = factory(dist.PrefixStore(group_name, store), rank, world_size, timeout, device)
    return group, store
