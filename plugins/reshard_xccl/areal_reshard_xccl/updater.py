"""The ``xccl`` weight path: the trainer's weights go to every inference server through the
engine's own weight channel (vLLM's weight-transfer engines, SGLang's group handshake, the hf
engine's gloo buckets), over the backend the engine picks for the platform.

This updater is the orchestration only. ``connect`` checks the engine has a channel
(:class:`~areal_core.api.engine.SupportsWeightChannel`) and opens it: the engine describes it, every
training rank builds it, trainer rank 0 hosts the rendezvous and joins the servers. ``update(v)``
sends the weights through it and commits them on every server (``engine.commit_weights(v)``).
Any failure before the commit closes the channel and raises :class:`WeightUpdateError`; the next
update opens a fresh one (so a replaced server can join), as does a change of the engine's
members. Pausing generation around the update, versions and the fleet's retry are the caller's.
With ``actor.lora`` the trainer sends the adapter's tensors alone; a config whose engine cannot
take them this way (``channel_takes_adapter`` False) is resolved to the ``disk`` path instead.

A channel whose servers load each bucket on arrival (``ChannelSpec.loads_on_arrival``: SGLang,
vLLM's ``nccl``) leaves them with partly-new weights when an update fails midway, and they cannot
roll back. The updater then rolls forward: it sends the same version again at once on a fresh
channel. If a server of the channel was lost, that retry is the fleet's, on the survivors. If the
retry fails too, every server of the failed channel leaves the fleet as lost (``server_lost``,
replaced with ``rollout.restart_failed``; a replacement joins the next channel and receives the
full weights) and the update aborts, so no server serves a mix of two versions.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import TYPE_CHECKING, Any

from areal_core.api.engine import SupportsElasticFleet, SupportsWeightChannel
from areal_core.api.errors import ArealError, ConfigError, ProcessFailedError
from areal_core.api.scheduler import free_port
from areal_core.api.weights import WeightUpdateError, WeightUpdater

if TYPE_CHECKING:
    from areal_core.api import Config
    from areal_core.api.engine import InferenceEngine
    from areal_core.api.platform import Platform
    from areal_core.api.weights import TrainerHandle

logger = logging.getLogger(__name__)

class XcclWeightUpdater(WeightUpdater):
    """Sends the trainer's weights through the engine's weight channel, then commits them."""

    name = "xccl"

    def __init__(self, config: Config, platform: Platform) -> None:
        super().__init__(config, platform)
        self._trainer: TrainerHandle | None = None
        self._engine: InferenceEngine | None = None
        self._members: tuple[str, ...] | None = None  # the engine's members when the channel opened
        self._loads_on_arrival = False  # of the open channel (ChannelSpec.loads_on_arrival)
        self._opened = 0
        self.setup_seconds = 0.0  # of the last channel set-up

    def connect(self, trainer: TrainerHandle, engine: InferenceEngine) -> None:
        """Open the channel; call again after replacing a server."""
        if not isinstance(engine, SupportsWeightChannel):
            raise ConfigError(
                "actor.weight_update",
                f"engine {engine.name!r} has no weight channel for 'xccl'; use actor.weight_update=disk",
            )
        self._trainer, self._engine = trainer, engine
        self._open()

    def _open(self) -> None:
        trainer, engine = self._require()
        self._close()
        self._opened += 1
        assert isinstance(engine, SupportsWeightChannel)  # checked by connect
        # trainer rank 0 hosts the rendezvous on its node; the port was free on the controller's (a race
        # with the trainer node's own sockets remains, as with any port picked ahead of use)
        spec = engine.weight_channel(trainer.rendezvous_host, free_port(), f"areal_weights_{self._opened}")
        start = time.perf_counter()
        self._members, self._loads_on_arrival = spec.servers, spec.loads_on_arrival
        self._on_trainer(trainer.open_weight_channel, spec, failure=f"xccl weight group {spec.group_name!r} could not be set up")
        self.setup_seconds = time.perf_counter() - start
        logger.info(
            "xccl channel %s (%s, world size %d) set up in %.2fs",
            spec.group_name, spec.backend, spec.world_size, self.setup_seconds,
        )  # fmt: skip

    def update(self, version: int) -> None:
        _, engine = self._require()
        members = engine.members() if isinstance(engine, SupportsElasticFleet) else ()
        if self._members is None or members != self._members:  # a failed update, or servers came or went
            self._open()
        channel = self._members
        try:
            self._send_and_commit(version)
        except ProcessFailedError:
            raise
        except ArealError as exc:
            if not self._loads_on_arrival or not isinstance(engine, SupportsElasticFleet):
                raise
            self._roll_forward(version, engine, channel or (), exc)

    def _send_and_commit(self, version: int) -> None:
        trainer, engine = self._require()
        assert isinstance(engine, SupportsWeightChannel)  # checked by connect
        failure = f"xccl update to version {version} failed before its commit"
        if not self._loads_on_arrival:
            failure += "; the servers keep their previous weights, and the next update opens a new channel"
        self._on_trainer(trainer.send_weights, version, failure=failure)
        engine.commit_weights(version)

    def _roll_forward(self, version: int, engine: SupportsElasticFleet, channel: tuple[str, ...], exc: ArealError) -> None:
        """After ``exc``, the servers of ``channel`` (which load on arrival) may hold partly-new
        weights: send ``version`` again on a fresh channel; if that fails too, they leave the fleet
        as lost. A server of ``channel`` already lost: ``exc`` passes to the fleet, which retries on
        the survivors."""
        if any(a not in engine.members() or engine.server_lost(a) for a in channel):
            raise exc
        logger.warning("xccl update to version %d failed after buckets may have been loaded (%s); sending it again", version, exc)
        try:
            self._open()
            self._send_and_commit(version)
        except ProcessFailedError:
            raise
        except ArealError as again:
            self._close()
            reason = f"may serve partly-loaded weights: the update to version {version} failed twice ({again})"
            with ThreadPoolExecutor(max_workers=max(1, len(channel)), thread_name_prefix="xccl-remove") as pool:
                list(pool.map(lambda address: engine.remove_server(address, reason), channel))  # each stop may wait
            raise WeightUpdateError(
                f"xccl update to version {version} failed twice on servers that load buckets on arrival; "
                f"{len(channel)} left the fleet as lost: {again}"
            ) from None

    def _on_trainer(self, call: Callable[[Any], None], arg: Any, *, failure: str) -> None:
        """``call(arg)`` on the trainers; a channel failure closes the channel and aborts the update
        (:class:`WeightUpdateError`), a training worker's death stops the run (it passes through)."""
        try:
            call(arg)
        except ProcessFailedError:
            raise
        except ArealError as exc:
            self._close()
            raise WeightUpdateError(f"{failure}: {exc}") from None

    def close(self) -> None:
        self._close()

    def _close(self) -> None:
        if self._members is not None and self._trainer is not None:
            try:
                self._trainer.close_weight_channel()
            except (ArealError, RuntimeError) as exc:  # the workers are gone: nothing to leave
                logger.debug("closing the weight channel: %s", exc)
        self._members = None

    def _require(self) -> tuple[TrainerHandle, InferenceEngine]:
        if self._trainer is None or self._engine is None:
            raise RuntimeError("XcclWeightUpdater: call connect(trainer, engine) before update()")
        return self._trainer, self._engine
