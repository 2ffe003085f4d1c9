"""``areal_gloo``: a vLLM weight-transfer backend that receives flat buckets over a gloo group.

Registered with vLLM's ``WeightTransferEngineFactory`` by :mod:`areal_engine_vllm.patch` and
selected with ``--weight-transfer-config '{"backend": "areal_gloo"}'``. The trainer (rank 0)
broadcasts ``areal_core.hf_engine.bucket.flatten_bucket(tensors)``; each bucket is staged in
host memory and nothing touches the model until ``finish_weight_update`` (our commit), which
loads every staged tensor at once. Until then the old weights keep serving.
"""

from __future__ import annotations

import dataclasses
import datetime
import logging
from typing import Any

import torch
from vllm.distributed.weight_transfer.base import WeightTransferEngine, WeightTransferInitInfo, WeightTransferUpdateInfo

from areal_core.hf_engine.bucket import bucket_nbytes, unflatten_bucket
from areal_engine_vllm.worker_ext import reload_in_place

log = logging.getLogger(f"vllm.{__name__}")  # under "vllm", whose handlers write the server log


@dataclasses.dataclass
class GlooInitInfo(WeightTransferInitInfo):
    master_addr: str
    master_port: int
    rank: int
    world_size: int
    group_name: str
    timeout_s: float = 300.0


@dataclasses.dataclass
class GlooUpdateInfo(WeightTransferUpdateInfo):
    names: list[str]
    dtypes: list[str]
    shapes: list[list[int]]
    version: int


class GlooWeightTransferEngine(WeightTransferEngine[GlooInitInfo, GlooUpdateInfo]):
    """Receives buckets from trainer rank 0 into a staging area; applies them on finish."""

    init_info_cls = GlooInitInfo
    update_info_cls = GlooUpdateInfo
    supports_draft_weight_update = False

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._group: Any = None
        self._store: Any = None
        self._staged: dict[str, torch.Tensor] = {}
        self._staged_version: int | None = None

    def init_transfer_engine(self, init_info: GlooInitInfo) -> None:
        import torch.distributed as dist

        if not 0 < init_info.rank < init_info.world_size:
            raise ValueError(f"rank {init_info.rank} must be in [1, world_size={init_info.world_size})")
        timeout = datetime.timedelta(seconds=init_info.timeout_s)
        store = dist.TCPStore(
            init_info.master_addr, init_info.master_port, init_info.world_size, is_master=False, timeout=timeout
        )
        prefixed = dist.PrefixStore(init_info.group_name, store)
        self._group = dist.ProcessGroupGloo(prefixed, init_info.rank, init_info.world_size, timeout)
        self._store = store  # the group keeps using it
        log.info("joined weight group %r as rank %d/%d", init_info.group_name, init_info.rank, init_info.world_size)

    def start_weight_update(self) -> None:
        """Nothing to prepare: buckets are staged off-model."""

    def update_weights(self, update_info: dict[str, Any]) -> None:
        # the base class would call torch.accelerator.synchronize(), which has no CPU backend
        self.receive_weights(self.parse_update_info(update_info))

    def receive_weights(self, update_info: GlooUpdateInfo) -> None:
        if self._group is None:
            raise RuntimeError("no weight group: call /areal/init_weight_group first")
        info = update_info
        if not len(info.names) == len(info.dtypes) == len(info.shapes):
            lengths = f"{len(info.names)}/{len(info.dtypes)}/{len(info.shapes)}"
            raise ValueError(f"names/dtypes/shapes lengths differ: {lengths}")
        if self._staged_version != info.version:  # leftovers of an abandoned update
            self._staged, self._staged_version = {}, info.version
        flat = torch.empty(bucket_nbytes(info.dtypes, info.shapes), dtype=torch.uint8)
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
