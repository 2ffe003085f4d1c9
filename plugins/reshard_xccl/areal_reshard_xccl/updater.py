"""The ``xccl`` weight path: bucketed broadcast from trainer rank 0 to every inference server.

``connect`` opens a process group of its own (never the training group): a TCPStore in this
process is the rendezvous, trainer rank 0 is rank 0 and server ``i``'s workers follow at
``1 + i * workers_per_server + local_rank``; the backend is ``platform.dist_backend``.
``update(v)`` has every training rank gather the full tensors while rank 0 broadcasts them in
flat buckets of ``actor.weight_chunked_mem_mb``; the servers stage each bucket as it arrives
(``engine.receive_weights``) and swap all of them in at ``engine.commit_weights(v)``. Any failure
before the commit leaves every server on its old weights, raises :class:`WeightUpdateError` and
makes the next ``update`` build a fresh group (so a replaced server can join). So does a change
of the engine's members (a server lost, added or replaced): the group is re-formed with a new
TCPStore rendezvous and world size before the update.
"""

from __future__ import annotations

import datetime
import logging
import math
import time
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import TYPE_CHECKING

import attrs

from areal_core.errors import ArealError
from areal_core.weights import WeightUpdateMeta, WeightUpdater

if TYPE_CHECKING:
    from areal_core.config import Config
    from areal_core.engine import InferenceEngine
    from areal_core.platform import Platform
    from areal_core.train.controller import TrainController

logger = logging.getLogger(__name__)


class WeightUpdateError(ArealError):
    """An xccl update failed before its commit; the servers still serve the previous weights."""


def plan_buckets(nbytes: Sequence[int], max_bytes: int) -> list[range]:
    """Split tensors ``0..n-1`` (in order) into contiguous runs of at most ``max_bytes`` bytes;
    a tensor larger than ``max_bytes`` gets a bucket of its own."""
    if max_bytes < 1:
        raise ValueError(f"max_bytes={max_bytes} must be >= 1")
    buckets: list[range] = []
    start, size = 0, 0
    for i, n in enumerate(nbytes):
        if i > start and size + n > max_bytes:
            buckets.append(range(start, i))
            start, size = i, 0
        size += n
    if start < len(nbytes):
        buckets.append(range(start, len(nbytes)))
    return buckets


class XcclWeightUpdater(WeightUpdater):
    """Broadcasts the trainer's weights to every server over a dedicated process group."""

    name = "xccl"

    def __init__(self, config: Config, platform: Platform) -> None:
        super().__init__(config, platform)
        self._trainer: TrainController | None = None
        self._engine: InferenceEngine | None = None
        self._buckets: list[WeightUpdateMeta] = []
        self._group: WeightUpdateMeta | None = None  # the live group's rendezvous, None = (re)create
        self._store: object | None = None  # the TCPStore server; members use it while connected
        self._members: tuple[str, ...] = ()  # the engine's members when the live group was formed
        self._groups_made = 0
        self.setup_seconds = 0.0  # of the last group set-up

    @property
    def timeout_s(self) -> float:
        return self.config.rollout.request_timeout

    def connect(self, trainer: TrainController, engine: InferenceEngine) -> None:
        """Plan the buckets and (re-)create the group; call again after replacing a server."""
        import torch

        self._trainer, self._engine = trainer, engine
        specs = trainer.full_tensor_specs()
        sizes = [math.prod(shape) * getattr(torch, dtype).itemsize for _, dtype, shape in specs]
        max_bytes = self.config.actor.weight_chunked_mem_mb * 2**20
        self._buckets = [
            WeightUpdateMeta(
                version=0,
                names=tuple(specs[i][0] for i in run),
                dtypes=tuple(specs[i][1] for i in run),
                shapes=tuple(specs[i][2] for i in run),
            )
            for run in plan_buckets(sizes, max_bytes)
        ]
        self._open_group()

    def _open_group(self) -> None:
        import torch.distributed as dist

        trainer, engine = self._require()
        self._close_group()
        timeout = datetime.timedelta(seconds=self.timeout_s)
        host = "127.0.0.1"
        self._store = dist.TCPStore(host, 0, None, is_master=True, timeout=timeout, wait_for_workers=False)
        self._groups_made += 1
        members = engine.members()
        servers = len(members) if members else len(engine.health())
        meta = WeightUpdateMeta(
            version=0,
            group_name=f"areal_weights_{self._groups_made}",
            master_addr=host,
            master_port=self._store.port,
            world_size=1 + servers * self.config.rollout.devices_per_server,
            backend=self.platform.dist_backend,
        )
        start = time.perf_counter()
        with ThreadPoolExecutor(max_workers=1, thread_name_prefix="xccl-join") as pool:
            servers_joined = pool.submit(engine.init_weight_group, meta)  # blocks until rank 0 joins
            trainer_error = _error_of(trainer.join_weight_group, meta, self.timeout_s)
            server_error = _error_of(servers_joined.result)
        if trainer_error or server_error:
            self._close_group()
            reasons = "; ".join(e for e in (trainer_error, server_error) if e)
            raise WeightUpdateError(f"xccl weight group {meta.group_name!r} could not be set up: {reasons}")
        self._group, self._members = meta, members
        self.setup_seconds = time.perf_counter() - start
        logger.info(
            "xccl weight group %r (%s, world size %d) set up in %.2fs",
            meta.group_name, meta.backend, meta.world_size, self.setup_seconds,
        )  # fmt: skip

    def update(self, version: int) -> None:
        trainer, engine = self._require()
        if self._group is None or engine.members() != self._members:  # a failed update, or servers came or went
            self._open_group()
        buckets = [attrs.evolve(b, version=version) for b in self._buckets]
        errors: list[str] = []
        with ThreadPoolExecutor(max_workers=1, thread_name_prefix="xccl-send") as pool:
            sent = pool.submit(trainer.broadcast_weights, [list(b.names) for b in buckets])
            for bucket in buckets:  # each call returns once its bucket is staged on every server
                error = _error_of(engine.receive_weights, bucket)
                if error:
                    errors.append(f"servers: {error}")
                    break
            error = _error_of(sent.result)
            if error:
                errors.append(error)
        if errors:
            self._close_group()
            raise WeightUpdateError(
                f"xccl update to version {version} failed before its commit, so every server keeps its "
                f"previous weights (the next update builds a new group): {'; '.join(errors)}"
            )
        engine.commit_weights(version)

    def close(self) -> None:
        self._close_group()

    def _close_group(self) -> None:
        if self._group is not None and self._trainer is not None:
            try:
                self._trainer.leave_weight_group()
            except (ArealError, RuntimeError) as exc:  # the workers are gone: nothing to leave
                logger.debug("leaving the weight group: %s", exc)
        self._group, self._store = None, None

    def _require(self) -> tuple[TrainController, InferenceEngine]:
        if self._trainer is None or self._engine is None:
            raise RuntimeError("XcclWeightUpdater: call connect(trainer, engine) before update()")
        return self._trainer, self._engine


def _error_of(fn, *args: object) -> str | None:
    """Run ``fn``; return its ArealError's message (other exceptions propagate) or None."""
    try:
        fn(*args)
    except ArealError as exc:
        return str(exc)
    return None
