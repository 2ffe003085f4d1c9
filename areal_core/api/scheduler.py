"""Scheduler interface: start named processes with their share of threads/devices, stop them all."""

from __future__ import annotations

import abc
import socket
from collections.abc import Collection
from pathlib import Path

import attrs

from areal_core.api.errors import ProcessFailedError


@attrs.frozen(kw_only=True)
class ProcessSpec:
    name: str  # unique, e.g. "server0", "trainer1"
    cmd: list[str]
    env: dict[str, str] = attrs.Factory(dict)
    threads: int = 1  # CPU threads the process may use (OMP/MKL/torch)
    cpus: tuple[int, ...] = ()  # CPU cores it (its threads and children) is pinned to; (): not pinned
    devices: tuple[int, ...] = ()  # accelerator indices, exposed via platform.visible_devices_env
    log_file: str | None = None  # stdout+stderr go here when set
    role: str = ""  # "server" or "trainer": the ray scheduler adds that role's node resources


#: Placeholders in a spec's arguments and environment values, filled in on the node the process runs
#: on: the address to bind (``cluster.bind_host``, else the node's), the address other nodes reach
#: it at, and a port that was free there. The handle reports the last two as ``host`` and ``port``.
BIND_HOST = "{areal:bind_host}"
HOST = "{areal:host}"
PORT = "{areal:port}"
NODE_HOST_ENV = "AREAL_NODE_HOST"  # every process learns its node's advertised address here
_WILDCARDS = ("0.0.0.0",)


def node_addresses(bind_host: str, node_ip: str) -> tuple[str, str]:
    """``(bind, advertised)`` on a node whose own address is ``node_ip``: ``bind_host`` if set (a
    wildcard is advertised as ``node_ip``), else ``node_ip`` for both."""
    if not bind_host:
        return node_ip, node_ip
    return bind_host, node_ip if bind_host in _WILDCARDS else bind_host


def fill_addresses(spec: ProcessSpec, bind: str, advertised: str) -> tuple[ProcessSpec, int | None]:
    """``spec`` with the address placeholders filled in and :data:`NODE_HOST_ENV` set, and the port
    chosen (None if not asked for)."""
    texts = [*spec.cmd, *spec.env.values()]
    port = free_port(bind) if any(PORT in text for text in texts) else None
    values = {BIND_HOST: bind, HOST: advertised, PORT: str(port)}

    def fill(text: str) -> str:
        for placeholder, value in values.items():
            text = text.replace(placeholder, value)
        return text

    filled = attrs.evolve(spec, cmd=[fill(a) for a in spec.cmd], env={NODE_HOST_ENV: advertised, **{k: fill(v) for k, v in spec.env.items()}})
    return filled, port


class ProcessDiedError(ProcessFailedError):
    """A compute-plane process exited while the run still needed it."""


class ProcessHandle(abc.ABC):
    name: str
    log_file: str | None = None
    host: str = "127.0.0.1"  # the address other nodes reach the process at
    port: int | None = None  # the port chosen for its PORT placeholder

    @abc.abstractmethod
    def alive(self) -> bool: ...

    @abc.abstractmethod
    def returncode(self) -> int | None: ...

    @abc.abstractmethod
    def stop(self, timeout: float = 10.0) -> None:
        """Terminate the process and its children; kill after ``timeout`` seconds."""


class Scheduler(abc.ABC):
    #: What the controller's own listeners bind, and the address processes reach them at.
    bind_host: str = "127.0.0.1"
    host: str = "127.0.0.1"

    @abc.abstractmethod
    def start(self, spec: ProcessSpec) -> ProcessHandle: ...

    @property
    @abc.abstractmethod
    def handles(self) -> list[ProcessHandle]:
        """Every process started so far."""

    def check_alive(self, exclude: Collection[ProcessHandle] = ()) -> None:
        """Raise :class:`ProcessDiedError` naming the first started process that has exited, except
        those in ``exclude`` (e.g. inference servers, whose loss the server fleet handles)."""
        for handle in self.handles:
            if any(handle is other for other in exclude):
                continue
            code = handle.returncode()
            if code is not None:
                where = f"; see {handle.log_file}" if handle.log_file else ""
                raise ProcessDiedError(f"{handle.name} exited with code {code}{where}")

    @abc.abstractmethod
    def stop_all(self) -> None:
        """Stop every process this scheduler started (idempotent)."""

    def __enter__(self) -> "Scheduler":
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop_all()


def free_port(host: str = "127.0.0.1") -> int:
    """A TCP port that was free a moment ago (the OS picks it; a small race remains)."""
    with socket.socket() as sock:
        sock.bind((host, 0))
        return sock.getsockname()[1]


def log_tail(path: str | Path, lines: int = 30) -> str:
    """The last ``lines`` lines of a process log, indented for inclusion in an error message."""
    try:
        text = Path(path).read_text(errors="replace").splitlines()[-lines:]
    except OSError:
        text = []
    return "\n".join(f"  | {line}" for line in text) or "  | (empty log)"
