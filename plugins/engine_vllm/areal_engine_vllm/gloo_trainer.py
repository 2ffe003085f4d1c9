"""The trainer half of ``areal_gloo`` (vLLM's ``TrainerWeightTransferEngine``), run in trainer processes.

Built by vLLM's ``WeightTransferTrainerFactory.trainer_init`` like vLLM's own nccl trainer engine:
rank 0 hosts the rendezvous and drives the servers through the ``VLLMWeightSyncClient`` it is given
(init, then per update start -> update -> finish); every rank iterates the ``WeightSource`` (a
collective: FSDP gathers), only rank 0 sends, in place (large tensors straight from its memory,
runs of small ones packed), bucket ``k + 1`` queued while bucket ``k`` is on the wire
(``areal_core.api.weight_channel.BucketBroadcast``, the other flat-bucket channels' send loop). A
server that refuses the update aborts the group, so rank 0 fails at once instead of at the
group's timeout.
"""

from __future__ import annotations

import dataclasses
from concurrent.futures import Future, ThreadPoolExecutor
from typing import TYPE_CHECKING, Any

import torch
from vllm.distributed.weight_transfer.base import (
    TrainerWeightTransferEngine,
    VLLMWeightSyncClient,
    WeightSource,
)

from areal_core.api.weight_channel import BucketBroadcast, plan_buckets
from areal_engine_vllm.gloo_common import (
    GlooTrainerInitInfo,
    GlooWeightTransferInitInfo,
    GlooWeightTransferUpdateInfo,
    abort,
    join_group,
)

if TYPE_CHECKING:
    from typing_extensions import Self  # typing.Self needs Python 3.11


class GlooTrainerWeightTransferEngine(TrainerWeightTransferEngine[GlooTrainerInitInfo]):
    init_info_cls = GlooTrainerInitInfo

    def __init__(self, *, client: VLLMWeightSyncClient, source: WeightSource, info: GlooTrainerInitInfo) -> None:
        super().__init__(client=client, source=source, is_sender=info.is_sender)
        self.info = info
        self._group: Any = None
        self._meta: Any = None  # vLLM's StatelessProcessGroup: hosts the store the group uses
        self._broadcast = BucketBroadcast(torch.device("cpu"), packed=False)  # the worker: receive_bucket

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
            engine._group, engine._meta = join_group(init_info, 0)
            joined.result()
        return engine

    def send_weights(self) -> None:
        assert self.source is not None
        meta = self.source.metadata()
        if not self.is_sender:
            for _ in self.source:  # stay in the trainer ranks' gathers
                pass
            return
        if self._group is None:
            raise RuntimeError("areal_gloo: send_weights after shutdown; call trainer_init again")
        specs = [(m.name, str(m.dtype).removeprefix("torch."), m.shape) for m in meta]
        buckets = plan_buckets(specs, self.info.bucket_bytes)
        update = GlooWeightTransferUpdateInfo(
            names=[s[0] for s in specs], dtype_names=[s[1] for s in specs], shapes=[list(s[2]) for s in specs],
            bucket_sizes=[len(b.names) for b in buckets],
        )  # fmt: skip
        self.client.start_weight_update()
        pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="areal-gloo-update")
        try:  # the workers receive inside update_weights while rank 0 broadcasts
            received = pool.submit(self.client.update_weights, dataclasses.asdict(update))
            received.add_done_callback(self._abort_if_failed)
            try:
                self._broadcast.run(self._group, iter(self.source), buckets)
            except BaseException as exc:
                # a server's refusal says more than the aborted broadcast it caused
                refused = received.exception() if self._broadcast.sending and received.done() else None
                raise (refused or exc) from None
            received.result()
        finally:  # never wait for a worker stuck in a broadcast that will not come
            pool.shutdown(wait=False)
        self.client.finish_weight_update()

    def _abort_if_failed(self, received: Future) -> None:
        if received.exception() is not None and self._group is not None:
            abort(self._group)

    def shutdown(self) -> None:
        if self._group is not None:
            abort(self._group)
        self._group = self._meta = None
