"""HTTP client pieces shared by inference-engine clients (``hf``, ``vllm``, ...).

:class:`HTTPServerEngine` is their common base. Its parts: a pause gate that holds async generation between ``pause()`` and ``resume()``, a router that
pins request ids to servers, blocking JSON POSTs (one server or all in parallel) that turn
failures into one-line errors, and a start-up wait that reports a dead server's log tail.

It also keeps the fleet elastic, the same way for every engine: a server found lost (its process
exited, or unreachable for ``LOST_GRACE_S``) is dropped from the members, a request running there
is re-submitted to a live server as prompt + the output received so far (``_on_live_server``),
and a control call reaching a lost server succeeds on the survivors. A server started at run time
(``start_server``) waits in ``pending`` until the next weight sync (``join_pending``), and gets
traffic only after it serves the current weights (``open_traffic``).
"""

from __future__ import annotations

import abc
import asyncio
import bisect
import collections
import contextlib
import functools
import json
import logging
import os
import secrets
import threading
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import TYPE_CHECKING, Any, ClassVar, TypeVar

import attrs

from areal_core.api.engine import GenerationRequest, GenerationResponse, InferenceEngine
from areal_core.api.errors import ArealError, ConfigError
from areal_core.api.http_json import post_json
from areal_core.api.scheduler import BIND_HOST, PORT, ProcessHandle, ProcessSpec, log_tail
from areal_core.api.devices import server_devices
from areal_core.api.weights import WeightUpdateError

if TYPE_CHECKING:
    from areal_core.config import Config
    from areal_core.api.platform import Platform
    from areal_core.api.scheduler import Scheduler
    from areal_core.api.weight_channel import ChannelSpec

logger = logging.getLogger(__name__)
T = TypeVar("T")

#: A server whose process is gone, or that stays unreachable this long, is lost.
LOST_GRACE_S = 5.0

#: ``HTTPServerEngine.on_event(kind, fields)``: fleet changes, for the ledger and the fleet manager.
FleetEvent = Callable[[str, dict[str, Any]], None]


class PauseGate:
    """Holds async callers (on any event loop) while closed; opened and closed from any thread.

    Opening wakes each loop once for all of its waiters: one cross-thread call per loop, not per
    held request (tens of thousands after a weight update at cluster scale).
    """

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._closed = False
        self._waiters: dict[asyncio.AbstractEventLoop, list[asyncio.Future]] = {}

    def close(self) -> None:
        with self._lock:
            self._closed = True

    def open(self) -> None:
        with self._lock:
            self._closed = False
            waiters, self._waiters = self._waiters, {}
        for loop, futures in waiters.items():
            try:
                loop.call_soon_threadsafe(_release, futures)
            except RuntimeError:  # that loop has closed; nobody is waiting there any more
                pass

    async def wait(self) -> None:
        with self._lock:
            if not self._closed:
                return
            future = asyncio.get_running_loop().create_future()
            self._waiters.setdefault(future.get_loop(), []).append(future)
        await future


def _release(futures: list[asyncio.Future]) -> None:
    for future in futures:
        if not future.done():
            future.set_result(None)


class Router:
    """Pins each request id to one server slot; a new id goes to the least-loaded open slot (round
    robin on ties). Slots are only added (``add``); a closed slot gets no requests, and ids pinned
    to it move to an open one.

    Choosing is O(log n) at any fleet size: open slots sit in one sorted list per load, and the
    lowest non-empty load is tracked as loads move by one.
    """

    def __init__(self, n_servers: int, max_pins: int = 100_000) -> None:
        self._lock = threading.Lock()
        self._load = [0] * n_servers
        self._open = [True] * n_servers
        self._by_load: dict[int, list[int]] = {0: list(range(n_servers))}  # load -> open slots, sorted
        self._min = 0  # no open slot has a lower load
        self._n_open = n_servers
        self._pins: collections.OrderedDict[str, int] = collections.OrderedDict()
        self._next = 0
        self._max_pins = max_pins

    def acquire(self, request_id: str) -> int | None:
        """The slot for ``request_id`` (its load counted until ``release``); None while no slot is open."""
        with self._lock:
            server = self._pins.get(request_id)
            if server is None or not self._open[server]:
                if not self._n_open:
                    return None
                while not self._by_load.get(self._min):
                    self._min += 1
                slots = self._by_load[self._min]
                server = slots[bisect.bisect_left(slots, self._next) % len(slots)]
                self._next = (server + 1) % len(self._load)
                if len(self._pins) >= self._max_pins:
                    self._pins.popitem(last=False)
            self._pins[request_id] = server
            self._pins.move_to_end(request_id)
            self._move(server, +1)
            return server

    def release(self, server: int) -> None:
        with self._lock:
            self._move(server, -1)

    def _move(self, server: int, delta: int) -> None:
        """Change ``server``'s load by ``delta`` (the lock is held)."""
        load = self._load[server]
        self._load[server] = load + delta
        if self._open[server]:
            self._unlist(server, load)
            self._list(server, load + delta)

    def _list(self, server: int, load: int) -> None:
        bisect.insort(self._by_load.setdefault(load, []), server)
        self._min = min(self._min, load)

    def _unlist(self, server: int, load: int) -> None:
        slots = self._by_load[load]
        del slots[bisect.bisect_left(slots, server)]

    def add(self, *, open_: bool = True) -> int:
        """A new slot; returns its index."""
        with self._lock:
            self._load.append(0)
            self._open.append(False)
            server = len(self._load) - 1
            self._set_open(server, open_)
            return server

    def set_open(self, server: int, open_: bool) -> None:
        with self._lock:
            self._set_open(server, open_)

    def _set_open(self, server: int, open_: bool) -> None:
        if open_ == self._open[server]:
            return
        self._open[server] = open_
        if open_:
            self._list(server, self._load[server])
        else:
            self._unlist(server, self._load[server])
        self._n_open += 1 if open_ else -1

    def pin(self, request_id: str, server: int) -> None:
        """Send ``request_id`` to ``server`` (e.g. to probe one server)."""
        with self._lock:
            self._pins[request_id] = server


def command_line_flags(flags: dict[str, Any], engine_args: dict[str, Any] | None = None) -> list[str]:
    """``--key value`` arguments for a server command: ``flags`` overridden by ``engine_args``
    (``rollout.engine_args``; underscores become dashes). ``True`` is a bare flag, ``False``/``None``
    drop it, dicts and lists are passed as JSON."""
    merged = dict(flags)
    for key, value in (engine_args or {}).items():
        merged[str(key).replace("_", "-")] = value
    args: list[str] = []
    for key, value in merged.items():
        if value is True:
            args.append(f"--{key}")
        elif value is not False and value is not None:
            args += [f"--{key}", json.dumps(value) if isinstance(value, (dict, list)) else str(value)]
    return args


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


@attrs.frozen(kw_only=True)
class Segment:
    """What one server call generated before it ended, or before ``pause()`` aborted it."""

    output_ids: list[int]
    logprobs: list[float]
    versions: list[int]
    stop_reason: str  # "stop", "length" or "abort"


@attrs.frozen(kw_only=True)
class SegmentCall:
    """One request's next segment: continue ``request`` after its ``generated`` tokens;
    ``attempt`` counts the segments it had before."""

    request: GenerationRequest
    generated: list[int]
    attempt: int


SegmentFn = Callable[..., Awaitable[Segment]]


async def one_call_each(generate_segment: SegmentFn, session: Any, address: str, calls: list[SegmentCall]) -> list[Segment]:
    """``_generate_segments`` for a server that takes one request per call: the calls run
    concurrently, each as ``generate_segment(session, address, request=, generated=, attempt=)``."""
    return list(
        await asyncio.gather(
            *(
                generate_segment(session, address, request=c.request, generated=c.generated, attempt=c.attempt)
                for c in calls
            )
        )
    )


@attrs.define
class _Partial:
    """A request's output so far, segment by segment."""

    request: GenerationRequest
    output_ids: list[int] = attrs.Factory(list)
    logprobs: list[float] = attrs.Factory(list)
    versions: list[int] = attrs.Factory(list)
    stop_reason: str = "abort"  # none yet: as if aborted before it began
    attempt: int = 0
    latency: float = 0.0  # seconds from the group's start to this request's last segment

    def unfinished(self) -> bool:
        return self.stop_reason == "abort" and len(self.output_ids) < self.request.sampling.max_new_tokens

    def add(self, segment: Segment, latency: float) -> None:
        self.output_ids += segment.output_ids
        self.logprobs += segment.logprobs
        self.versions += segment.versions
        self.stop_reason, self.attempt, self.latency = segment.stop_reason, self.attempt + 1, latency

    def response(self) -> GenerationResponse:
        return GenerationResponse(
            input_ids=list(self.request.input_ids),
            output_ids=self.output_ids,
            logprobs=self.logprobs,
            versions=self.versions,
            stop_reason="stop" if self.stop_reason == "stop" else "length",
            latency=self.latency,
        )


class HTTPServerEngine(InferenceEngine):
    """Client half shared by engines whose servers speak HTTP (``hf``, ``vllm``): a bearer token,
    server addresses, request pinning, the pause gate, parallel control calls, and launching
    servers through a scheduler. Subclasses describe their server process and routes."""

    server_label: ClassVar[str] = "server"  # for error messages: "<label> 127.0.0.1:port ..."
    token_env: ClassVar[str] = ""  # env var carrying the bearer token to the server
    pause_route: ClassVar[str] = ""  # aborts in-flight requests and holds new ones
    resume_route: ClassVar[str] = ""
    commit_route: ClassVar[str] = ""  # phase two of a staged update: serve it, reply its digest
    rollback_route: ClassVar[str] = ""  # undo the last commit

    def __init__(self, config: Config, platform: Platform) -> None:
        super().__init__(config, platform)
        self.token = os.environ.get(self.token_env) or secrets.token_hex(16)
        self.addresses: list[str] = []  # members: every control call (pause, weights, version) goes to them
        self.pending: list[str] = []  # started, waiting for the next weight sync (join_pending)
        self.on_event: FleetEvent | None = None
        self._slots: list[str] = []  # router slot -> address (slots are never reused)
        self._router = Router(0)
        self._gate = PauseGate()
        self._members_lock = threading.RLock()
        self._scheduler: Scheduler | None = None
        self._handles: dict[str, ProcessHandle] = {}  # address -> process, for servers this engine started
        self._device_slots: dict[str, int] = {}  # address -> the device slot it holds (server_devices)
        self._free_device_slots: list[int] = []  # of lost servers: a replacement takes one
        self._started = 0  # servers started so far (names them)
        self._processes: list[ProcessHandle] = []  # every server process started, lost ones too
        self._silent_since: dict[str, float] = {}  # address -> when its health check first failed
        self._sessions: dict[asyncio.AbstractEventLoop, Any] = {}  # loop -> its client_session's aiohttp session

    @abc.abstractmethod
    def server_spec(self, index: int, port: int | str, run_dir: Path, host: str = "127.0.0.1") -> ProcessSpec:
        """How to start server ``index`` listening on ``host:port`` (its log goes under ``run_dir/logs``);
        ``launch_servers`` passes the scheduler's placeholders, filled in on the server's node."""

    @abc.abstractmethod
    def server_is_up(self, address: str) -> bool:
        """True once the server at ``address`` answers its health check."""

    def launch_servers(self, scheduler: Scheduler) -> list[str]:
        return self.start_servers(scheduler)()

    def start_servers(self, scheduler: Scheduler) -> Callable[[], list[str]]:
        if not self.config.model.path:
            raise ConfigError("model.path", f"the {self.name} engine needs a model directory (tiny models: ensure_tiny_model)")
        self._scheduler = scheduler
        started = [self._spawn(scheduler, device_slot=i) for i in range(self.config.rollout.servers)]
        deadline = time.monotonic() + self.config.rollout.server_startup_timeout

        def wait_until_up() -> list[str]:
            for address, handle, log_file in started:
                up = functools.partial(self.server_is_up, address)
                wait_healthy(up, handle, address, log_file, deadline, self.server_label)
            self.attach([address for address, _, _ in started])
            return list(self.addresses)

        return wait_until_up

    def _spawn(self, scheduler: Scheduler, device_slot: int) -> tuple[str, ProcessHandle, Path]:
        run_dir = self.config.run_dir.resolve()
        (run_dir / "logs").mkdir(parents=True, exist_ok=True)
        index, self._started = self._started, self._started + 1
        spec = self.server_spec(index, PORT, run_dir, host=BIND_HOST)
        spec = attrs.evolve(spec, role="server", cpus=tuple(self.config.rollout.cpus))  # every engine's servers
        if not spec.devices:
            spec = attrs.evolve(spec, devices=server_devices(self.config, self.platform, device_slot))
        handle = scheduler.start(spec)
        address = f"{handle.host}:{handle.port}"  # where the other nodes reach it
        self._handles[address], self._device_slots[address] = handle, device_slot
        self._processes.append(handle)
        return address, handle, Path(spec.log_file or "")

    def attach(self, addresses: list[str]) -> None:
        if not addresses:
            raise ValueError("attach() needs at least one server address (host:port)")
        with self._members_lock:
            self.addresses = list(addresses)
            self.pending = []
            self._slots = list(addresses)
            self._router = Router(len(addresses))

    def health(self) -> list[bool]:
        return [self.server_is_up(address) for address in self.addresses]

    # ---------------------------------------------------------------- fleet membership
    def members(self) -> tuple[str, ...]:
        with self._members_lock:
            return tuple(self.addresses)

    def pending_servers(self) -> tuple[str, ...]:
        with self._members_lock:
            return tuple(self.pending)

    async def agenerate_on(self, address: str, request: GenerationRequest) -> GenerationResponse:
        with self._members_lock:
            if address not in self._slots:
                raise ArealError(f"{self.server_label} {address} is not part of the fleet")
            self._router.pin(request.request_id, self._slots.index(address))
        return await self.agenerate(request)

    def start_server(self, scheduler: Scheduler | None = None) -> str:
        """Start one more server like ``launch_servers`` does, wait until it is up, queue it in ``pending``."""
        scheduler = scheduler or self._scheduler
        if scheduler is None:
            raise ArealError(f"start_server(): this {self.name} engine launched no servers; pass a scheduler")
        with self._members_lock:
            slot = self._free_device_slots.pop(0) if self._free_device_slots else self._started
        address, handle, log_file = self._spawn(scheduler, device_slot=slot)
        deadline = time.monotonic() + self.config.rollout.server_startup_timeout
        try:
            wait_healthy(functools.partial(self.server_is_up, address), handle, address, log_file, deadline, self.server_label)
        except ArealError:
            self._forget(address, stop=True)
            raise
        self.add_server(address)
        return address

    def add_server(self, address: str) -> None:
        """Queue a running server at ``address``; it joins at the next ``join_pending`` (a weight sync)."""
        with self._members_lock:
            if address in self.addresses or address in self.pending:
                raise ArealError(f"{self.server_label} {address} is already part of the fleet")
            self.pending.append(address)
        self._emit("server_added", address=address)

    def join_pending(self) -> list[str]:
        """Make the pending servers members (control calls reach them) without traffic; returns them.

        Call with generation paused, then sync the weights and the version, then ``open_traffic``.
        """
        with self._members_lock:
            joined, self.pending = self.pending, []
            for address in joined:
                self.addresses.append(address)
                self._slots.append(address)
                self._router.add(open_=False)
        return joined

    def open_traffic(self, addresses: Sequence[str], version: int) -> None:
        """Route requests to ``addresses`` (members now serving weight version ``version``)."""
        with self._members_lock:
            for address in addresses:
                if address in self.addresses:
                    self._router.set_open(self._slots.index(address), True)
                    self._emit("server_joined", address=address, version=version)

    def remove_server(self, address: str, reason: str = "removed") -> bool:
        """Stop sending anything to ``address`` and stop its process if this engine started it.

        Returns False if it was not part of the fleet (e.g. already removed by another caller).
        """
        known = self._forget(address, stop=True)
        if known:
            self._emit("server_lost" if reason != "removed" else "server_removed", address=address, reason=reason)
        return known

    def _forget(self, address: str, *, stop: bool) -> bool:
        with self._members_lock:
            known = address in self.addresses or address in self.pending
            if address in self.addresses:
                self.addresses.remove(address)
            if address in self.pending:
                self.pending.remove(address)
            if address in self._slots:
                self._router.set_open(self._slots.index(address), False)
            handle = self._handles.pop(address, None)
            self._silent_since.pop(address, None)
            slot = self._device_slots.pop(address, None)
            if slot is not None:
                self._free_device_slots.append(slot)
        if stop and handle is not None:
            handle.stop(timeout=5.0)
        return known

    def server_handles(self) -> list[ProcessHandle]:
        with self._members_lock:
            return list(self._processes)

    def server_lost(self, address: str) -> bool:
        """True if the server's process has exited, or it has not answered its health check for
        ``rollout.health_timeout_s`` (hung, e.g. stopped: its process is then stopped with it); a
        server this engine did not start is lost once unreachable for ``LOST_GRACE_S``. False as
        soon as it answers."""
        handle = self._handles.get(address)
        deadline = time.monotonic() + LOST_GRACE_S
        while True:
            if handle is not None and not handle.alive():
                return True
            if self.server_is_up(address):
                self._silent_since.pop(address, None)
                return False
            silent = time.monotonic() - self._silent_since.setdefault(address, time.monotonic())
            if handle is not None and silent >= self.config.rollout.health_timeout_s:
                return True
            if time.monotonic() > deadline:
                return handle is None
            time.sleep(0.2)

    def _emit(self, kind: str, **fields: Any) -> None:
        logger.warning("%s %s: %s", self.server_label, kind, fields)
        if self.on_event is not None:
            self.on_event(kind, fields)

    async def agenerate(self, request: GenerationRequest) -> GenerationResponse:
        (response,) = await self.agenerate_group([request])
        return response

    async def agenerate_group(self, requests: Sequence[GenerationRequest]) -> list[GenerationResponse]:
        """Generate in segments, the whole group on one server and each segment one call for the
        unfinished requests: a segment aborted by ``pause()`` is continued after ``resume()``
        (prompt + output so far, the remaining budget), and one on a lost server re-runs on a live
        one, so a response may span weight versions and servers."""
        if not requests:
            return []
        start = time.monotonic()
        parts = [_Partial(request) for request in requests]
        shared = self._sessions.get(asyncio.get_running_loop())
        async with contextlib.nullcontext(shared) if shared is not None else self._new_session() as session:
            while active := [p for p in parts if p.unfinished()]:
                await self._gate.wait()
                calls = [SegmentCall(request=p.request, generated=list(p.output_ids), attempt=p.attempt) for p in active]
                call = functools.partial(self._generate_segments, session, calls=calls)
                segments = await self._on_live_server(requests[0].request_id, call)
                for part, segment in zip(active, segments):
                    part.add(segment, time.monotonic() - start)
        return [part.response() for part in parts]

    def _new_session(self) -> Any:
        import aiohttp

        timeout = aiohttp.ClientTimeout(total=self.config.rollout.request_timeout)
        # No connection cap (the staleness bound limits requests in flight); idle connections are
        # dropped before a server's own keep-alive ends (uvicorn: 5 s), so none is reused as it closes.
        connector = aiohttp.TCPConnector(limit=0, keepalive_timeout=4.0)
        return aiohttp.ClientSession(timeout=timeout, headers=self._headers(), connector=connector)

    @contextlib.asynccontextmanager
    async def client_session(self) -> AsyncIterator[None]:
        loop = asyncio.get_running_loop()
        async with self._new_session() as session:
            self._sessions[loop] = session
            try:
                yield
            finally:
                del self._sessions[loop]

    @abc.abstractmethod
    async def _generate_segments(self, session: Any, address: str, *, calls: list[SegmentCall]) -> list[Segment]:
        """The next segment of every call, in order, on the server at ``address`` (an aiohttp
        ``session`` carries the auth headers). Engines whose server takes one request per call
        use :func:`one_call_each`."""

    async def _on_live_server(self, request_id: str, call: Callable[[str], Awaitable[T]]) -> T:
        """``await call(address)`` on the server ``request_id`` is routed to. If that server is lost
        meanwhile, it leaves the fleet and ``call`` runs again on a live one (the caller's body
        carries the prompt and the output received so far); while no server is open, wait."""
        import aiohttp

        moved_from: str | None = None
        while True:
            slot = self._router.acquire(request_id)
            if slot is None:  # every server lost: a replacement may be on its way
                await asyncio.sleep(0.2)
                continue
            address = self._slots[slot]
            if moved_from is not None:
                self._emit("resubmitted", request_id=request_id, from_server=moved_from, to_server=address)
                moved_from = None
            try:
                return await call(address)
            except (aiohttp.ClientError, ConnectionError) as exc:
                if not await asyncio.to_thread(self.server_lost, address):
                    raise
                await asyncio.to_thread(self.remove_server, address, f"lost while serving: {type(exc).__name__}")
                moved_from = address
            finally:
                self._router.release(slot)

    def pause(self) -> None:
        self._gate.close()
        self._broadcast(self.pause_route, {})

    def resume(self) -> None:
        self._broadcast(self.resume_route, {})
        self._gate.open()

    def close(self) -> None:
        """Nothing to release: sessions live per ``client_session`` (or per ``agenerate`` call
        outside one), control calls are one-shot."""

    def _channel_spec(
        self, channel: str, backend: str, master_addr: str, master_port: int, group_name: str, *, loads_on_arrival: bool
    ) -> ChannelSpec:
        """The :class:`ChannelSpec` of weight channel ``channel`` to the current members."""
        from areal_core.api.weight_channel import ChannelSpec

        return ChannelSpec(
            channel=channel,
            servers=self.members(),
            token=self.token,
            backend=backend,
            master_addr=master_addr,
            master_port=master_port,
            group_name=group_name,
            bucket_bytes=self.config.actor.weight_chunked_mem_mb << 20,
            timeout_s=self.config.actor.weight_update_timeout_s,
            ranks_per_server=self.config.rollout.devices_per_server,
            loads_on_arrival=loads_on_arrival,
            holds_requests=self.holds_requests,
        )

    @property
    def holds_requests(self) -> bool:
        """Whether weight updates meet requests held on the servers (``rollout.pause_mode: keep``),
        whose KV cache must then stay: servers that flush it after loading weights must not."""
        return self.config.rollout.pause_mode == "keep"

    def commit_staged(self, version: int) -> None:
        """Phase two of a staged update (every member staged ``version``): all commit, and
        ``version`` serves only if every member did, with equal digests of what it staged.
        Otherwise the members that committed roll back (one that cannot is removed from the fleet
        and replaced with ``rollout.restart_failed``) and ``WeightUpdateError`` says what happened."""
        outcomes = self._post_each(self.commit_route, [{"version": version}] * len(self.members()))
        failed = {address: str(reply) for address, reply in outcomes if isinstance(reply, ArealError)}
        committed = [(address, reply) for address, reply in outcomes if not isinstance(reply, ArealError)]
        if not failed and len({reply["digest"] for _, reply in committed}) <= 1:
            return
        reason = "; ".join(failed.values()) or "the members staged different bytes (digests differ)"
        timeout = self.config.rollout.request_timeout
        for address, _ in committed:
            try:
                post_json(address, self.rollback_route, {}, self._headers(), timeout, self.server_label)
            except ArealError as exc:
                self.remove_server(address, f"could not roll back version {version}: {exc}")
        for address in failed:
            if self.server_lost(address):
                self.remove_server(address, f"lost during the commit of version {version}")
        raise WeightUpdateError(f"commit of version {version} aborted, every server serves its previous weights: {reason}")

    def _headers(self) -> dict[str, str]:
        return {"Authorization": f"Bearer {self.token}"}

    def _broadcast(self, endpoint: str, body: dict[str, Any]) -> list[dict[str, Any]]:
        """POST the same ``body`` to every member."""
        return self._fan_out(endpoint, [body] * len(self.members()))

    def _fan_out(self, endpoint: str, bodies: list[dict[str, Any]]) -> list[dict[str, Any]]:
        """POST ``bodies[i]`` to member ``i`` (in parallel); the replies of the members that answered.

        A member that fails and is lost leaves the fleet; any other failure raises.
        """
        outcomes = self._post_each(endpoint, bodies)
        for address, outcome in outcomes:
            if isinstance(outcome, ArealError):
                if not self.server_lost(address):
                    raise outcome
                self.remove_server(address, f"lost during {endpoint}")
        return [outcome for _, outcome in outcomes if not isinstance(outcome, ArealError)]

    def _post_each(self, endpoint: str, bodies: list[dict[str, Any]]) -> list[tuple[str, dict[str, Any] | ArealError]]:
        """POST ``bodies[i]`` to member ``i`` in parallel: ``(address, reply or the ArealError)`` each."""
        addresses = list(self.members())
        if not self._slots:
            raise ArealError(f"no {self.server_label}s attached; call launch_servers() or attach() first")
        if len(bodies) != len(addresses):
            raise ArealError(f"{endpoint}: the {self.server_label}s changed while the call was prepared; retry it")
        if not addresses:
            return []
        timeout = self.config.rollout.request_timeout
        with ThreadPoolExecutor(max_workers=len(addresses)) as pool:
            futures = [
                pool.submit(post_json, address, endpoint, body, self._headers(), timeout, self.server_label)
                for address, body in zip(addresses, bodies)
            ]
        outcomes: list[tuple[str, dict[str, Any] | ArealError]] = []
        for address, future in zip(addresses, futures):
            try:
                outcomes.append((address, future.result()))
            except ArealError as exc:
                outcomes.append((address, exc))
        return outcomes
