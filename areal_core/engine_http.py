"""HTTP client pieces shared by inference-engine clients (``hf``, ``vllm``, ...).

A pause gate that holds async generation between ``pause()`` and ``resume()``, a router that
pins request ids to servers, blocking JSON POSTs (one server or all in parallel) that turn
failures into one-line errors, and a start-up wait that reports a dead server's log tail.
"""

from __future__ import annotations

import asyncio
import collections
import json
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

from areal_core.errors import ArealError
from areal_core.scheduler.base import ProcessHandle, log_tail


class PauseGate:
    """Holds async callers (on any event loop) while closed; opened and closed from any thread."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._closed = False
        self._waiters: list[tuple[asyncio.AbstractEventLoop, asyncio.Future]] = []

    def close(self) -> None:
        with self._lock:
            self._closed = True

    def open(self) -> None:
        with self._lock:
            self._closed = False
            waiters, self._waiters = self._waiters, []
        for loop, future in waiters:
            try:
                loop.call_soon_threadsafe(_release, future)
            except RuntimeError:  # that loop has closed; nobody is waiting there any more
                pass

    async def wait(self) -> None:
        with self._lock:
            if not self._closed:
                return
            loop = asyncio.get_running_loop()
            future = loop.create_future()
            self._waiters.append((loop, future))
        await future


def _release(future: asyncio.Future) -> None:
    if not future.done():
        future.set_result(None)


class Router:
    """Pins each request id to one server; a new id goes to the least-loaded server (round robin on ties)."""

    def __init__(self, n_servers: int, max_pins: int = 100_000) -> None:
        self._lock = threading.Lock()
        self._load = [0] * n_servers
        self._pins: collections.OrderedDict[str, int] = collections.OrderedDict()
        self._next = 0
        self._max_pins = max_pins

    def acquire(self, request_id: str) -> int:
        with self._lock:
            server = self._pins.get(request_id)
            if server is None:
                n = len(self._load)
                server = min(range(n), key=lambda i: (self._load[i], (i - self._next) % n))
                self._next = (server + 1) % n
                if len(self._pins) >= self._max_pins:
                    self._pins.popitem(last=False)
            self._pins[request_id] = server
            self._pins.move_to_end(request_id)
            self._load[server] += 1
            return server

    def release(self, server: int) -> None:
        with self._lock:
            self._load[server] -= 1


def post_json(
    address: str, endpoint: str, body: dict[str, Any], headers: dict[str, str], timeout: float, label: str
) -> dict[str, Any]:
    """POST ``body`` to ``http://{address}{endpoint}``; ArealError naming ``label`` (e.g. "hf server") on failure."""
    request = urllib.request.Request(
        f"http://{address}{endpoint}",
        data=json.dumps(body).encode(),
        headers={"Content-Type": "application/json", **headers},
        method="POST",
    )
    try:
        with urllib.request.urlopen(request, timeout=timeout) as resp:
            return json.loads(resp.read() or b"{}")
    except urllib.error.HTTPError as exc:
        raw = exc.read()
        try:
            decoded = json.loads(raw)
            message = decoded.get("error") or decoded.get("detail") or decoded if isinstance(decoded, dict) else decoded
        except ValueError:
            message = raw.decode(errors="replace")[:500] or exc.reason
        raise ArealError(f"{label} {address} {endpoint} failed ({exc.code}): {message}") from None
    except OSError as exc:
        raise ArealError(f"{label} {address} {endpoint} is unreachable: {exc}") from None


def fan_out(
    addresses: Sequence[str],
    endpoint: str,
    bodies: Sequence[dict[str, Any]],
    headers: dict[str, str],
    timeout: float,
    label: str,
) -> list[dict[str, Any]]:
    """POST ``bodies[i]`` to ``addresses[i]`` in parallel; raise the first failure."""
    if not addresses:
        raise ArealError(f"no {label}s attached; call launch_servers() or attach() first")
    with ThreadPoolExecutor(max_workers=len(addresses)) as pool:
        futures = [
            pool.submit(post_json, address, endpoint, body, headers, timeout, label)
            for address, body in zip(addresses, bodies)
        ]
        return [future.result() for future in futures]


def wait_healthy(
    ready: Callable[[], bool], handle: ProcessHandle, address: str, log_file: Path, deadline: float, label: str
) -> None:
    """Poll ``ready()`` until true; ArealError with the log tail if the process dies or ``deadline`` passes."""
    while not ready():
        if not handle.alive():
            raise ArealError(
                f"{label} {handle.name} ({address}) exited with code {handle.returncode()} during start-up; "
                f"log tail of {log_file}:\n{log_tail(log_file)}"
            )
        if time.monotonic() > deadline:
            raise ArealError(
                f"{label} {handle.name} ({address}) not healthy within rollout.server_startup_timeout; "
                f"raise it or check {log_file}:\n{log_tail(log_file)}"
            )
        time.sleep(0.2)
