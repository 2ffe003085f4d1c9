"""HTTP client pieces shared by inference-engine clients (``hf``, ``vllm``, ...).

:class:`HTTPServerEngine` is their common base. Its parts: a pause gate that holds async generation between ``pause()`` and ``resume()``, a router that
pins request ids to servers, blocking JSON POSTs (one server or all in parallel) that turn
failures into one-line errors, and a start-up wait that reports a dead server's log tail.
"""

from __future__ import annotations

import abc
import asyncio
import collections
import functools
import json
import os
import secrets
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import TYPE_CHECKING, Any, ClassVar

import attrs

from areal_core.engine import InferenceEngine
from areal_core.errors import ArealError, ConfigError
from areal_core.scheduler.base import ProcessHandle, ProcessSpec, free_port, log_tail
from areal_core.scheduler.devices import server_devices

if TYPE_CHECKING:
    from areal_core.config import Config
    from areal_core.platform import Platform
    from areal_core.scheduler.base import Scheduler


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


class HTTPServerEngine(InferenceEngine):
    """Client half shared by engines whose servers speak HTTP (``hf``, ``vllm``): a bearer token,
    server addresses, request pinning, the pause gate, parallel control calls, and launching
    servers through a scheduler. Subclasses describe their server process and routes."""

    server_label: ClassVar[str] = "server"  # for error messages: "<label> 127.0.0.1:port ..."
    token_env: ClassVar[str] = ""  # env var carrying the bearer token to the server
    pause_route: ClassVar[str] = ""  # aborts in-flight requests and holds new ones
    resume_route: ClassVar[str] = ""

    def __init__(self, config: Config, platform: Platform) -> None:
        super().__init__(config, platform)
        self.token = os.environ.get(self.token_env) or secrets.token_hex(16)
        self.addresses: list[str] = []
        self._router = Router(1)
        self._gate = PauseGate()

    @abc.abstractmethod
    def server_spec(self, index: int, port: int, run_dir: Path) -> ProcessSpec:
        """How to start server ``index`` on ``port`` (its log goes under ``run_dir/logs``)."""

    @abc.abstractmethod
    def server_is_up(self, address: str) -> bool:
        """True once the server at ``address`` answers its health check."""

    def launch_servers(self, scheduler: Scheduler) -> list[str]:
        if not self.config.model.path:
            raise ConfigError("model.path", f"the {self.name} engine needs a model directory (tiny models: ensure_tiny_model)")
        run_dir = self.config.run_dir.resolve()
        (run_dir / "logs").mkdir(parents=True, exist_ok=True)
        started = []
        for index in range(self.config.rollout.servers):
            port = free_port()
            spec = self.server_spec(index, port, run_dir)
            if not spec.devices:
                spec = attrs.evolve(spec, devices=server_devices(self.config, self.platform, index))
            started.append((f"127.0.0.1:{port}", scheduler.start(spec), Path(spec.log_file or "")))
        deadline = time.monotonic() + self.config.rollout.server_startup_timeout
        for address, handle, log_file in started:
            up = functools.partial(self.server_is_up, address)
            wait_healthy(up, handle, address, log_file, deadline, self.server_label)
        self.attach([address for address, _, _ in started])
        return list(self.addresses)

    def attach(self, addresses: list[str]) -> None:
        if not addresses:
            raise ValueError("attach() needs at least one server address (host:port)")
        self.addresses = list(addresses)
        self._router = Router(len(addresses))

    def health(self) -> list[bool]:
        return [self.server_is_up(address) for address in self.addresses]

    def pause(self) -> None:
        self._gate.close()
        self._broadcast(self.pause_route, {})

    def resume(self) -> None:
        self._broadcast(self.resume_route, {})
        self._gate.open()

    def close(self) -> None:
        """Nothing to release: sessions live per ``agenerate`` call, control calls are one-shot."""

    def _headers(self) -> dict[str, str]:
        return {"Authorization": f"Bearer {self.token}"}

    def _broadcast(self, endpoint: str, body: dict[str, Any]) -> list[dict[str, Any]]:
        """POST the same ``body`` to every server."""
        return self._fan_out(endpoint, [body] * len(self.addresses))

    def _fan_out(self, endpoint: str, bodies: list[dict[str, Any]]) -> list[dict[str, Any]]:
        """POST ``bodies[i]`` to server ``i`` (in parallel); raise on the first failure."""
        timeout = self.config.rollout.request_timeout
        return fan_out(self.addresses, endpoint, bodies, self._headers(), timeout, self.server_label)
