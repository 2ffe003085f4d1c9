"""Stateless process groups over a c10d backend that a device extension registered.

The xccl weight-update group is built with ``torch.distributed._dist2`` factories (its own store,
never the training group). torch ships factories for gloo and nccl only; torch_npu registers
``hccl`` with ``torch.distributed.Backend.register_backend``. :func:`register_stateless_backend`
bridges the two: the factory calls the registered creator (plain or extended API) and wraps the
backend in a ``ProcessGroup`` bound to the group's device.
"""

from __future__ import annotations

import datetime
from typing import Any


def plugin_backend_factory(backend: str) -> Any:
    """A ``_dist2`` process-group factory for the c10d plugin backend ``backend``."""

    def factory(
        store: Any, rank: int, world_size: int, timeout: datetime.timedelta, device: Any, **kwargs: object
    ) -> Any:
        import torch.distributed as dist
        from torch.distributed import ProcessGroup

        plugin = dist.Backend._plugins.get(backend.upper())
        if plugin is None:
            raise RuntimeError(f"no c10d backend {backend!r} is registered in this process")
        if kwargs:
            raise TypeError(f"backend {backend!r} takes no options here, got {sorted(kwargs)}")
        if plugin.extended_api:
            from torch._C._distributed_c10d import _DistributedBackendOptions

            opts = _DistributedBackendOptions()
            opts.store, opts.group_rank, opts.group_size, opts.timeout = store, rank, world_size, timeout
            opts.group_id = f"areal_stateless_{backend}"
            opts.global_ranks_in_group = list(range(world_size))
            impl = plugin.creator_fn(opts, None)
        else:
            impl = plugin.creator_fn(store, rank, world_size, timeout)
        if isinstance(impl, ProcessGroup):
            return impl
        group = ProcessGroup(store, rank, world_size)
        group._set_default_backend(ProcessGroup.BackendType.CUSTOM)
        group._register_backend(device, ProcessGroup.BackendType.CUSTOM, impl)
        return group

    return factory


def register_stateless_backend(backend: str) -> None:
    """Make ``backend`` usable by ``_dist2`` factories (idempotent; gloo/nccl are built in)."""
    from torch.distributed import _dist2

    if backend not in _dist2._BACKENDS:
        _dist2.register_backend(backend, plugin_backend_factory(backend))
