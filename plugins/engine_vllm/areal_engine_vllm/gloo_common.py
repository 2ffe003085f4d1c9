"""``areal_gloo``: our vLLM weight-transfer backend for CPU, shared by its worker and trainer halves.

vLLM 0.32 ships weight transfer as a pair of engines per backend, one in each of two factories
(``WeightTransferEngineFactory`` in the inference workers, ``WeightTransferTrainerFactory`` in the
trainer). Its ``nccl`` pair needs CUDA; ``areal_gloo`` is the same shape over gloo, so CPU runs take
the same path as a GPU with only the backend name changed. The group is built the way vLLM's
``nccl_common`` builds its own: vLLM's ``StatelessProcessGroup`` (a TCPStore hosted by the trainer,
rank 0) for the rendezvous, then the data plane on its store, here torch's public
``ProcessGroupGloo`` instead of ``PyNcclCommunicator``.

Wire format: each update is one ``update_weights`` call carrying every tensor's name, dtype and
shape plus how many tensors each bucket holds; the trainer then broadcasts the tensors' bytes (a
large tensor alone, a run of small ones together: ``wire_runs``), which the worker receives in
place into one flat uint8 buffer per bucket (``areal_core.api.weight_channel.receive_bucket``;
``flatten_bucket``'s layout).
"""

from __future__ import annotations

import dataclasses
import datetime
from typing import Any, ClassVar

from vllm.distributed.weight_transfer.base import TrainerInitInfo, WeightTransferInitInfo, WeightTransferUpdateInfo

#: The backend name, in both vLLM factories and in ``--weight-transfer-config``.
BACKEND = "areal_gloo"
_WORKER = ("areal_engine_vllm.gloo_worker", "GlooWeightTransferEngine")
_TRAINER = ("areal_engine_vllm.gloo_trainer", "GlooTrainerWeightTransferEngine")


@dataclasses.dataclass
class GlooTrainerInitInfo(TrainerInitInfo):
    """Trainer side: the rendezvous this trainer rank 0 hosts and the group it forms there."""

    backend: ClassVar[str] = BACKEND

    master_address: str
    master_port: int
    world_size: int
    group_name: str = "areal_weights"
    bucket_bytes: int = 64 << 20
    timeout_s: float = 300.0


@dataclasses.dataclass(kw_only=True)
class GlooWeightTransferInitInfo(WeightTransferInitInfo):
    """Worker side: a worker joins as ``rank_offset`` + its rank across data-parallel replicas."""

    master_address: str
    master_port: int
    rank_offset: int
    world_size: int
    group_name: str
    timeout_s: float = 300.0


@dataclasses.dataclass
class GlooWeightTransferUpdateInfo(WeightTransferUpdateInfo):
    """One update: every tensor in send order; bucket ``k`` holds the next ``bucket_sizes[k]`` of them."""

    names: list[str]
    dtype_names: list[str]
    shapes: list[list[int]]
    bucket_sizes: list[int]

    def __post_init__(self) -> None:
        n = len(self.names)
        if len(self.dtype_names) != n or len(self.shapes) != n or sum(self.bucket_sizes) != n:
            raise ValueError(
                f"update info describes {n} names, {len(self.dtype_names)} dtypes, {len(self.shapes)} shapes "
                f"and buckets of {sum(self.bucket_sizes)} tensors; all four must agree"
            )


def join_group(info: GlooWeightTransferInitInfo | GlooTrainerInitInfo, rank: int) -> tuple[Any, Any]:
    """Join the weight group as ``rank`` (rank 0 hosts the rendezvous); returns ``(group, metadata
    group)``: a ``ProcessGroupGloo`` and the vLLM ``StatelessProcessGroup`` whose store it uses."""
    import torch.distributed as dist
    from vllm.distributed.utils import StatelessProcessGroup

    if not 0 <= rank < info.world_size:
        raise ValueError(f"rank {rank} must be in [0, world_size={info.world_size})")
    meta = StatelessProcessGroup.create(
        host=info.master_address,
        port=info.master_port,
        rank=rank,
        world_size=info.world_size,
        store_timeout=max(1, int(info.timeout_s)),
    )
    timeout = datetime.timedelta(seconds=info.timeout_s)
    group = dist.ProcessGroupGloo(dist.PrefixStore(info.group_name, meta.store), rank, info.world_size, timeout)
    return group, meta


def abort(group: Any) -> None:
    """Abort ``group``: a peer blocked in a collective on it fails now instead of timing out."""
    try:
        group.abort()
    except RuntimeError:  # already broken: nothing to release
        pass


def register_backend() -> None:
    """Register ``areal_gloo`` in both vLLM factories (module paths: nothing is imported yet). Idempotent."""
    from vllm.distributed.weight_transfer.factory import WeightTransferEngineFactory, WeightTransferTrainerFactory

    for factory, (module, cls) in ((WeightTransferEngineFactory, _WORKER), (WeightTransferTrainerFactory, _TRAINER)):
        try:
            factory.register_engine(BACKEND, module, cls)
        except ValueError:  # registered already (vLLM loads general plugins in every process)
            pass
