"""The control endpoint of a running job: list, add and remove inference servers at run time.

While a job runs, its controller serves a small JSON API on ``127.0.0.1`` and writes the address
and a fresh bearer token to ``{run_dir}/control.json`` (mode 0600, removed at exit). The
``areal servers`` commands read that file and call:

- ``GET /servers``: ``{"servers": [{"address", "state"}, ...]}``;
- ``POST /servers/add`` ``{"count": n}``: start ``n`` servers, return once they are up
  (``{"added": [...]}``); each gets traffic after it has loaded the current weights;
- ``POST /servers/remove`` ``{"address": a}``: ``{"removed": true|false}``;
- ``POST /servers/probe`` ``{"input_ids": [...], "max_new_tokens": n}``: greedy output,
  log-probs and weight versions of every serving server (``{"results": [...]}``).
"""

from __future__ import annotations

import hmac
import json
import os
import secrets
import threading
import urllib.error
import urllib.request
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import TYPE_CHECKING, Any

from areal_core.api.errors import ArealError

if TYPE_CHECKING:
    from areal_core.rollout.fleet import ServerFleet

CONTROL_FILE = "control.json"
MAX_ADD = 16  # servers one call may add


class ControlServer:
    """Serves the control API for ``fleet`` until ``stop`` (a context manager)."""

    def __init__(self, fleet: ServerFleet, run_dir: str | Path) -> None:
        self.fleet = fleet
        self.path = Path(run_dir) / CONTROL_FILE
        self.token = secrets.token_hex(16)
        self._http: ThreadingHTTPServer | None = None
        self._thread: threading.Thread | None = None

    @property
    def address(self) -> str:
        if self._http is None:
            raise RuntimeError("the control server is not running")
        host, port = self._http.server_address[:2]
        return f"{host}:{port}"

    def start(self) -> None:
        self._http = ThreadingHTTPServer(("127.0.0.1", 0), _handler(self))
        self._http.daemon_threads = True
        self._thread = threading.Thread(target=self._http.serve_forever, name="control", daemon=True)
        self._thread.start()
        _write_private(self.path, {"address": self.address, "token": self.token, "pid": os.getpid()})

    def stop(self) -> None:
        if self._http is None:
            return
        try:
            if json.loads(self.path.read_text()).get("token") == self.token:  # not a newer job's file
                self.path.unlink()
        except (OSError, ValueError):
            pass
        self._http.shutdown()
        self._http.server_close()
        self._http = None

    def __enter__(self) -> ControlServer:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def handle(self, method: str, route: str, body: dict[str, Any]) -> dict[str, Any]:
        """One API call; ValueError for a bad request, ArealError for a failed action."""
        fleet = self.fleet
        if (method, route) == ("GET", "/servers"):
            return {"servers": fleet.servers()}
        if (method, route) == ("POST", "/servers/add"):
            count = body.get("count", 1)
            if not isinstance(count, int) or not 1 <= count <= MAX_ADD:
                raise ValueError(f"count={count!r}: give an integer from 1 to {MAX_ADD}")
            return {"added": [fleet.add_server() for _ in range(count)]}
        if (method, route) == ("POST", "/servers/remove"):
            address = body.get("address")
            if not isinstance(address, str):
                raise ValueError("address: give the host:port of a server (see GET /servers)")
            return {"removed": fleet.remove_server(address)}
        if (method, route) == ("POST", "/servers/probe"):
            ids, n = body.get("input_ids"), body.get("max_new_tokens", 8)
            if not isinstance(ids, list) or not ids or not all(isinstance(i, int) for i in ids):
                raise ValueError("input_ids: give a non-empty list of token ids")
            if not isinstance(n, int) or n < 1:
                raise ValueError(f"max_new_tokens={n!r}: give an integer >= 1")
            return {"results": fleet.probe(ids, n)}
        raise LookupError(f"no route {method} {route}")


def _handler(server: ControlServer) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            self._serve("GET")

        def do_POST(self) -> None:
            self._serve("POST")

        def _serve(self, method: str) -> None:
            given = self.headers.get("Authorization", "")
            if not hmac.compare_digest(given.encode(), f"Bearer {server.token}".encode()):
                self._reply(401, {"error": "missing or wrong bearer token (see control.json)"})
                return
            try:
                length = int(self.headers.get("Content-Length") or 0)
                body = json.loads(self.rfile.read(length) or b"{}") if length else {}
                if not isinstance(body, dict):
                    raise ValueError("the request body must be a JSON object")
                self._reply(200, server.handle(method, self.path, body))
            except LookupError as exc:
                self._reply(404, {"error": str(exc)})
            except ValueError as exc:
                self._reply(400, {"error": str(exc)})
            except (ArealError, NotImplementedError) as exc:
                self._reply(500, {"error": str(exc)})

        def _reply(self, status: int, payload: dict[str, Any]) -> None:
            data = json.dumps(payload).encode()
            self.send_response(status)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def log_message(self, format: str, *args: Any) -> None:
            """Quiet: the job's log is not the place for each control request."""

    return Handler


def _write_private(path: Path, payload: dict[str, Any]) -> None:
    """Write ``payload`` as JSON, readable by the owner only, replacing ``path`` atomically."""
    tmp = path.with_name(f".{path.name}.{os.getpid()}")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as f:
        json.dump(payload, f)
    os.replace(tmp, path)


def _alive(pid: object) -> bool:
    if not isinstance(pid, int) or pid <= 0:
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # someone else's process
        return True
    return True


def remove_stale_control(run_dir: str | Path) -> int | None:
    """Remove ``run_dir/control.json`` if the process that wrote it is gone; its pid, else None."""
    path = Path(run_dir) / CONTROL_FILE
    try:
        pid = json.loads(path.read_text()).get("pid")
    except (OSError, ValueError, AttributeError):
        return None
    if _alive(pid):
        return None
    path.unlink(missing_ok=True)
    return pid


def control_call(
    run_dir: str | Path, method: str, route: str, body: dict[str, Any] | None = None, timeout: float = 600.0
) -> dict[str, Any]:
    """Call the control API of the job running in ``run_dir``; ArealError with a one-line reason."""
    path = Path(run_dir) / CONTROL_FILE
    stale_pid = remove_stale_control(run_dir)
    if stale_pid is not None:
        raise ArealError(
            f"no running job in {run_dir}: its {CONTROL_FILE} was left by process {stale_pid}, which is gone "
            "(killed?); removed it"
        )
    try:
        info = json.loads(path.read_text())
    except FileNotFoundError:
        raise ArealError(f"no running job in {run_dir} ({CONTROL_FILE} not found); give the run directory of a running job") from None
    except (OSError, ValueError) as exc:
        raise ArealError(f"cannot read {path}: {exc}") from None
    request = urllib.request.Request(
        f"http://{info['address']}{route}",
        data=None if method == "GET" else json.dumps(body or {}).encode(),
        headers={"Authorization": f"Bearer {info['token']}", "Content-Type": "application/json"},
        method=method,
    )
    try:
        with urllib.request.urlopen(request, timeout=timeout) as resp:
            return json.loads(resp.read())
    except urllib.error.HTTPError as exc:
        try:
            message = json.loads(exc.read()).get("error")
        except ValueError:
            message = exc.reason
        raise ArealError(f"{method} {route} on the job in {run_dir} failed ({exc.code}): {message}") from None
    except OSError as exc:
        raise ArealError(f"the job in {run_dir} does not answer at {info['address']} ({exc}); is it still running?") from None
