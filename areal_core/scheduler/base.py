"""Scheduler interface: start named processes with their share of threads/devices, stop them all."""

from __future__ import annotations

import abc

import attrs


@attrs.frozen(kw_only=True)
class ProcessSpec:
    name: str  # unique, e.g. "server0", "trainer1"
    cmd: list[str]
    env: dict[str, str] = attrs.Factory(dict)
    threads: int = 1  # CPU threads the process may use (OMP/MKL/torch)
    devices: tuple[int, ...] = ()  # accelerator indices, exposed via platform.visible_devices_env
    log_file: str | None = None  # stdout+stderr go here when set


class ProcessHandle(abc.ABC):
    name: str

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

    @abc.abstractmethod
    def stop_all(self) -> None:
        """Stop every process this scheduler started (idempotent)."""

    def __enter__(self) -> "Scheduler":
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop_all()
