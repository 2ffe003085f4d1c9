"""The vllm channel's parts that need no vLLM server: the backend per platform, the init info each
vLLM trainer engine gets, and the fan-out client's per-server ranks."""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import pytest

pytest.importorskip("vllm", reason="vLLM is not installed: pip install -e 'plugins/engine_vllm[cpu]'")

from areal_engine_vllm.channel import trainer_init_info  # noqa: E402
from areal_engine_vllm.protocol import transfer_backend  # noqa: E402
from areal_engine_vllm.sync_client import ServersSyncClient  # noqa: E402

from areal_core.api.errors import ArealError, ConfigError, PluginError  # noqa: E402
from areal_core.api.weight_channel import ChannelSpec  # noqa: E402


def spec(backend: str, servers: int = 2, ranks_per_server: int = 2) -> ChannelSpec:
    return ChannelSpec(
        channel="areal_engine_vllm.channel:VLLMWeightChannel",
        servers=tuple(f"127.0.0.1:{9000 + i}" for i in range(servers)),
        token="t",
        backend=backend,
        master_addr="127.0.0.1",
        master_port=29555,
        group_name="g",
        bucket_bytes=8 << 20,
        timeout_s=30.0,
        ranks_per_server=ranks_per_server,
    )


def test_each_platform_has_its_backend_and_an_unknown_one_is_named() -> None:
    from areal_engine_vllm.gloo_common import BACKEND

    assert [transfer_backend(d) for d in ("cpu", "cuda", "npu")] == [BACKEND, "nccl", "hccl"]
    with pytest.raises(ConfigError, match="^platform: device type 'xpu'.*cpu -> areal_gloo"):
        transfer_backend("xpu")


def test_the_init_info_is_the_backends_own_class_filled_from_the_spec() -> None:
    from vllm.distributed.weight_transfer.nccl_engine import NCCLTrainerInitInfo

    from areal_engine_vllm.gloo_common import GlooTrainerInitInfo

    nccl = trainer_init_info(spec("nccl"), rank=1)
    assert type(nccl) is NCCLTrainerInitInfo and not nccl.is_sender
    assert (nccl.master_address, nccl.master_port, nccl.world_size) == ("127.0.0.1", 29555, 5)
    assert nccl.packed and nccl.packed_buffer_size_bytes == 8 << 20
    gloo = trainer_init_info(spec("areal_gloo", servers=1, ranks_per_server=1), rank=0)
    assert type(gloo) is GlooTrainerInitInfo and gloo.is_sender
    assert (gloo.world_size, gloo.group_name, gloo.bucket_bytes, gloo.timeout_s) == (2, "g", 8 << 20, 30.0)


def test_a_backend_nobody_registered_fails_with_one_line_listing_the_registered() -> None:
    with pytest.raises(PluginError, match=r"'hccl' has no trainer engine.*vllm-ascend.*registered: .*nccl") as info:
        trainer_init_info(spec("hccl"), rank=0)
    assert "\n" not in str(info.value)


class _Recorder(BaseHTTPRequestHandler):
    seen: list[tuple[int, str, Any, str]]

    def do_POST(self) -> None:  # noqa: N802 - http.server's name
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])) or b"{}")
        self.seen.append((self.server.server_port, self.path, body, self.headers.get("Authorization", "")))
        refused = self.path.endswith("start_weight_update") and self.server.server_port == self.refuse
        self.send_response(500 if refused else 200)
        self.end_headers()
        self.wfile.write(json.dumps({"error": "refused"} if refused else {}).encode())

    def log_message(self, *args: Any) -> None:
        pass


@pytest.fixture
def recorders() -> Iterator[tuple[list[str], list, type]]:
    handler = type("Handler", (_Recorder,), {"seen": [], "refuse": None})
    servers = [ThreadingHTTPServer(("127.0.0.1", 0), handler) for _ in range(3)]
    for server in servers:
        threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        yield [f"127.0.0.1:{s.server_port}" for s in servers], handler.seen, handler
    finally:
        for server in servers:
            server.shutdown()
            server.server_close()


def test_the_client_sends_each_server_its_own_ranks_and_the_same_calls(recorders) -> None:
    addresses, seen, handler = recorders
    client = ServersSyncClient(addresses, "secret", ranks_per_server=2, timeout_s=10)
    client.init_weight_transfer_engine({"master_address": "h", "master_port": 1, "rank_offset": 1, "world_size": 7})
    ports = [int(a.rsplit(":", 1)[1]) for a in addresses]
    offsets = {port: body["init_info"]["rank_offset"] for port, _, body, _ in seen}
    assert offsets == {ports[0]: 1, ports[1]: 3, ports[2]: 5}
    assert {body["init_info"]["world_size"] for _, _, body, _ in seen} == {7}
    seen.clear()
    client.start_weight_update()
    client.update_weights({"names": ["a"]})
    client.finish_weight_update("4")
    calls = sorted((path, json.dumps(body)) for _, path, body, _ in seen)
    assert calls == sorted(
        [("/areal/start_weight_update", "{}")] * 3
        + [("/areal/update_weights", '{"update_info": {"names": ["a"]}}')] * 3
        + [("/areal/finish_weight_update", '{"weight_version": "4"}')] * 3
    )
    assert {auth for *_, auth in seen} == {"Bearer secret"}
    handler.refuse = ports[1]
    with pytest.raises(ArealError, match=rf"vllm server 127.0.0.1:{ports[1]} /areal/start_weight_update failed \(500\): refused"):
        client.start_weight_update()
