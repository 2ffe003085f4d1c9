"""The vllm engine's weight channel (trainer half): vLLM's own trainer-side weight-transfer engine.

Every training rank builds the backend's ``TrainerInitInfo`` and calls vLLM's
``WeightTransferTrainerFactory.trainer_init`` with our client (:class:`ServersSyncClient`: every
server's bearer-token routes at once) and our weights (a vLLM ``WeightSource`` over the trainer's
:class:`~areal_core.api.weight_channel.TensorSource`); each ``send`` is the engine's ``send_weights``
(start -> update -> finish on every server), ``leave`` its ``shutdown``. The backend is the
platform's (``ChannelSpec.backend``, set by ``VLLMEngine.weight_channel``): vLLM's ``nccl`` on CUDA,
vllm-ascend's ``hccl`` on Ascend, our ``areal_gloo`` on CPU (:mod:`areal_engine_vllm.gloo_common`),
so a CPU run takes the path a GPU takes with only the backend name changed.
"""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Iterator
from typing import Any

import torch
from vllm.distributed.weight_transfer.base import (
    ParamMeta,
    TrainerInitInfo,
    TrainerWeightTransferEngine,
    WeightSource,
)

from areal_core.api.errors import ArealError, PluginError
from areal_core.api.weight_channel import ChannelSpec, TensorSource, WeightChannel, parse_dtype
from areal_engine_vllm.sync_client import ServersSyncClient
from areal_engine_vllm.vllm_internals import internal

log = logging.getLogger(__name__)
_LEAVE_TIMEOUT_S = 10.0  # servers release their end on leave; a stuck one must not hold the trainer


class VLLMWeightChannel(WeightChannel):
    """vLLM's trainer engine for ``spec.backend``, driving every server in ``spec.servers``."""

    def __init__(self, spec: ChannelSpec, *, rank: int, device: torch.device) -> None:
        super().__init__(spec, rank=rank, device=device)
        self.client = ServersSyncClient(spec.servers, spec.token, spec.ranks_per_server, spec.timeout_s)
        self.source = _Weights()
        self.engine: TrainerWeightTransferEngine | None = None  # built by vLLM's factory on join

    def join(self) -> None:
        from vllm.distributed.weight_transfer.factory import WeightTransferTrainerFactory

        info = trainer_init_info(self.spec, self.rank)
        self.engine = WeightTransferTrainerFactory.trainer_init(info, client=self.client, source=self.source)

    def send(self, source: TensorSource, version: int) -> None:
        """The engine's ``send_weights``: when it returns, every server has finished vLLM's update
        session (``areal_gloo`` holds the update staged; vLLM's ``nccl`` loaded it on arrival);
        ``VLLMEngine.commit_weights`` then serves it as ``version`` on all of them or on none. On a
        failure the channel leaves at once (a server blocked in its receive also blocks its
        engine's resume)."""
        if self.engine is None:
            raise RuntimeError("send() before join(): the vllm channel has no trainer engine")
        self.source.tensors = source
        try:
            self.engine.send_weights()
        except BaseException:
            self.leave()  # the servers fail now, instead of waiting in their receive until a timeout
            raise
        finally:
            self.source.tensors = None

    def leave(self) -> None:
        engine, self.engine = self.engine, None
        if engine is None:
            return
        engine.shutdown()
        if self.is_sender:  # the servers release their end too (best effort: one may be gone)
            try:
                self.client.shutdown_weight_transfer_engine(min(_LEAVE_TIMEOUT_S, self.spec.timeout_s))
            except ArealError as exc:
                log.warning("vllm servers did not shut their weight transfer down: %s", exc)


def trainer_init_info(spec: ChannelSpec, rank: int) -> TrainerInitInfo:
    """The ``TrainerInitInfo`` of ``spec.backend``'s trainer engine for this channel: its rendezvous
    fields from ``spec`` (and, where the backend has them, the group name, bucket size and timeout)."""
    cls = trainer_engine(spec.backend).init_info_cls
    values = {
        "master_address": spec.master_addr,
        "master_port": spec.master_port,
        "world_size": spec.world_size,
        "group_name": spec.group_name,
        "timeout_s": spec.timeout_s,
        "bucket_bytes": spec.bucket_bytes,  # areal_gloo
        "packed_buffer_size_bytes": spec.bucket_bytes,  # nccl (and backends shaped like it)
    }
    fields = {f.name: f for f in dataclasses.fields(cls) if f.init and f.name != "rank"}
    required = {n for n, f in fields.items() if f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING}
    if required - values.keys():
        raise PluginError(
            f"vLLM weight-transfer backend {spec.backend!r}: {cls.__module__}.{cls.__name__} needs "
            f"{sorted(required - values.keys())}, which this channel cannot fill (it fills {sorted(values)})"
        )
    return cls(**{n: v for n, v in values.items() if n in fields}, rank=rank)


def trainer_engine(backend: str) -> type[TrainerWeightTransferEngine]:
    """The trainer engine class vLLM's ``WeightTransferTrainerFactory`` builds for ``backend``.

    ``areal_gloo`` is ours (registered here); a backend vLLM itself lacks (vllm-ascend's ``hccl``)
    is registered by its vLLM plugin, so vLLM's general plugins are loaded into this process first.
    """
    registry: dict[str, Any] = internal("vllm.distributed.weight_transfer.factory", "WeightTransferTrainerFactory._registry")
    if backend == "areal_gloo":
        from areal_engine_vllm.gloo_common import register_backend

        register_backend()
    if backend not in registry:
        from vllm.plugins import load_general_plugins

        load_general_plugins()
    if backend not in registry:
        hint = " (vllm-ascend registers it: install the vllm-ascend release for vllm 0.32)" if backend == "hccl" else ""
        raise PluginError(
            f"vLLM weight-transfer backend {backend!r} has no trainer engine in this process"
            f"{hint}; registered: {', '.join(sorted(registry))}"
        )
    return registry[backend]()


class _Weights(WeightSource):
    """vLLM's ``WeightSource`` over the trainer's ``TensorSource`` of the current send."""

    tensors: TensorSource | None = None

    def metadata(self) -> list[ParamMeta]:
        return [ParamMeta(name, parse_dtype(dtype), tuple(shape)) for name, dtype, shape in self._tensors().specs()]

    def __iter__(self) -> Iterator[tuple[str, torch.Tensor]]:
        return iter(self._tensors())

    def _tensors(self) -> TensorSource:
        if self.tensors is None:
            raise RuntimeError("the vllm channel's weight source is read outside send()")
        return self.tensors
