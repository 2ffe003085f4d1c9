"""Addresses come from the node: the scheduler fills a spec's placeholders where the process runs."""

from __future__ import annotations

import socket
import sys
import time

import pytest
from hypothesis import given
from hypothesis import strategies as st

from areal_core.config import load_config
from areal_core.api.errors import ConfigError
from areal_core.builtin.platform_cpu.platform import CpuPlatform
from areal_core.api.scheduler import (
    BIND_HOST,
    HOST,
    NODE_HOST_ENV,
    PORT,
    ProcessSpec,
    fill_addresses,
    node_addresses,
)
from areal_core.scheduler.local import LocalScheduler


@given(st.ip_addresses(v=4).map(str))
def test_the_node_address_is_the_default_and_a_wildcard_advertises_it(node_ip):
    assert node_addresses("", node_ip) == (node_ip, node_ip)
    assert node_addresses("0.0.0.0", node_ip) == ("0.0.0.0", node_ip)
    assert node_addresses("10.1.2.3", node_ip) == ("10.1.2.3", "10.1.2.3")


def test_placeholders_are_filled_in_arguments_and_environment():
    spec = ProcessSpec(name="s", cmd=["serve", "--host", BIND_HOST, f"--url=http://{HOST}:{PORT}/"],
                       env={"MASTER_ADDR": HOST, "MASTER_PORT": PORT, "OTHER": "{not:ours}"})
    filled, port = fill_addresses(spec, "127.0.0.2", "127.0.0.2")
    assert isinstance(port, int)
    assert filled.cmd == ["serve", "--host", "127.0.0.2", f"--url=http://127.0.0.2:{port}/"]
    assert filled.env == {NODE_HOST_ENV: "127.0.0.2", "MASTER_ADDR": "127.0.0.2", "MASTER_PORT": str(port),
                          "OTHER": "{not:ours}"}
    with socket.socket() as sock:
        sock.bind(("127.0.0.2", port))  # free where the process binds
    assert fill_addresses(ProcessSpec(name="t", cmd=["true"]), "127.0.0.1", "127.0.0.1")[1] is None


def test_the_local_scheduler_binds_cluster_bind_host(tmp_path):
    log = tmp_path / "listener.log"
    script = "import socket, sys, time; s = socket.socket(); s.bind((sys.argv[1], int(sys.argv[2]))); " \
             "s.listen(); print('up', flush=True); time.sleep(60)"
    spec = ProcessSpec(name="server0", cmd=[sys.executable, "-c", script, BIND_HOST, PORT], log_file=str(log))
    with LocalScheduler(CpuPlatform(), bind_host="127.0.0.5") as scheduler:
        handle = scheduler.start(spec)
        deadline = time.monotonic() + 60
        while not (log.exists() and log.read_text()):
            assert handle.alive() and time.monotonic() < deadline, log.read_text() if log.exists() else ""
            time.sleep(0.1)
        assert (handle.host, scheduler.host, scheduler.bind_host) == ("127.0.0.5",) * 3
        socket.create_connection((handle.host, handle.port), timeout=5).close()


@pytest.mark.parametrize(("override", "message"), [
    ("cluster.bind_host=node-1", r"^cluster.bind_host: 'node-1' is not an IP address"),
    ("ray.server_resources={CPU: 2}", r"^ray.server_resources.CPU: 2 is not allowed; give a custom node resource"),
    ("ray.trainer_resources={train: 0}", r"^ray.trainer_resources.train: 0 is not allowed"),
    ("ray.placement_strategy=spread", r"^ray.placement_strategy: must be one of 'PACK', 'SPREAD'"),
])
def test_bad_cluster_settings_name_their_key(override, message):
    with pytest.raises(ConfigError, match=message):
        load_config(None, [override])
