"""Ray scheduler (``scheduler: ray``): each process runs under a Ray actor on a placement-group bundle.

It connects to the cluster at ``ray.address`` (``auto``: ``RAY_ADDRESS``, the job's cluster under
``ray job submit``, or the cluster that ``ray start --head`` started). The first
:meth:`RayScheduler.start` reserves one placement group for the job the config describes --
``rollout.servers`` bundles shaped like a server and ``actor.world_size`` shaped like a training
worker, placed on the nodes Ray picks under ``ray.placement_strategy`` -- and every start takes a
free bundle of its spec's shape: ``{"CPU": threads}`` plus ``len(devices)`` of the platform's Ray
key (``GPU``, ``NPU``) plus its role's ``ray.server_resources``/``ray.trainer_resources``. A
process beyond those (a server added or restarted at run time) gets a one-bundle group of its own,
removed when it stops; a stopped process's bundle in the job's group is reused (when its node died,
Ray moves the bundle to a node that has room, and the replacement starts there). Specs arrive one at a time exactly as with ``local``, so the controller code above
the scheduler is the same.

The actor (:class:`ProcessRunner`) starts the command the way ``local`` does (its own session,
thread variables, log file, parent-death signal), with the controller's environment and, on an
accelerator, the device ids Ray assigned to the actor: ``spec.devices`` only says how many.
Liveness and stop go through the actor; an actor that died counts as a dead process.

Addresses come from the node: the actor fills the spec's address placeholders
(:data:`~areal_core.api.scheduler.BIND_HOST`, ``HOST``, ``PORT``) with ``cluster.bind_host`` or
the node IP Ray reports, and a port free there; the handle advertises that node address. With
``actor.weight_update=disk`` every process's node must see the controller's ``fileroot``: for a
process on another node than the controller's, the controller writes a probe file in the run
directory (once) and the actor reads it before its process starts.
"""

from __future__ import annotations

import atexit
import functools
import logging
import os
import secrets
import signal
import socket
import threading
import weakref
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable

import attrs

from areal_core.api.errors import ArealError, ConfigError
from areal_core.api.scheduler import ProcessHandle, ProcessSpec, Scheduler, fill_addresses, node_addresses
from areal_core.scheduler.local import LocalProcess, spawn

if TYPE_CHECKING:
    from areal_core.config import Config
    from areal_core.api.platform import Platform

ACTOR_LOST = -1  # returncode of a process whose actor died: its own exit code is unknown
_RPC_TIMEOUT_S = 30.0  # a poll that takes longer (the actor is busy stopping) reports "still running"
PROBE_FILE = ".areal-node-probe"  # in the run directory while the run lasts (disk weight updates)
_SHARED_FS_FIX = "use a shared filesystem or actor.weight_update=xccl"


@attrs.frozen
class Started:
    """Where :meth:`ProcessRunner.start` started its process."""

    pid: int
    host: str  # the address other nodes reach it at
    port: int | None  # the port filled in for the spec's PORT placeholder
    node_id: str  # the Ray node id


class ProcessRunner:
    """Body of the Ray actor that owns one process (run as ``ray.remote(ProcessRunner)``)."""

    def __init__(
        self,
        spec: ProcessSpec,
        env: dict[str, str],
        cwd: str,
        devices_env: str | None,
        ray_key: str | None,
        bind_host: str,
    ) -> None:
        self.spec, self.env, self.cwd = spec, env, cwd
        self.devices_env, self.ray_key, self.bind_host = devices_env, ray_key, bind_host
        self.process: LocalProcess | None = None

    def node_id(self) -> str:
        import ray

        return ray.get_runtime_context().get_node_id()

    def reads(self, path: str, content: str) -> str | None:
        """None if ``path`` holds ``content`` on this node, else this node's IP address."""
        import ray

        try:
            if Path(path).read_text() == content:
                return None
        except OSError:
            pass
        return ray.util.get_node_ip_address()

    def start(self) -> Started:
        """Fill in this node's addresses, then start the command."""
        import ray

        context = ray.get_runtime_context()
        devices = context.get_accelerator_ids().get(self.ray_key, []) if self.ray_key else []
        cwd = self.cwd if os.path.isdir(self.cwd) else None
        bind, host = node_addresses(self.bind_host, ray.util.get_node_ip_address())
        spec, port = fill_addresses(self.spec, bind, host)
        if spec.log_file:  # on a node without the controller's filesystem the log stays local
            Path(spec.log_file).parent.mkdir(parents=True, exist_ok=True)
        popen = spawn(spec, {**os.environ, **self.env}, self.devices_env, devices, cwd)
        self.process = LocalProcess(spec.name, popen, spec.log_file, host, port)
        return Started(popen.pid, host, port, context.get_node_id())

    def poll(self) -> int | None:
        return self.process.returncode() if self.process else None

    def stop(self, timeout: float) -> int | None:
        """SIGTERM the process group, SIGKILL after ``timeout``; returns the exit code."""
        if self.process is None:
            return None
        self.process.stop(timeout)
        return self.process.returncode()


@attrs.define(eq=False)
class _Bundle:
    group: Any  # ray.util.placement_group.PlacementGroup
    index: int
    shape: dict[str, float]
    own_group: bool  # a one-bundle group for one process: removed when it stops
    free: bool = True


class RayProcess(ProcessHandle):
    """A process started by :class:`RayScheduler`; ``host`` is the address of the node it runs on."""

    def __init__(
        self, name: str, actor: Any, started: Started, log_file: str | None, on_stop: Callable[[], None]
    ) -> None:
        self.name, self.actor, self.log_file = name, actor, log_file
        self.pid, self.host, self.port, self.node_id = started.pid, started.host, started.port, started.node_id
        self._on_stop = on_stop
        self._code: int | None = None
        self._stopped = False

    def returncode(self) -> int | None:
        import ray
        from ray.exceptions import GetTimeoutError, RayActorError

        if self._code is None:  # a stopped process always has its code
            try:
                self._code = ray.get(self.actor.poll.remote(), timeout=_RPC_TIMEOUT_S)
            except RayActorError:
                self._code = ACTOR_LOST
            except GetTimeoutError:
                return None
        return self._code

    def alive(self) -> bool:
        return self.returncode() is None

    def stop(self, timeout: float = 10.0) -> None:
        import ray
        from ray.exceptions import GetTimeoutError, RayActorError

        if self._stopped:
            return
        try:
            code = ray.get(self.actor.stop.remote(timeout), timeout=timeout + _RPC_TIMEOUT_S)
        except (RayActorError, GetTimeoutError):
            code = ACTOR_LOST
        self._finish(code)

    def _finish(self, code: int | None) -> None:
        """Record the exit code, kill the actor and give its bundle back."""
        import ray

        if self._code is None:
            self._code = ACTOR_LOST if code is None else code
        self._stopped = True
        ray.kill(self.actor, no_restart=True)
        self._on_stop()


class RayScheduler(Scheduler):
    """Starts each process under a Ray actor; see the module docstring for placement."""

    def __init__(self, config: Config, platform: Platform) -> None:
        import ray

        self.config, self.platform = config, platform
        self.processes: list[RayProcess] = []
        self._bundles: list[_Bundle] = []
        self._reserved = False
        self._lock = threading.Lock()
        self._owns_connection = not ray.is_initialized()
        if self._owns_connection:
            _connect(config)
        self.bind_host, self.host = node_addresses(config.cluster.bind_host, ray.util.get_node_ip_address())
        self._node_id = ray.get_runtime_context().get_node_id()
        self._probe: tuple[str, str] | None = None  # (path, content) written for disk weight updates
        ref = weakref.ref(self)
        atexit.register(lambda: ref() and ref().stop_all())

    # ------------------------------------------------------------------ placement
    def _shape(self, threads: int, devices: int, role: str) -> dict[str, float]:
        shape = {"CPU": float(threads)}
        if self.platform.ray_resource and devices:
            shape[self.platform.ray_resource] = float(devices)
        extra = {"server": self.config.ray.server_resources, "trainer": self.config.ray.trainer_resources}
        shape.update({name: float(amount) for name, amount in extra.get(role, {}).items()})
        return shape

    def _job_shapes(self) -> list[dict[str, float]]:
        rollout, actor = self.config.rollout, self.config.actor
        server = self._shape(rollout.threads_per_server, rollout.devices_per_server, "server")
        trainer = self._shape(actor.threads_per_worker, 1, "trainer")
        return [server] * rollout.servers + [trainer] * actor.world_size

    def _place(self, shapes: list[dict[str, float]], strategy: str, what: str) -> Any:
        """A ready placement group of ``shapes``, on the nodes Ray picks under ``strategy``."""
        import ray
        from ray.exceptions import GetTimeoutError
        from ray.util.placement_group import placement_group, remove_placement_group

        group = placement_group(shapes, strategy=strategy)
        timeout = self.config.rollout.server_startup_timeout
        try:
            ray.get(group.ready(), timeout=timeout)
        except GetTimeoutError:
            remove_placement_group(group)
            raise ArealError(
                f"the Ray cluster could not place {what} ({len(shapes)} bundles {shapes}, {strategy}) within "
                f"rollout.server_startup_timeout={timeout:.0f}s; available: {ray.available_resources()}; lower "
                "rollout.servers / actor.world_size / threads, relax ray.placement_strategy, or add nodes/resources"
            ) from None
        return group

    def _take(self, shape: dict[str, float], name: str) -> _Bundle:
        with self._lock:  # servers may be added from another thread (`areal servers add`)
            return self._take_locked(shape, name)

    def _take_locked(self, shape: dict[str, float], name: str) -> _Bundle:
        if not self._reserved:
            shapes = self._job_shapes()
            group = self._place(shapes, self.config.ray.placement_strategy, "the job")
            self._bundles += [_Bundle(group, i, s, own_group=False) for i, s in enumerate(shapes)]
            self._reserved = True
        bundle = next((b for b in self._bundles if b.free and b.shape == shape), None)
        if bundle is None:
            bundle = _Bundle(self._place([shape], "PACK", name), 0, shape, own_group=True)
            self._bundles.append(bundle)
        bundle.free = False
        return bundle

    def _release(self, bundle: _Bundle) -> None:
        from ray.util.placement_group import remove_placement_group

        with self._lock:
            if bundle.own_group:
                remove_placement_group(bundle.group)
                self._bundles.remove(bundle)
            else:
                bundle.free = True

    # ------------------------------------------------------------------ shared fileroot
    def _check_shared(self, actor: Any, name: str) -> None:
        """With disk weight updates, an actor on another node must read the controller's probe file."""
        import ray

        timeout = self.config.rollout.server_startup_timeout
        if self.config.actor.weight_update != "disk" or ray.get(actor.node_id.remote(), timeout=timeout) == self._node_id:
            return
        if self._probe is None:
            path = self.config.run_dir.resolve() / PROBE_FILE
            path.parent.mkdir(parents=True, exist_ok=True)
            content = secrets.token_hex(16)
            path.write_text(content)
            self._probe = (str(path), content)
        node = ray.get(actor.reads.remote(*self._probe), timeout=timeout)
        if node is not None:
            raise ConfigError(
                "fileroot",
                f"{self.config.fileroot!r} is not shared with node {node} ({name} runs there): the probe "
                f"{self._probe[0]} the controller wrote is not readable there; {_SHARED_FS_FIX}",
            )

    # ------------------------------------------------------------------ Scheduler
    def start(self, spec: ProcessSpec) -> RayProcess:
        import ray
        from ray.exceptions import GetTimeoutError, RayError
        from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

        key = self.platform.ray_resource
        n_devices = len(spec.devices) if key else 0
        bundle = self._take(self._shape(spec.threads, n_devices, spec.role), spec.name)
        devices: dict[str, Any] = {}
        if n_devices:
            devices = {"num_gpus": n_devices} if key == "GPU" else {"resources": {key: n_devices}}
        devices_env = self.platform.visible_devices_env
        env = {k: v for k, v in os.environ.items() if k != devices_env}  # the actor's assignment counts
        actor = (
            ray.remote(ProcessRunner)
            .options(
                num_cpus=spec.threads,
                **devices,
                max_restarts=0,
                scheduling_strategy=PlacementGroupSchedulingStrategy(bundle.group, bundle.index),
            )
            .remote(spec, env, os.getcwd(), devices_env, key, self.config.cluster.bind_host)
        )
        try:
            self._check_shared(actor, spec.name)
            started = ray.get(actor.start.remote(), timeout=self.config.rollout.server_startup_timeout)
        except (RayError, GetTimeoutError, ConfigError) as exc:
            ray.kill(actor, no_restart=True)
            self._release(bundle)
            if isinstance(exc, ConfigError):
                raise
            cause = getattr(exc, "cause", None) or exc  # a RayTaskError wraps the actor's exception
            raise ArealError(f"{spec.name}: could not start {spec.cmd[0]} under Ray: {cause}") from None
        handle = RayProcess(spec.name, actor, started, spec.log_file, on_stop=functools.partial(self._release, bundle))
        self.processes.append(handle)
        return handle

    @property
    def handles(self) -> list[RayProcess]:
        return list(self.processes)

    def stop_all(self) -> None:
        """Stop every process (SIGTERM to all, then SIGKILL), remove the groups, disconnect."""
        import ray
        from ray.exceptions import GetTimeoutError, RayActorError
        from ray.util.placement_group import remove_placement_group

        if not ray.is_initialized():
            return
        live = [h for h in self.processes if not h._stopped]
        pending = [(h, h.actor.stop.remote(10.0)) for h in live]
        for handle, ref in pending:
            try:
                code = ray.get(ref, timeout=10.0 + _RPC_TIMEOUT_S)
            except (RayActorError, GetTimeoutError):
                code = ACTOR_LOST
            handle._finish(code)
        for group in {id(b.group): b.group for b in self._bundles}.values():
            remove_placement_group(group)
        self._bundles, self._reserved = [], False
        if self._probe is not None:
            Path(self._probe[0]).unlink(missing_ok=True)
            self._probe = None
        if self._owns_connection:
            ray.shutdown()


def _connect(config: Config) -> None:
    """``ray.init`` against an existing cluster; keeps the controller's own SIGTERM handler."""
    import ray

    address = config.ray.address
    _check_reachable(os.environ.get("RAY_ADDRESS", "") if address == "auto" else address)
    main = threading.current_thread() is threading.main_thread()
    handler = signal.getsignal(signal.SIGTERM) if main else None
    try:
        ray.init(address=address, namespace=config.ray.namespace, log_to_driver=False, logging_level=logging.WARNING)
    except ConnectionError as exc:
        raise ConfigError("ray.address", f"no Ray cluster at {address!r} ({exc}); {_START_HINT}") from None
    finally:
        if handler is not None:
            signal.signal(signal.SIGTERM, handler)


_START_HINT = "start one with `ray start --head` or set ray.address=HOST:PORT"


def _check_reachable(address: str) -> None:
    """Fail fast on a ``HOST:PORT`` nobody listens on (``ray.init`` would retry for minutes)."""
    host, sep, port = address.rpartition(":")
    if "://" in address or not sep or not port.isdigit():
        return  # "auto" without RAY_ADDRESS, "local", ray:// clients: Ray answers these quickly itself
    try:
        socket.create_connection((host, int(port)), timeout=10).close()
    except OSError as exc:
        reason = exc.strerror or exc
        raise ConfigError("ray.address", f"no Ray cluster answers at {address} ({reason}); {_START_HINT}") from None
