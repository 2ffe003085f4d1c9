"""``areal_collective``: a vLLM weight-transfer backend that receives flat buckets over the
trainer's weight-update group (gloo on CPU, nccl on CUDA, hccl on Ascend: the backend the
trainer's platform chose, named in the join request).

Registered with vLLM's ``WeightTransferEngineFactory`` by :mod:`areal_engine_vllm.patch` and
selected with ``--weight-transfer-config '{"backend": "areal_collective"}'``. The trainer (rank 0)
broadcasts ``areal_core.hf_engine.bucket.flatten_bucket(tensors)``; each bucket is received on
the worker's device and staged, and nothing touches the model until ``finish_weight_update``
(our commit), which loads every staged tensor at once. Until then the old weights keep serving.
"""

from __future__ import annotations

import dataclasses
import logging
from typing import Any

import torch
from vllm.distributed.weight_transfer.base import WeightTransferEngine, WeightTransferInitInfo, WeightTransferUpdateInfo

from areal_core.hf_engine.bucket import bucket_nbytes, unflatten_bucket
from areal_engine_vllm.worker_ext import reload_in_place

log = logging.getLogger(f"vllm.{__name__}")  # under "vllm", whose handlers write the server log


@dataclasses.dataclass
class GroupInitInfo(WeightTransferInitInfo):
    master_addr: str
    master_port: int
    rank: int
    world_size: int
    group_name: str
    backend: str = "gloo"
    timeout_s: float = 300.0


@dataclasses.dataclass
class BucketUpdateInfo(WeightTransferUpdateInfo):
    names: list[str]
    dtypes: list[str]
    shapes: list[list[int]]
    version: int


class CollectiveWeightTransferEngine(WeightTransferEngine[GroupInitInfo, BucketUpdateInfo]):
    """Receives buckets from trainer rank 0 into a staging area; applies them on finish."""

    init_info_cls = GroupInitInfo
    update_info_cls = BucketUpdateInfo
    supports_draft_weight_update = False

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._group: Any = None
        self._store: Any = None
        self._staged: dict[str, torch.Tensor] = {}
        self._staged_version: int | None = None

    def init_transfer_engine(self, init_info: GroupInitInfo) -> None:
        from areal_core.collective import join_weight_group

        if not 0 < init_info.rank < init_info.world_size:
            raise ValueError(f"rank {init_info.rank} must be in [1, world_size={init_info.world_size})")
        _activate_areal_platform()  # registers the platform's backend factory (e.g. hccl)
        self._group, self._store = join_weight_group(
            backend=init_info.backend,
            master_addr=init_info.master_addr,
            master_port=init_info.master_port,
            group_name=init_info.group_name,
            rank=init_info.rank,
            world_size=init_info.world_size,
            timeout_s=init_info.timeout_s,
            device=self.device,
        )
        log.info(
            "joined weight group %r as rank %d/%d over %s",
            init_info.group_name, init_info.rank, init_info.world_size, init_info.backend,
        )

    def start_weight_update(self) -> None:
        """Nothing to prepare: buckets are staged off-model."""

    def update_weights(self, update_info: dict[str, Any]) -> None:
        # the base class would call torch.accelerator.synchronize(), which has no CPU backend;
        # the broadcast's wait() already orders the received bytes before their use
        self.receive_weights(self.parse_update_info(update_info))

    def receive_weights(self, update_info: BucketUpdateInfo) -> None:
        if self._group is None:
            raise RuntimeError("no weight group: call /areal/init_weight_group first")
        info = update_info
        if not len(info.names) == len(info.dtypes) == len(info.shapes):
            lengths = f"{len(info.names)}/{len(info.dtypes)}/{len(info.shapes)}"
            raise ValueError(f"names/dtypes/shapes lengths differ: {lengths}")
        if self._staged_version != info.version:  # leftovers of an abandoned update
            self._staged, self._staged_version = {}, info.version
        flat = torch.empty(bucket_nbytes(info.dtypes, info.shapes), dtype=torch.uint8, device=self.device)
        self._group.broadcast(flat, 0).wait()
        self._staged.update(zip(info.names, unflatten_bucket(flat, info.dtypes, info.shapes)))

    def finish_weight_update(self) -> None:
        staged, self._staged, self._staged_version = self._staged, {}, None
        if staged:
            reload_in_place(self.vllm_config, self.model, staged.items())
            log.info("committed %d staged tensors", len(staged))

    def shutdown(self) -> None:
        self._group = self._store = None
        self._staged, self._staged_version = {}, None


def _activate_areal_platform() -> None:
    """Make the controller's platform (inherited through ``AREAL_ACTIVE_PLATFORM``) active here,
    so its ``init_process`` registers any backend factory torch does not ship."""
    from areal_core.platform import current_platform

    current_platform()
