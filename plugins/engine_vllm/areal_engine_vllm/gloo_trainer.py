"""The trainer half of ``areal_gloo`` (vLLM's ``TrainerWeightTransferEngine``), run in trainer processes.

Built by vLLM's ``WeightTransferTrainerFactory.trainer_init`` like vLLM's own nccl trainer engine:
rank 0 hosts the rendezvous and drives the servers through the ``VLLMWeightSyncClient`` it is given
(init, then per update start -> update -> finish); every rank iterates the ``WeightSource`` (a
collective: FSDP gathers), only rank 0 sends. Each bucket is packed into one of two alternating
buffers while the previous one is on the wire.
"""

from __future__ import annotations

import dataclasses
import math
from concurrent.futures import ThreadPoolExecutor
from typing import Any, Self

import torch
from vllm.distributed.weight_transfer.base import (
    ParamMeta,
    TrainerWeightTransferEngine,
    VLLMWeightSyncClient,
    WeightSource,
)

from areal_engine_vllm.gloo_common import (
    GlooTrainerInitInfo,
    GlooWeightTransferInitInfo,
    GlooWeightTransferUpdateInfo,
    abort,
    join_group,
)


class GlooTrainerWeightTransferEngine(TrainerWeightTransferEngine[GlooTrainerInitInfo]):
    init_info_cls = GlooTrainerInitInfo

    def __init__(self, *, client: VLLMWeightSyncClient, source: WeightSource, info: GlooTrainerInitInfo) -> None:
        super().__init__(client=client, source=source, is_sender=info.is_sender)
        self.info = info
        self._group: Any = None
        self._meta: Any = None  # vLLM's StatelessProcessGroup: hosts the store the group uses
        self._buffers: list[torch.Tensor] = []

    @classmethod
    def trainer_init(
        cls, init_info: GlooTrainerInitInfo, *, client: VLLMWeightSyncClient, source: WeightSource | None = None
    ) -> Self:
        if source is None:
            raise ValueError("areal_gloo trainer weight transfer requires a WeightSource")
        engine = cls(client=client, source=source, info=init_info)
        if not engine.is_sender:
            return engine
        worker_info = GlooWeightTransferInitInfo(
            master_address=init_info.master_address,
            master_port=init_info.master_port,
            rank_offset=1,
            world_size=init_info.world_size,
            group_name=init_info.group_name,
            timeout_s=init_info.timeout_s,
        )
        # the workers block in init_weight_transfer_engine until rank 0 joins: both at once
        with ThreadPoolExecutor(max_workers=1, thread_name_prefix="areal-gloo-init") as pool:
            joined = pool.submit(client.init_weight_transfer_engine, dataclasses.asdict(worker_info))
            try:
                engine._group, engine._meta = join_group(init_info, 0)
            except BaseException:
                joined.cancel()
                raise
            joined.result()
        return engine

    def send_weights(self) -> None:
        assert self.source is not None
        meta = self.source.metadata()
        if not self.is_sender:
            for _ in self.source:  # stay in the trainer ranks' gathers
                pass
            return
        buckets = _plan(meta, self.info.bucket_bytes)
        update = GlooWeightTransferUpdateInfo(
            names=[m.name for m in meta],
            dtype_names=[str(m.dtype).removeprefix("torch.") for m in meta],
            shapes=[list(m.shape) for m in meta],
            bucket_sizes=buckets,
        )
        self.client.start_weight_update()
        pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="areal-gloo-update")
        try:  # the workers receive inside update_weights while rank 0 broadcasts
            received = pool.submit(self.client.update_weights, dataclasses.asdict(update))
            self._broadcast(meta, buckets)
            received.result()
        finally:  # never wait for a worker stuck in a broadcast that will not come
            pool.shutdown(wait=False)
        self.client.finish_weight_update()

    def _broadcast(self, meta: list[ParamMeta], buckets: list[int]) -> None:
        assert self.source is not None and self._group is not None
        pairs, start = iter(self.source), 0
        pending: Any = None
        for index, count in enumerate(buckets):
            tensors = []
            for expected in meta[start : start + count]:
                name, tensor = next(pairs)
                if (name, tensor.dtype, tuple(tensor.shape)) != (expected.name, expected.dtype, expected.shape):
                    raise ValueError(
                        f"the weight source yielded {name!r} {tensor.dtype} {tuple(tensor.shape)} where its specs "
                        f"declared {expected.name!r} {expected.dtype} {expected.shape}"
                    )
                tensors.append(tensor)
            flat = self._pack(tensors, index % 2)
            if pending is not None:
                pending.wait()
            pending = self._group.broadcast(flat, 0)
            start += count
        if pending is not None:
            pending.wait()
        extra = next(pairs, None)
        if extra is not None:
            raise ValueError(f"the weight source yielded {extra[0]!r} beyond the {len(meta)} tensors its specs declared")

    def _pack(self, tensors: list[torch.Tensor], slot: int) -> torch.Tensor:
        """The tensors' bytes back to back in send buffer ``slot`` (kept across updates)."""
        nbytes = sum(t.numel() * t.element_size() for t in tensors)
        while len(self._buffers) <= slot:
            self._buffers.append(torch.empty(0, dtype=torch.uint8))
        if self._buffers[slot].numel() < nbytes:
            self._buffers[slot] = torch.empty(nbytes, dtype=torch.uint8)
        flat, offset = self._buffers[slot][:nbytes], 0
        for t in tensors:
            n = t.numel() * t.element_size()
            flat[offset : offset + n].copy_(t.detach().contiguous().view(-1).view(torch.uint8))
            offset += n
        return flat

    def shutdown(self) -> None:
        if self._group is not None:
            abort(self._group)
        self._group = self._meta = None


def _plan(meta: list[ParamMeta], bucket_bytes: int) -> list[int]:
    """How many tensors each bucket holds: runs of at most ``bucket_bytes`` (a larger tensor alone)."""
    from areal_reshard_xccl.updater import plan_buckets  # TODO(core): areal_core.weight_channel.plan_buckets

    sizes = [math.prod(m.shape) * m.dtype.itemsize for m in meta]
    return [len(run) for run in plan_buckets(sizes, bucket_bytes)]
