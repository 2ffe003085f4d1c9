"""ServerFleet: keeps the inference plane serving while servers die, are replaced or are added.

The engine (every :class:`~areal_core.api.http_engine.HTTPServerEngine`) already drops a server it
finds lost and moves its requests elsewhere; the fleet adds what needs a view of the whole run:

- a health thread that checks every server each ``rollout.health_check_interval`` seconds, so a
  dead idle server is noticed too;
- with ``rollout.restart_failed``, a replacement for each lost server;
- ``add_server()`` at run time (the control endpoint and ``areal servers add`` call it);
- ``update_weights``, the trainer's weight update with a changing fleet: pending servers join
  first (they load the current weights and version before any traffic), and an update that
  fails because a server was lost is retried on the survivors;
- every change recorded in the ledger.
"""

from __future__ import annotations

import asyncio
import logging
import threading
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from areal_core.api.engine import SupportsElasticFleet
from areal_core.api.errors import ArealError, ProcessFailedError
from areal_core.api.weights import WeightUpdateError

if TYPE_CHECKING:
    from areal_core.config import Config
    from areal_core.api.engine import GenerationRequest, GenerationResponse, InferenceEngine
    from areal_core.rollout.ledger import Ledger
    from areal_core.api.scheduler import ProcessHandle

logger = logging.getLogger(__name__)


class ServerFleet:
    """Health checks, replacements, additions and fleet-aware weight updates (see module docstring)."""

    def __init__(self, engine: InferenceEngine, config: Config, ledger: Ledger | None = None) -> None:
        self.engine = engine if isinstance(engine, SupportsElasticFleet) else FixedFleet(engine)
        self.config = config
        self.ledger = ledger
        self._lock = threading.Lock()
        self._starting = 0  # server starts in progress
        self._stopped = threading.Event()
        self._thread: threading.Thread | None = None
        # Servers are started from this one long-lived thread: a local child is sent SIGTERM when
        # the *thread* that started it ends (PR_SET_PDEATHSIG), e.g. a control-request thread.
        self._starter = ThreadPoolExecutor(max_workers=1, thread_name_prefix="fleet-start")
        engine.on_event = self._on_event  # type: ignore[attr-defined]

    # ------------------------------------------------------------------ lifecycle
    def start(self) -> None:
        self._thread = threading.Thread(target=self._watch, name="fleet-health", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self._stopped.set()
        if self._thread is not None:
            self._thread.join()
        self._starter.shutdown(wait=False, cancel_futures=True)

    def __enter__(self) -> ServerFleet:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def _watch(self) -> None:
        while not self._stopped.wait(self.config.rollout.health_check_interval):
            try:
                self.check()
            except Exception:  # the watcher must outlive any one failed check
                logger.exception("fleet health check failed")

    # ------------------------------------------------------------------ membership
    def check(self) -> list[str]:
        """Remove every member or pending server that is lost; returns their addresses."""
        engine = self.engine
        lost = [a for a in (*engine.members(), *engine.pending_servers()) if engine.server_lost(a)]
        return [a for a in lost if engine.remove_server(a, "lost (health check)")]

    def add_server(self) -> str:
        """Start a server; it joins, with the current weights, at the next weight sync."""
        with self._lock:
            self._starting += 1
        try:
            return self._starter.submit(self.engine.start_server).result()
        finally:
            with self._lock:
                self._starting -= 1

    def remove_server(self, address: str) -> bool:
        """Take ``address`` out of the fleet and stop it; False if it was not part of it."""
        if address in self.engine.members() and len(self.engine.members()) == 1 and not self.engine.pending_servers():
            raise ArealError(f"{address} is the last serving server; add another before removing it")
        return self.engine.remove_server(address, "removed")

    def server_handles(self) -> list[ProcessHandle]:
        """Server processes whose exit the fleet handles (the trainer must not stop for them)."""
        return self.engine.server_handles()

    def has_pending(self) -> bool:
        return bool(self.engine.pending_servers())

    def ensure_serving(self) -> None:
        """:class:`ProcessFailedError` (restartable) when no server is left and none is on its way."""
        with self._lock:
            starting = self._starting
        if not self.engine.members() and not self.engine.pending_servers() and not starting:
            hint = "" if self.config.rollout.restart_failed else " (set rollout.restart_failed: true to replace them)"
            raise ProcessFailedError(f"every inference server is lost{hint}")

    def servers(self) -> list[dict[str, Any]]:
        """One row per server: address and state (``serving`` or ``pending``)."""
        rows = [{"address": a, "state": "serving"} for a in self.engine.members()]
        return rows + [{"address": a, "state": "pending"} for a in self.engine.pending_servers()]

    # ------------------------------------------------------------------ weight updates
    def update_weights(
        self,
        publish: Callable[[int], None],
        set_version: Callable[[int], None],
        version: int,
        *,
        retry_on_survivors: bool = True,
    ) -> None:
        """With generation paused: pending servers join, ``publish(version)`` reaches every member
        (retried on the survivors when members are lost meanwhile; without ``retry_on_survivors``
        a :class:`WeightUpdateError` aborts it instead), ``set_version(version)`` tags it, then the
        joined servers get traffic."""
        engine = self.engine
        joined = engine.join_pending()
        while True:
            before = engine.members()
            try:
                publish(version)
                break
            except ArealError as exc:
                self.check()
                survivors = engine.members()
                if survivors == before or not survivors:
                    raise
                if not retry_on_survivors:
                    raise WeightUpdateError(f"version {version} is not re-published on the surviving servers") from exc
                logger.warning("weight update %d failed (%s); retrying on %d surviving servers", version, exc, len(survivors))
        set_version(version)
        engine.open_traffic([a for a in joined if a in engine.members()], version)

    # ------------------------------------------------------------------ probing
    def probe(self, input_ids: list[int], max_new_tokens: int) -> list[dict[str, Any]]:
        """Greedy generation of ``input_ids`` on every serving server: address, output ids, log-probs, versions."""
        from areal_core.api.engine import GenerationRequest, SamplingParams

        sampling = SamplingParams(max_new_tokens=max_new_tokens, greedy=True)

        async def run() -> list[dict[str, Any]]:
            addresses = list(self.engine.members())
            responses = await asyncio.gather(
                *(self.engine.agenerate_on(a, GenerationRequest(input_ids=input_ids, sampling=sampling)) for a in addresses)
            )
            return [
                {"address": a, "output_ids": r.output_ids, "logprobs": r.logprobs, "versions": r.versions}
                for a, r in zip(addresses, responses)
            ]

        return asyncio.run(run())

    # ------------------------------------------------------------------ events
    def _on_event(self, kind: str, fields: dict[str, Any]) -> None:
        if self.ledger is not None:
            self.ledger.record(kind, **fields)
        if kind == "server_lost" and self.config.rollout.restart_failed and not self._stopped.is_set():
            with self._lock:
                self._starting += 1  # counted now, so ensure_serving sees the replacement coming
            try:
                self._starter.submit(self._replace)
            except RuntimeError:  # the fleet stopped meanwhile: no replacement
                with self._lock:
                    self._starting -= 1

    def _replace(self) -> None:
        try:
            address = self.engine.start_server()
            logger.warning("replacement server %s started; it joins at the next weight sync", address)
        except ArealError as exc:
            logger.error("could not start a replacement server: %s", exc)
            if self.ledger is not None:
                self.ledger.record("server_start_failed", error=str(exc))
        finally:
            with self._lock:
                self._starting -= 1


class FixedFleet:
    """The fleet view of an engine without :class:`SupportsElasticFleet`: its servers never change."""

    def __init__(self, engine: InferenceEngine) -> None:
        self.name = engine.name

    def members(self) -> tuple[str, ...]:
        return ()

    def pending_servers(self) -> tuple[str, ...]:
        return ()

    async def agenerate_on(self, address: str, request: GenerationRequest) -> GenerationResponse:
        raise NotImplementedError(f"engine {self.name!r} cannot address one server")

    def start_server(self, scheduler: object = None) -> str:
        raise NotImplementedError(f"engine {self.name!r} cannot add servers at run time")

    def add_server(self, address: str) -> None:
        raise NotImplementedError(f"engine {self.name!r} cannot add servers at run time")

    def remove_server(self, address: str, reason: str = "removed") -> bool:
        raise NotImplementedError(f"engine {self.name!r} cannot remove servers at run time")

    def server_lost(self, address: str) -> bool:
        return False

    def join_pending(self) -> list[str]:
        return []

    def open_traffic(self, addresses: Sequence[str], version: int) -> None:
        pass

    def server_handles(self) -> list[ProcessHandle]:
        return []
