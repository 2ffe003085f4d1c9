"""Local scheduler: each process is a subprocess in its own session, stopped with its children."""

from __future__ import annotations

import atexit
import contextlib
import ctypes
import functools
import os
import signal
import subprocess
import time
import weakref
from typing import Iterable, Iterator, Mapping, Sequence

from areal_core.api.errors import ArealError
from areal_core.api.platform import Platform
from areal_core.api.scheduler import ProcessHandle, ProcessSpec, Scheduler, fill_addresses, node_addresses
from areal_core.api.devices import physical_devices

_THREAD_VARS = ("OMP_NUM_THREADS", "MKL_NUM_THREADS", "OPENBLAS_NUM_THREADS", "AREAL_NUM_THREADS")


class LocalProcess(ProcessHandle):
    def __init__(
        self, name: str, popen: subprocess.Popen, log_file: str | None, host: str = "127.0.0.1", port: int | None = None
    ) -> None:
        self.name = name
        self.popen = popen
        self.log_file = log_file
        self.host, self.port = host, port

    @property
    def pid(self) -> int:
        return self.popen.pid

    def alive(self) -> bool:
        return self.popen.poll() is None

    def returncode(self) -> int | None:
        return self.popen.poll()

    def stop(self, timeout: float = 10.0) -> None:
        """SIGTERM the process's group, SIGKILL after ``timeout``; then SIGKILL what is left of
        the group (children of a leader that died first, e.g. by SIGKILL, would run on as orphans)."""
        if self.popen.poll() is None:
            _signal_group(self.popen.pid, signal.SIGTERM)
            try:
                self.popen.wait(timeout)
            except subprocess.TimeoutExpired:
                pass
        _signal_group(self.popen.pid, signal.SIGKILL)
        self.popen.wait()


_PR_SET_PDEATHSIG = 1


def die_with_parent() -> None:
    """``preexec_fn``: the child gets SIGTERM when its parent dies, even by SIGKILL (Linux)."""
    try:
        ctypes.CDLL("libc.so.6", use_errno=True).prctl(_PR_SET_PDEATHSIG, signal.SIGTERM)
    except OSError:  # not Linux: the atexit/stop_all path still applies
        pass


def _prepare_child(cpus: tuple[int, ...]) -> None:
    """``preexec_fn``: die with the parent, and run on ``cpus`` (inherited by every thread and child)."""
    die_with_parent()
    if cpus:
        os.sched_setaffinity(0, cpus)


@contextlib.contextmanager
def pinned(cpus: Sequence[int]) -> Iterator[None]:
    """Every thread of this process, and every thread or process it starts meanwhile, on ``cpus``;
    after, each thread back on the cores the process had before (Linux pins threads one by one)."""
    before = os.sched_getaffinity(0)
    _pin_threads(cpus)
    try:
        yield
    finally:
        _pin_threads(before)


def _pin_threads(cpus: Iterable[int]) -> None:
    for tid in os.listdir("/proc/self/task"):
        with contextlib.suppress(ProcessLookupError):  # a thread that ended meanwhile
            os.sched_setaffinity(int(tid), cpus)


def spawn(
    spec: ProcessSpec,
    base_env: Mapping[str, str],
    visible_devices_env: str | None,
    devices: Sequence[int | str],
    cwd: str | None = None,
) -> subprocess.Popen:
    """Start ``spec.cmd`` in its own session: ``base_env`` plus the thread variables, the visible
    ``devices`` and ``spec.env``; output to ``spec.log_file``; pinned to ``spec.cpus``; dies with its parent."""
    env = dict(base_env)
    env.update({var: str(spec.threads) for var in _THREAD_VARS})
    if visible_devices_env and devices:
        env[visible_devices_env] = ",".join(map(str, devices))
    env.update(spec.env)
    out = open(spec.log_file, "ab") if spec.log_file else None  # noqa: SIM115 - owned by Popen
    try:
        return subprocess.Popen(
            spec.cmd,
            env=env,
            cwd=cwd,
            stdout=out,
            stderr=subprocess.STDOUT if out else None,
            stdin=subprocess.DEVNULL,
            start_new_session=True,  # own process group: stop() reaches its children too
            preexec_fn=functools.partial(_prepare_child, spec.cpus),  # no orphans if the parent is killed
        )
    finally:
        if out:
            out.close()


def _signal_group(pid: int, sig: int) -> None:
    try:
        os.killpg(pid, sig)
    except (ProcessLookupError, PermissionError):
        pass


class LocalScheduler(Scheduler):
    """Starts processes on this machine; an ``atexit`` hook stops any left running.

    Listeners bind ``bind_host`` (``cluster.bind_host``; empty: 127.0.0.1, this machine only)."""

    def __init__(self, platform: Platform, bind_host: str = "") -> None:
        self.platform = platform
        self.bind_host, self.host = node_addresses(bind_host, "127.0.0.1")
        self.processes: list[LocalProcess] = []  # stop_all() stops them in start order
        ref = weakref.ref(self)
        atexit.register(lambda: ref() and ref().stop_all())

    def start(self, spec: ProcessSpec) -> LocalProcess:
        var = self.platform.visible_devices_env
        devices: Sequence[int | str] = spec.devices
        if var and spec.devices:
            visible = os.environ.get(var)
            count = None if visible else _device_count(self.platform)
            try:
                devices = physical_devices(spec.devices, visible, var, count)
            except ArealError as exc:
                raise ArealError(f"cannot start {spec.name}: {exc}") from None
        spec, port = fill_addresses(spec, self.bind_host, self.host)
        popen = spawn(spec, os.environ, var, devices)
        handle = LocalProcess(spec.name, popen, spec.log_file, self.host, port)
        self.processes.append(handle)
        return handle

    @property
    def handles(self) -> list[LocalProcess]:
        return list(self.processes)

    def stop_all(self) -> None:
        """Stop every process as :meth:`LocalProcess.stop` does, all groups signalled at once."""
        for proc in self.processes:
            if proc.alive():
                _signal_group(proc.pid, signal.SIGTERM)
        deadline = time.monotonic() + 10
        for proc in self.processes:
            try:
                proc.popen.wait(max(0.0, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                pass
            _signal_group(proc.pid, signal.SIGKILL)  # a dead leader's children, or a leader that would not stop
            proc.popen.wait()


def _device_count(platform: Platform) -> int | None:
    """How many devices this process sees, or None where the platform cannot say (not activated)."""
    try:
        return platform.device_count()
    except (ArealError, RuntimeError, NotImplementedError):
        return None
