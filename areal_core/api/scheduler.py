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
    devices: tuple[int, ...] = ()  # accelerator indices, exposed via platform.visible_devices_env
    log_file: str | None = None  # stdout+stderr go here when set


class ProcessDiedError(ProcessFailedError):
    """A compute-plane process exited while the run still needed it."""


class ProcessHandle(abc.ABC):
    name: str
    log_file: str | None = None

    @abc.abstractmethod
    def alive(self) -> bool: ...

    @abc.abstractmethod
    def returncode(self) -> int | None: ...

    @abc.abstractmethod
    def stop(self, timeout: float = 10.0) -> None:
        """Terminate the process and its children; kill after ``timeout`` seconds."""


class Scheduler(abc.ABC):
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
