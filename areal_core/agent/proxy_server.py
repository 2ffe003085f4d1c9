"""Serves an agent proxy's OpenAI-compatible app (:mod:`areal_core.agent.http`) with uvicorn."""

from __future__ import annotations

import socket
import threading
import time
from typing import TYPE_CHECKING, Any

from areal_core.api.errors import ArealError

if TYPE_CHECKING:
    from typing_extensions import Self  # typing.Self needs Python 3.11

    from areal_core.agent.proxy import AgentProxy

KEEP_ALIVE_S = 600


class ProxyServer:
    """Serves an :class:`AgentProxy` with uvicorn on a background thread (idempotent start/close)."""

    def __init__(self, proxy: AgentProxy, host: str = "127.0.0.1", port: int = 0, startup_timeout: float = 60.0) -> None:
        self.proxy = proxy
        self.host, self.port = host, port
        self.startup_timeout = startup_timeout
        self._lock = threading.Lock()
        self._server: Any = None
        self._thread: threading.Thread | None = None

    @property
    def started(self) -> bool:
        return self._server is not None

    @property
    def base_url(self) -> str:
        if self._server is None:
            raise RuntimeError("the proxy server is not running; call start() first")
        return f"http://{self.host}:{self.port}/v1"

    def start(self) -> str:
        """Bind, serve, wait until it accepts requests; returns the OpenAI ``base_url``."""
        import uvicorn

        from areal_core.agent.http import build_app

        with self._lock:
            if self._server is not None:
                return self.base_url
            sock = socket.socket(socket.AF_INET6 if ":" in self.host else socket.AF_INET)
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            try:
                sock.bind((self.host, self.port))
            except OSError as exc:
                sock.close()
                raise ArealError(f"agent proxy cannot bind {self.host}:{self.port} ({exc}); set agent.port/agent.host") from None
            self.port = sock.getsockname()[1]
            config = uvicorn.Config(
                build_app(self.proxy),
                log_level="warning",
                lifespan="off",
                access_log=False,
                # agents pause while weights update; closing idle keep-alive connections under a
                # client about to reuse one is a race that surfaces as agent connection errors
                timeout_keep_alive=KEEP_ALIVE_S,
                timeout_graceful_shutdown=5,  # calls left waiting on a stopped rollout loop never finish
            )
            server = uvicorn.Server(config)
            thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, name="agent-proxy", daemon=True)
            thread.start()
            deadline = time.monotonic() + self.startup_timeout
            while not server.started:
                if not thread.is_alive() or time.monotonic() > deadline:
                    server.should_exit = True
                    sock.close()
                    raise ArealError(f"agent proxy on {self.host}:{self.port} did not start; see the log above")
                time.sleep(0.01)
            self._server, self._thread = server, thread
            return self.base_url

    def close(self) -> None:
        with self._lock:
            server, thread = self._server, self._thread
            self._server = self._thread = None
        if server is not None and thread is not None:
            server.should_exit = True
            thread.join(timeout=30)

    def __enter__(self) -> Self:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
