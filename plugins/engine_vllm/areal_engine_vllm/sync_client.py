"""The trainer's side of the weight-sync control plane: vLLM's ``VLLMWeightSyncClient`` (structural)
over every server's bearer-token ``/areal/*`` weight-transfer routes, called on all servers at once.

vLLM's trainer engines drive one inference deployment through this four-call surface (init, then
per update start -> update -> finish). Here the deployment is several servers, one weight group:
server ``i``'s workers join at ``rank_offset + i * ranks_per_server`` (the trainer engine's offset
is for a single server), so the init call is rewritten per server; the other calls are the same
for every server. A call returns when every server answered; any failure raises naming the server.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from areal_core.api.weight_channel import post_all

_LABEL = "vllm server"


class ServersSyncClient:
    """``VLLMWeightSyncClient`` for ``servers`` (addresses, in weight-group rank order)."""

    def __init__(self, servers: Sequence[str], token: str, ranks_per_server: int, timeout_s: float) -> None:
        self.servers = list(servers)
        self.ranks_per_server = ranks_per_server
        self.timeout_s = timeout_s
        self._token = token

    def init_weight_transfer_engine(self, init_info: dict[str, Any]) -> None:
        offset = int(init_info.get("rank_offset", 1))
        self._post_each(
            "init_weight_transfer_engine",
            [{"init_info": {**init_info, "rank_offset": offset + i * self.ranks_per_server}} for i in range(len(self.servers))],
        )

    def start_weight_update(self) -> None:
        self._post_all("start_weight_update", {})

    def update_weights(self, update_info: dict[str, Any] | list[dict[str, Any]]) -> None:
        self._post_all("update_weights", {"update_info": update_info})

    def finish_weight_update(self, weight_version: str | None = None) -> None:
        self._post_all("finish_weight_update", {} if weight_version is None else {"weight_version": weight_version})

    def shutdown_weight_transfer_engine(self, timeout_s: float | None = None) -> None:
        self._post_all("shutdown_weight_transfer_engine", {}, timeout_s)

    def _post_all(self, route: str, body: dict[str, Any], timeout_s: float | None = None) -> None:
        self._post_each(route, [body] * len(self.servers), timeout_s)

    def _post_each(self, route: str, bodies: list[dict[str, Any]], timeout_s: float | None = None) -> None:
        timeout = self.timeout_s if timeout_s is None else timeout_s
        post_all(self.servers, f"/areal/{route}", bodies, self._token, timeout, _LABEL)
