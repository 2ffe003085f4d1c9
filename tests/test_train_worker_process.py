"""Process-level settings of a training worker: TCP without Nagle's algorithm on its connection to
the controller (a train step's batch is a header write and a body write; with Nagle the body waited
~40 ms for a delayed ACK), denormal floats flushed to zero (in the worker process only)."""

from __future__ import annotations

import socket
import subprocess
import sys
import threading
from multiprocessing.connection import Client, Listener

from areal_core.train.worker import no_delay


def _nodelay(conn) -> int:
    sock = socket.socket(fileno=conn.fileno())
    try:
        return sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY)
    finally:
        sock.detach()


def test_no_delay_turns_nagle_off_on_both_ends_and_the_connection_still_works():
    with Listener(("127.0.0.1", 0), authkey=b"k") as listener:
        accepted = []
        thread = threading.Thread(target=lambda: accepted.append(listener.accept()))
        thread.start()
        client = Client(listener.address, authkey=b"k")
        thread.join(10)
        server = accepted[0]
        assert _nodelay(client) == 0 and _nodelay(server) == 0  # the default: what the fix changes
        assert no_delay(client) is client and no_delay(server) is server
        assert _nodelay(client) != 0 and _nodelay(server) != 0
        payload = b"x" * 100_000  # over multiprocessing's 16 KiB single-write limit
        client.send_bytes(payload)
        assert server.recv_bytes() == payload
        client.close()
        server.close()


def test_no_delay_leaves_a_non_tcp_connection_alone():
    with Listener(family="AF_UNIX", authkey=b"k") as listener:
        accepted = []
        thread = threading.Thread(target=lambda: accepted.append(listener.accept()))
        thread.start()
        client = Client(listener.address, family="AF_UNIX", authkey=b"k")
        thread.join(10)
        assert no_delay(client) is client
        client.send("hello")
        assert accepted[0].recv() == "hello"
        client.close()
        accepted[0].close()


def test_the_worker_flushes_denormals_without_numpy_warning_and_the_test_process_does_not():
    import torch

    assert torch.tensor(1e-40).item() != 0.0  # here (pytest, hypothesis): subnormals stay
    code = (
        "import warnings; warnings.simplefilter('error')\n"
        "from areal_core.train.worker import _flush_denormals; _flush_denormals()\n"
        "import numpy, torch\n"
        "assert torch.tensor(1e-40).item() == 0.0\n"
        "numpy.finfo(numpy.float32).smallest_subnormal\n"  # would warn if computed after the flush
    )
    subprocess.run([sys.executable, "-c", code], check=True, timeout=120)
