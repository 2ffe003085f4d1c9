"""The worker half of ``areal_gloo`` (vLLM's ``WeightTransferEngine``), run inside each vLLM worker.

Created by vLLM's ``WeightTransferEngineFactory`` when the server is started with
``--weight-transfer-config '{"backend": "areal_gloo"}'``; registered there by
:func:`areal_engine_vllm.patch.register`. Each bucket is received on the worker's device and staged;
nothing touches the model until ``finish_weight_update``, which loads every staged tensor at once
through vLLM's in-place reload (it copies them into the model's own storage). Until then the old
weights serve, and an update that fails half-way (the trainer aborts the group) leaves them in
place. The receive buffers are kept for the next update, so their memory is touched once.
"""

from __future__ import annotations

import logging
from typing import Any

import torch
from vllm.distributed.weight_transfer.base import WeightTransferEngine

from areal_core.api.weight_channel import bucket_nbytes, unflatten_bucket
from areal_engine_vllm.gloo_common import (
    GlooWeightTransferInitInfo,
    GlooWeightTransferUpdateInfo,
    abort,
    join_group,
)
from areal_engine_vllm.worker_ext import reload_in_place

log = logging.getLogger(f"vllm.{__name__}")  # under "vllm", whose handlers write the server log


class GlooWeightTransferEngine(WeightTransferEngine[GlooWeightTransferInitInfo, GlooWeightTransferUpdateInfo]):
    """Receives flat buckets from trainer rank 0 into a staging area; loads them at finish."""

    init_info_cls = GlooWeightTransferInitInfo
    update_info_cls = GlooWeightTransferUpdateInfo
    supports_draft_weight_update = False

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._group: Any = None
        self._meta: Any = None  # vLLM's StatelessProcessGroup: holds the store the group uses
        self._staged: dict[str, torch.Tensor] = {}
        self._buffers: list[torch.Tensor] = []  # bucket k is received into buffer k

    def init_transfer_engine(self, init_info: GlooWeightTransferInitInfo) -> None:
        """Join the trainer's group as ``rank_offset`` + this worker's rank across DP replicas (as vLLM's nccl)."""
        self.shutdown()
        parallel = self.parallel_config
        rank = parallel.data_parallel_index * parallel.world_size + parallel.rank + init_info.rank_offset
        self._group, self._meta = join_group(init_info, rank)
        log.info(
            "areal: %s joined weight group %r as rank %d/%d",
            type(self).__name__, init_info.group_name, rank, init_info.world_size,
        )  # fmt: skip

    def start_weight_update(self) -> None:
        """Drop whatever an abandoned update staged."""
        self._staged = {}

    def update_weights(self, update_info: dict[str, Any]) -> None:
        # the base class adds torch.accelerator.synchronize(), which has no CPU backend; each
        # broadcast's wait() already orders the received bytes before their use
        self.receive_weights(self.parse_update_info(update_info))

    def receive_weights(self, update_info: GlooWeightTransferUpdateInfo) -> None:
        if self._group is None:
            raise RuntimeError("areal_gloo: no weight group; call init_weight_transfer_engine first")
        info, start = update_info, 0
        for index, count in enumerate(info.bucket_sizes):
            names = info.names[start : start + count]
            dtypes, shapes = info.dtype_names[start : start + count], info.shapes[start : start + count]
            flat = self._buffer(index, bucket_nbytes(dtypes, shapes))
            self._group.broadcast(flat, 0).wait()
            self._staged.update(zip(names, unflatten_bucket(flat, dtypes, shapes)))
            start += count

    def _buffer(self, index: int, nbytes: int) -> torch.Tensor:
        while len(self._buffers) <= index:
            self._buffers.append(torch.empty(0, dtype=torch.uint8, device=self.device))
        if self._buffers[index].numel() != nbytes:
            self._buffers[index] = torch.empty(nbytes, dtype=torch.uint8, device=self.device)
        return self._buffers[index]

    def finish_weight_update(self) -> None:
        staged, self._staged = self._staged, {}
        if staged:
            reload_in_place(self.vllm_config, self.model, staged.items())
            log.info("areal: loaded %d staged tensors", len(staged))

    def shutdown(self) -> None:
        if self._group is not None:
            abort(self._group)
        self._group = self._meta = None
        self._staged, self._buffers = {}, []
