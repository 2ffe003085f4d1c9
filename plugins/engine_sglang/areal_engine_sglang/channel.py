"""SGLang's weight channel, trainer half: SGLang 0.5.23's own group handshake, then one
``flattened_bucket`` broadcast per bucket (``actor.weight_update: xccl``).

**Join.** ``POST /init_weights_update_group`` makes each server worker call SGLang's
``init_custom_process_group`` (``sglang/srt/utils/common.py``) as rank ``rank_offset + tp_rank``:
torch's ``rendezvous`` on ``tcp://master:port``, a ``PrefixStore(group_name)`` over its store,
then torch's ``_new_process_group_helper`` (no global ranks, so a group of its own), and an
identity ``pg_group_ranks`` entry so ``torch.distributed.broadcast(src=0, group=...)`` works.
Trainer rank 0 makes the same torch calls as rank 0 at the same time (:func:`join_group`), so
every store key meets; its ``rendezvous`` hosts the TCPStore, as SGLang expects of rank 0. A
group of the same name left on a server by a trainer that died is destroyed first (SGLang and
torch refuse a second group of one name).

**Send.** ``POST /begin_weight_update`` opens SGLang's weight-update session (one left open by a
failed update is ended first: SGLang refuses a second). Per bucket, ``POST
/update_weights_from_distributed`` with ``load_format: flattened_bucket`` to every server while
rank 0 broadcasts the bucket's bytes back to back; SGLang loads each bucket into the served model
as it arrives. ``SGLangEngine.commit_weights`` (controller) ends the session and sets the version.

**Leave.** Abort, then ``destroy_process_group`` (SGLang's own clean-up call) and ``POST
/destroy_weights_update_group``. On gloo a peer blocked in a broadcast fails only once the last
reference to the group is gone; SGLang's servers join without a timeout, so torch's default
(30 minutes) bounds a server whose trainer hangs instead of leaving.
"""

from __future__ import annotations

import datetime
import gc
import logging
import math
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from areal_core.api.errors import ArealError
from areal_core.api.weight_channel import (
    Bucket,
    FlatBucketChannel,
    TensorSource,
    parse_dtype,
    plan_buckets,
    post_all,
)
from areal_engine_sglang.protocol import DistributedUpdateBody, GroupNameBody, to_json, weight_group_bodies

log = logging.getLogger(__name__)
_LABEL = "sglang server"
_DESTROY_TIMEOUT_S = 10.0  # leaving must not wait long for a server still busy in the broken group


def join_group(
    *, backend: str, master_addr: str, master_port: int, group_name: str, rank: int, world_size: int, timeout_s: float
) -> Any:
    """Join ``group_name`` as ``rank`` through the torch calls SGLang's ``init_custom_process_group``
    makes; returns the torch ``ProcessGroup`` (registered in torch's group table: see :func:`leave_group`)."""
    from torch.distributed.distributed_c10d import Backend, PrefixStore, _new_process_group_helper, _world, rendezvous

    timeout = datetime.timedelta(seconds=timeout_s)
    store, rank, world_size = next(rendezvous(f"tcp://{master_addr}:{master_port}", rank, world_size, timeout=timeout))
    store.set_timeout(timeout)
    group, _ = _new_process_group_helper(
        world_size,
        rank,
        [],
        Backend(backend),
        PrefixStore(group_name, store),
        group_name=group_name,
        backend_options=None,
        timeout=timeout,
        device_id=None,
    )
    _world.pg_group_ranks[group] = {r: r for r in range(world_size)}
    return group


def leave_group(group: Any) -> None:
    """Abort ``group`` and remove it from torch's group table (its name becomes free again)."""
    import torch.distributed as dist

    try:
        group.abort()
    except RuntimeError:  # already broken; nothing to release
        pass
    dist.destroy_process_group(group)


class SGLangWeightChannel(FlatBucketChannel):
    """Trainer half of SGLang's collective weight update (``/init_weights_update_group`` ...)."""

    def join(self) -> None:
        if not self.is_sender:
            return
        spec = self.spec
        # a group of this name left by a trainer that died (SGLang refuses a second one)
        self._post_each_quietly("/destroy_weights_update_group", self._group_name_body(), _DESTROY_TIMEOUT_S)
        pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="sglang-join")
        # each server's call returns once every member (this rank too) has joined
        servers = pool.submit(self._post, "/init_weights_update_group", weight_group_bodies(spec))
        try:
            self.group = join_group(
                backend=spec.backend, master_addr=spec.master_addr, master_port=spec.master_port,
                group_name=spec.group_name, rank=0, world_size=spec.world_size, timeout_s=spec.timeout_s,
            )  # fmt: skip
        except Exception as exc:  # noqa: BLE001 - a server's refusal, if any, says more
            pool.shutdown(wait=False)  # the servers' calls end at their own timeout
            server_error = servers.exception() if servers.done() else None
            raise ArealError(
                f"sglang weight group {spec.group_name!r}: trainer rank 0 could not join "
                f"({type(exc).__name__}: {exc})" + (f"; {server_error}" if server_error else "")
            ) from None
        try:
            servers.result()
        except BaseException:
            self.leave()
            raise
        finally:
            pool.shutdown()

    def send(self, source: TensorSource, version: int) -> None:
        # every rank checks the same plan, so all raise (before any gather) or none does
        _check_aligned(plan_buckets(source.specs(), self.spec.bucket_bytes))
        if self.is_sender and self.group is not None:
            self._begin_session()  # before any broadcast: a refusal here leaves nothing blocked
        super().send(source, version)

    def _receive(self, buckets: list[Bucket], version: int) -> None:
        for bucket in buckets:  # SGLang's protocol: one call per bucket
            body = DistributedUpdateBody(
                names=bucket.names, dtypes=bucket.dtypes, shapes=bucket.shapes, group_name=self.spec.group_name,
                flush_cache=not self.spec.holds_requests,  # SGLang refuses to flush under held requests
            )
            self._post("/update_weights_from_distributed", [to_json(body)] * len(self.spec.servers))

    def _begin_session(self) -> None:
        empty: list[dict[str, Any]] = [{}] * len(self.spec.servers)
        try:
            self._post("/begin_weight_update", empty)
        except ArealError as exc:  # a session left open by a failed update: end it, then begin again
            log.info("ending a stale sglang weight-update session (%s)", exc)
            self._post_each_quietly("/end_weight_update", {}, self.spec.timeout_s)
            self._post("/begin_weight_update", empty)

    def leave(self) -> None:
        group, self.group = self.group, None
        if group is None:
            return
        leave_group(group)
        del group
        gc.collect()  # on gloo the peers' sockets close (and a server blocked in a broadcast fails) once it is freed
        self._post_each_quietly("/destroy_weights_update_group", self._group_name_body(), _DESTROY_TIMEOUT_S)

    def _group_name_body(self) -> dict[str, Any]:
        return to_json(GroupNameBody(group_name=self.spec.group_name))

    def _post(self, route: str, bodies: list[dict[str, Any]]) -> None:
        post_all(self.spec.servers, route, bodies, self.spec.token, self.spec.timeout_s, _LABEL)

    def _post_each_quietly(self, route: str, body: dict[str, Any], timeout: float) -> None:
        """POST ``body`` to each server; a refusal (nothing to end or destroy, or a lost server) is logged only."""
        for server in self.spec.servers:
            try:
                post_all([server], route, [body], self.spec.token, min(timeout, self.spec.timeout_s), _LABEL)
            except ArealError as exc:
                log.info("%s", exc)


def _check_aligned(buckets: list[Bucket]) -> None:
    """SGLang views each tensor of a flat bucket in place, so its byte offset must be a multiple
    of its dtype's size (``FlattenedTensorBucket.empty`` refuses the bucket otherwise)."""
    for bucket in buckets:
        offset = 0
        for name, dtype, shape in zip(bucket.names, bucket.dtypes, bucket.shapes):
            itemsize = parse_dtype(dtype).itemsize
            if offset % itemsize:
                raise ValueError(
                    f"sglang flattened_bucket: {name!r} ({dtype}) would start at byte {offset} of its bucket, "
                    f"not a multiple of {itemsize}; SGLang refuses unaligned tensors"
                )
            offset += math.prod(shape) * itemsize
