"""Ray nodes for tests: a multi-node cluster on this machine, each node a raylet with its own
127.x address (Linux routes all of 127.0.0.0/8 to loopback), every process marked.

Ray replaces a node address of 127.0.0.1 by the machine's outward IP, so the head takes
127.0.0.3 and the other nodes 127.0.0.2, 127.0.0.4, ... Every node gets its own free ports,
and processes are stopped by their mark: ``ray stop`` would stop every cluster on the machine.
"""

from __future__ import annotations

import contextlib
import os
import socket
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import psutil
from quickstart_runs import MARK, kill_marked, marked_pids

HEAD_IP = "127.0.0.3"
RAY_START = [sys.executable, "-m", "ray.scripts.scripts", "start", "--disable-usage-stats", "--object-store-memory=100000000"]
# no OOM killing of our actors for the machine's load (this box is shared); on the head: a dead node
# is noticed within ~3 s instead of the default ~15 s (GCS health checks)
NODE_ENV = {"RAY_memory_monitor_refresh_ms": "0"}
HEAD_ENV = {**NODE_ENV, "RAY_health_check_period_ms": "1000", "RAY_health_check_failure_threshold": "3"}


def free_ports(count: int) -> list[int]:
    """``count`` distinct TCP ports free on this machine now. The sockets stay bound until all are
    picked: separate ``free_port()`` calls can return one port twice, and ``ray start`` refuses
    to give two of its components the same port."""
    with contextlib.ExitStack() as stack:
        socks = [stack.enter_context(socket.socket()) for _ in range(count)]
        for sock in socks:
            sock.bind(("", 0))
        return [sock.getsockname()[1] for sock in socks]


def port_flags(*flags: str) -> list[str]:
    """``ray start`` port flags, each given its own free port."""
    return [f"{flag}={port}" for flag, port in zip(flags, free_ports(len(flags)), strict=True)]


NODE_PORT_FLAGS = ("--node-manager-port", "--object-manager-port", "--dashboard-agent-listen-port",
                   "--dashboard-agent-grpc-port", "--metrics-export-port", "--runtime-env-agent-port")


def worker_ports(ip: str) -> list[str]:
    """The worker ports of the node at 127.0.0.N, 500 of its own from 30000 + 500 * (N - 2): clear of
    Ray's default range (10002-19999, which other tests' private heads use, beside these nodes under
    pytest-xdist), a range a cluster started by hand may use (20002-25999) and the ephemeral ports
    (32768 on). A Ray worker on a node not at 127.0.0.1 listens on every address, so no two ranges
    may overlap."""
    first = 30000 + 500 * (int(ip.rsplit(".", 1)[1]) - 2)
    assert 30000 <= first and first + 499 < 32768, f"no worker port range for a node at {ip}"
    return [f"--min-worker-port={first}", f"--max-worker-port={first + 499}"]


def resources(cpus: int, custom: dict[str, float]) -> list[str]:
    return [f"--num-cpus={cpus}", f"--resources={custom!r}".replace("'", '"')]


def stop_marked(mark: str) -> None:
    """SIGKILL every process carrying ``mark``, then the unmarked descendants they had (Ray starts
    its agents with a clean environment). A test's cluster has nothing to save, and Ray's gcs_server,
    raylet and agents outlive a SIGTERM by seconds (still running 6 s after it, on this machine)."""
    unmarked = _descendants(marked_pids(mark))
    kill_marked(mark)
    for proc in unmarked:
        with contextlib.suppress(psutil.Error):
            proc.kill()


def _descendants(pids: list[int]) -> list[psutil.Process]:
    found = []
    for pid in pids:
        with contextlib.suppress(psutil.Error):
            found += psutil.Process(pid).children(recursive=True)
    return found


@contextlib.contextmanager
def head(cpus: int, custom: dict[str, float]) -> Iterator[str]:
    """A head node on :data:`HEAD_IP` (temp dir under /tmp, free ports, worker ports of its own) with
    its dashboard, which takes ``ray job submit`` (``ray[default]``); yields its address."""
    temp_dir = tempfile.mkdtemp(prefix="ray-mn", dir="/tmp")  # short: Ray's socket paths must fit in 107 bytes
    mark = uuid.uuid4().hex
    ports = port_flags("--port", "--dashboard-port", "--ray-client-server-port", *NODE_PORT_FLAGS)
    address = f"{HEAD_IP}:{ports[0].split('=')[1]}"
    cmd = [*RAY_START, "--head", f"--node-ip-address={HEAD_IP}", f"--dashboard-host={HEAD_IP}",
           f"--temp-dir={temp_dir}", *ports, *worker_ports(HEAD_IP), *resources(cpus, custom)]
    try:
        started = subprocess.run(cmd, check=False, env={**os.environ, **HEAD_ENV, MARK: mark}, capture_output=True, text=True,
                                 timeout=180)
        assert started.returncode == 0, started.stdout[-2000:] + started.stderr[-2000:]
        yield address
    finally:
        stop_marked(mark)
        subprocess.run(["rm", "-rf", temp_dir], check=False)


@contextlib.contextmanager
def worker_node(address: str, ip: str, cpus: int, custom: dict[str, float], wrap: list[str] = ()) -> Iterator[str]:
    """A node at ``ip`` joined to the cluster at ``address`` (``ray start --block``, started through
    ``wrap``, e.g. ``unshare``); yields its mark. The node is stopped on exit.

    Its temp dir is its own, as on a machine of its own: nodes sharing one share their runtime
    resources, and each would unpack a job's working directory over the others' (under the driver).
    """
    mark = uuid.uuid4().hex
    temp_dir = tempfile.mkdtemp(prefix=f"ray-{ip.rsplit('.', 1)[1]}-", dir="/tmp")  # short: socket paths
    cmd = [*wrap, *RAY_START, f"--address={address}", f"--node-ip-address={ip}", "--block", f"--temp-dir={temp_dir}",
           *port_flags(*NODE_PORT_FLAGS), *worker_ports(ip), *resources(cpus, custom)]
    log = Path(tempfile.mkstemp(prefix=f"ray-node-{ip}-", suffix=".log")[1])
    with log.open("w") as out:
        proc = subprocess.Popen(cmd, env={**os.environ, **NODE_ENV, MARK: mark}, stdout=out, stderr=subprocess.STDOUT)
    try:
        wait_for_node(address, ip, proc, log)
        yield mark
    finally:
        stop_marked(mark)
        proc.wait(30)
        log.unlink(missing_ok=True)
        subprocess.run(["rm", "-rf", temp_dir], check=False)


def wait_for_node(address: str, ip: str, proc: subprocess.Popen, log: Path, timeout: float = 120) -> None:
    """Until the cluster lists a live node at ``ip`` (asked in a subprocess: this one stays unconnected)."""
    probe = (f"import ray; ray.init(address={address!r}, log_to_driver=False); "
             f"print(any(n['Alive'] and n['NodeManagerAddress'] == {ip!r} for n in ray.nodes()))")
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        assert proc.poll() is None, log.read_text()[-3000:]
        out = subprocess.run([sys.executable, "-c", probe], check=False, capture_output=True, text=True, timeout=120).stdout
        if out.strip().endswith("True"):
            return
        time.sleep(1)
    raise AssertionError(f"node {ip} did not join {address}: {log.read_text()[-3000:]}")


def dashboard(address: str) -> str:
    """``HOST:PORT`` of the dashboard of the cluster at ``address`` (asked in a subprocess); empty if none."""
    probe = f"import ray; print(ray.init(address={address!r}, log_to_driver=False).dashboard_url or '')"
    return subprocess.run([sys.executable, "-c", probe], check=True, capture_output=True, text=True, timeout=120).stdout.strip()


def raylet_pid(mark: str) -> int:
    """The raylet among a node's marked processes."""
    (pid,) = [pid for pid in marked_pids(mark) if "/raylet" in _cmdline(pid).split(" ", 1)[0]]
    return pid


def node_of(pid: int) -> tuple[str, str] | None:
    """``(node_ip, node_id)`` of the raylet ``pid`` descends from (its actor worker's parent), if any."""
    while pid > 1:
        args = _cmdline(pid).split(" ")
        if "/raylet" in args[0]:
            flags = dict(a.removeprefix("--").split("=", 1) for a in args[1:] if a.startswith("--") and "=" in a)
            return flags["node_ip_address"], flags["node_id"]
        try:
            pid = int(Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[1])
        except (OSError, IndexError, ValueError):
            return None
    return None


def _cmdline(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace").strip()
    except OSError:
        return ""
