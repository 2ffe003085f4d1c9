"""The worker half of ``areal_gloo`` (vLLM's ``WeightTransferEngine``), run inside each vLLM worker.

Created by vLLM's ``WeightTransferEngineFactory`` when the server is started with
``--weight-transfer-config '{"backend": "areal_gloo"}'``; registered there by
:func:`areal_engine_vllm.patch.register`. Each bucket is received on the worker's device and staged;
``finish_weight_update`` (the end of vLLM's session) seals the staged update and nothing touches the
model until :meth:`GlooWeightTransferEngine.commit`, phase two of our two-phase commit (the
``/areal/commit_weights`` route, called by the controller once every server staged). Until then the
old weights serve, and an update that fails half-way leaves them in place.

The receive buffers come in two sets, used alternately: the set the last commit loaded from is kept
as the copy :meth:`~GlooWeightTransferEngine.rollback` loads again, so a commit that another server
failed is undone without a copy per update. Their memory is touched once.
"""

from __future__ import annotations

import logging
from typing import Any

import torch
from vllm.distributed.weight_transfer.base import WeightTransferEngine

from areal_core.api.weight_channel import StagedDigest, bucket_nbytes, receive_bucket, unflatten_bucket
from areal_engine_vllm.gloo_common import (
    GlooWeightTransferInitInfo,
    GlooWeightTransferUpdateInfo,
    abort,
    join_group,
)
from areal_engine_vllm.worker_ext import reload_in_place

log = logging.getLogger(f"vllm.{__name__}")  # under "vllm", whose handlers write the server log


class GlooWeightTransferEngine(WeightTransferEngine[GlooWeightTransferInitInfo, GlooWeightTransferUpdateInfo]):
    """Receives flat buckets from trainer rank 0 into a staging area; loads them at :meth:`commit`."""

    init_info_cls = GlooWeightTransferInitInfo
    update_info_cls = GlooWeightTransferUpdateInfo
    supports_draft_weight_update = False

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._group: Any = None
        self._meta: Any = None  # vLLM's StatelessProcessGroup: holds the store the group uses
        self._slots: list[list[torch.Tensor]] = [[], []]  # two sets of receive buffers (bucket k -> buffer k)
        self._loaded: int | None = None  # the set the served weights were last loaded from (None: not from a set)
        self._kept: list[dict[str, torch.Tensor]] = [{}, {}]  # the update last committed from each set
        self._before: tuple[int | None] | None = None  # the set the last commit replaced, until a rollback
        self._staged: dict[str, torch.Tensor] = {}
        self._digest = StagedDigest()  # of the staged buckets' bytes, in order
        self._sealed: str | None = None  # the digest of a complete staged update (set at finish)

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
        """Drop whatever an abandoned update staged; the last commit is final now (this update
        receives into the set a rollback of it would load)."""
        self._drop_staged()
        self._before = None

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
            receive_bucket(self._group, flat, dtypes, shapes, self._digest)
            self._staged.update(zip(names, unflatten_bucket(flat, dtypes, shapes)))
            start += count

    def _receiving(self) -> int:
        """The buffer set this update is received into: never the one a rollback would load."""
        return 0 if self._loaded is None else 1 - self._loaded

    def _buffer(self, index: int, nbytes: int) -> torch.Tensor:
        buffers = self._slots[self._receiving()]
        while len(buffers) <= index:
            buffers.append(torch.empty(0, dtype=torch.uint8, device=self.device))
        if buffers[index].numel() != nbytes:
            buffers[index] = torch.empty(nbytes, dtype=torch.uint8, device=self.device)
        return buffers[index]

    def finish_weight_update(self) -> None:
        """The end of vLLM's session: seal what was staged (phase one); :meth:`commit` loads it."""
        if self._staged:
            self._sealed = self._digest.hexdigest()
            log.info("areal: staged %d tensors (digest %s)", len(self._staged), self._sealed[:12])

    def commit(self) -> str:
        """Phase two: load the sealed update into the model; returns its digest (equal on every
        server that received the same bytes). What it replaces is kept for :meth:`rollback`."""
        if self._sealed is None:
            raise ValueError("nothing to commit: no update was staged completely since the last commit")
        digest, staged = self._sealed, self._staged
        reload_in_place(self.vllm_config, self.model, staged.items())
        slot = self._receiving()
        self._kept[slot] = staged
        self._before, self._loaded = (self._loaded,), slot
        self._drop_staged()
        log.info("areal: committed %d staged tensors", len(staged))
        return digest

    def rollback(self) -> bool:
        """Load again what the last commit replaced, from the buffer set it came from; False when
        it did not come from one (the model's own files or a disk load: the caller reloads those)."""
        if self._before is None:
            raise ValueError("nothing to roll back: no commit since the last rollback")
        (previous,), self._before = self._before, None
        self._loaded = previous
        if previous is None:
            return False
        reload_in_place(self.vllm_config, self.model, self._kept[previous].items())
        return True

    def forget_kept(self) -> None:
        """The served weights changed another way (a disk load): the last commit cannot be undone."""
        self._before, self._loaded, self._kept = None, None, [{}, {}]

    def _drop_staged(self) -> None:
        self._staged, self._sealed, self._digest = {}, None, StagedDigest()

    def shutdown(self) -> None:
        if self._group is not None:
            abort(self._group)
        self._group = self._meta = None
        self._drop_staged()
