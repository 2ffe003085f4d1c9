"""The hf engine's weight channel (trainer half): flat gloo buckets to hf servers.

Rank 0 hosts the TCPStore and joins gloo group ``group_name`` as rank 0 while every server joins
through ``POST /init_weight_group`` (the server end is :class:`~areal_core.builtin.engine_hf.receiver.WeightGroup`,
built the same way); each bucket is ``POST /receive_weights`` (staged on the server) while rank 0
broadcasts it. The controller's ``HFEngine.commit_weights`` swaps the staged buckets in.
"""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor

import torch

from areal_core.api.wire import ReceiveWeightsBody, WeightGroupBody, to_json
from areal_core.builtin.engine_hf.receiver import join_gloo_group
from areal_core.api.weight_channel import Bucket, ChannelSpec, FlatBucketChannel, post_all

_LABEL = "hf server"


class HFWeightChannel(FlatBucketChannel):
    """Trainer half of the hf engine's collective weight path (gloo only: the servers run on CPU)."""

    packed = False  # in place: large tensors from the trainer's memory, small ones in runs (receiver: receive_bucket)

    def __init__(self, spec: ChannelSpec, *, rank: int, device: torch.device) -> None:
        super().__init__(spec, rank=rank, device=torch.device("cpu"))  # gloo buckets live on the host
        self._store: object | None = None

    def join(self) -> None:
        if not self.is_sender:
            return
        spec = self.spec
        bodies = [
            to_json(WeightGroupBody(
                master_addr=spec.master_addr, master_port=spec.master_port, rank_offset=spec.first_rank(i),
                world_size=spec.world_size, backend=spec.backend, group_name=spec.group_name, timeout_s=spec.timeout_s,
            ))
            for i in range(len(spec.servers))
        ]  # fmt: skip
        with ThreadPoolExecutor(max_workers=1, thread_name_prefix="weights-join") as pool:
            servers = pool.submit(self._post, "/init_weight_group", bodies)  # they block until rank 0 joins
            self.group, self._store = join_gloo_group(
                spec.master_addr, spec.master_port, spec.group_name, 0, spec.world_size, spec.timeout_s
            )
            servers.result()

    def _receive(self, buckets: list[Bucket], version: int) -> None:
        body = to_json(ReceiveWeightsBody(
            names=[n for b in buckets for n in b.names], dtypes=[d for b in buckets for d in b.dtypes],
            shapes=[s for b in buckets for s in b.shapes], version=version, bucket_sizes=[len(b.names) for b in buckets],
            digest=self.spec.compares_digests,
        ))  # fmt: skip
        self._post("/receive_weights", [body] * len(self.spec.servers))  # one call: no round trip between buckets

    def _post(self, route: str, bodies: list[dict]) -> None:
        post_all(self.spec.servers, route, bodies, self.spec.token, self.spec.timeout_s, _LABEL)
