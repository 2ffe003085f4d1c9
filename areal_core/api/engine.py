"""InferenceEngine: the controller's client of one or more generation servers.

Token ids in, token ids + per-token log-probs + per-token weight versions out. Generation is
interruptible: ``pause()`` aborts in-flight requests on the servers; ``agenerate`` then waits for
``resume()`` and re-submits prompt + partial output with the remaining budget, so a single
response can carry tokens from two weight versions. Engines with :class:`SupportsKeepPause` can
hold in-flight requests instead (``rollout.pause_mode: keep``).
"""

from __future__ import annotations

import abc
import asyncio
import contextlib
import secrets
from contextlib import AbstractAsyncContextManager
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any, ClassVar, Literal, Protocol, runtime_checkable

import attrs

if TYPE_CHECKING:
    from areal_core.config import Config
    from areal_core.api.platform import Platform
    from areal_core.api.scheduler import ProcessHandle, Scheduler
    from areal_core.api.weight_channel import ChannelSpec

StopReason = Literal["stop", "length", "abort"]


@attrs.frozen(kw_only=True)
class SamplingParams:
    max_new_tokens: int
    temperature: float = 1.0
    top_p: float = 1.0
    greedy: bool = False
    stop_token_ids: tuple[int, ...] = ()
    seed: int | None = None  # same seed -> same samples, whatever the batching or interruptions


@attrs.frozen(kw_only=True)
class GenerationRequest:
    input_ids: list[int]
    sampling: SamplingParams
    request_id: str = attrs.Factory(lambda: secrets.token_hex(16))  # as random as uuid4().hex, 4x cheaper


@attrs.frozen(kw_only=True)
class GenerationResponse:
    input_ids: list[int]
    output_ids: list[int]
    logprobs: list[float]  # log-prob of each output token under the policy that sampled it
    versions: list[int]  # weight version that produced each output token
    stop_reason: StopReason
    latency: float  # seconds from first submission to the final token


class InferenceEngine(abc.ABC):
    """Client of generation servers. Control calls are synchronous; generation is async."""

    name: ClassVar[str] = ""
    #: Whether the weight channel (``SupportsWeightChannel``) takes a LoRA adapter's tensors alone
    #: (``actor.lora`` with ``actor.weight_update: xccl``); for engines without it, such a config
    #: resolves to ``actor.weight_update: disk`` (they load adapters from disk).
    channel_takes_adapter: ClassVar[bool] = False
    #: Whether the servers serve each LoRA version as an adapter of its own that requests name
    #: (vLLM, SGLang) instead of loading it into the served model in place (hf). A request held
    #: through an update would decode on the adapter it started with, so ``rollout.pause_mode: keep``
    #: with ``actor.lora`` is refused for such engines.
    adapters_by_name: ClassVar[bool] = False

    def __init__(self, config: Config, platform: Platform) -> None:
        self.config = config
        self.platform = platform

    @classmethod
    def check_engine_args(cls, engine_args: dict[str, Any]) -> None:
        """Raise a ConfigError naming ``rollout.engine_args.<key>`` for arguments this engine refuses.

        Called when the config is resolved, before anything starts. The default accepts everything:
        engines that pass the arguments through to their server's command line (vLLM, SGLang) leave
        their checking to the server.
        """

    @abc.abstractmethod
    def launch_servers(self, scheduler: Scheduler) -> list[str]:
        """Start ``config.rollout.servers`` servers through ``scheduler``; attach; return addresses."""

    def start_servers(self, scheduler: Scheduler) -> Callable[[], list[str]]:
        """``launch_servers`` in two halves: start the servers, and return the call that waits until
        they are up, attaches them and returns their addresses.

        The controller starts the training workers in between, so that both load at once. The
        default launches and waits here; engines whose servers are processes split the two.
        """
        addresses = self.launch_servers(scheduler)
        return lambda: addresses

    @abc.abstractmethod
    def attach(self, addresses: list[str]) -> None:
        """Use already-running servers at ``host:port`` addresses."""

    @abc.abstractmethod
    async def agenerate(self, request: GenerationRequest) -> GenerationResponse:
        """Generate to completion, surviving pauses (see module docstring)."""

    async def agenerate_group(self, requests: Sequence[GenerationRequest]) -> list[GenerationResponse]:
        """``agenerate`` every request (e.g. the ``n`` samples of one prompt), responses in order.

        Each response is what ``agenerate`` would give (per-token versions, surviving pauses);
        engines whose servers take many requests in one call override this to make one round
        trip per group.
        """
        return list(await asyncio.gather(*(self.agenerate(r) for r in requests)))

    def client_session(self) -> AbstractAsyncContextManager[None]:
        """Inside it, ``agenerate`` calls on the running loop share one client session
        (connections stay open); the rollout runner wraps its loop's life in one."""
        return contextlib.nullcontext()

    @abc.abstractmethod
    def pause(self) -> None:
        """Abort in-flight requests on every server and hold new ones until ``resume``."""

    @abc.abstractmethod
    def resume(self) -> None:
        """Let generation continue (held requests re-submit their partial outputs)."""

    @abc.abstractmethod
    def health(self) -> list[bool]:
        """One flag per attached server."""

    @abc.abstractmethod
    def load_weights_from_disk(self, path: str, version: int) -> None:
        """Ask every server to load HF safetensors from ``path`` and serve them as ``version``."""

    @abc.abstractmethod
    def set_version(self, version: int) -> None:
        """Tag tokens generated from now on with ``version``."""

    @abc.abstractmethod
    def close(self) -> None:
        """Release client resources (servers are stopped by their scheduler)."""


@runtime_checkable
class SupportsElasticFleet(Protocol):
    """An engine whose servers can come and go at run time (every HTTPServerEngine); the fleet
    manager (:mod:`areal_core.rollout.fleet`) drives it. An engine without it has a fixed fleet."""

    def members(self) -> tuple[str, ...]:
        """Addresses of the servers that receive control calls (weights, version)."""
        ...

    def pending_servers(self) -> tuple[str, ...]:
        """Servers started at run time that wait for the next ``join_pending``."""
        ...

    async def agenerate_on(self, address: str, request: GenerationRequest) -> GenerationResponse:
        """``agenerate`` on the server at ``address`` (to probe one server)."""
        ...

    def start_server(self, scheduler: Scheduler | None = None) -> str:
        """Start one more server; it waits, without traffic, for the next ``join_pending``."""
        ...

    def add_server(self, address: str) -> None:
        """Queue an already-running server at ``address`` to join at the next ``join_pending``."""
        ...

    def remove_server(self, address: str, reason: str = "removed") -> bool:
        """Take ``address`` out of the fleet (and stop it if this engine started it)."""
        ...

    def server_lost(self, address: str) -> bool:
        """Whether the server at ``address`` is gone for good."""
        ...

    def join_pending(self) -> list[str]:
        """Make queued servers members without traffic (generation paused); returns them."""
        ...

    def open_traffic(self, addresses: Sequence[str], version: int) -> None:
        """Route requests to ``addresses``, which now serve weight ``version``."""
        ...

    def server_handles(self) -> list[ProcessHandle]:
        """Every server process this engine started (the fleet, not the trainer, handles their exit)."""
        ...


@runtime_checkable
class SupportsKeepPause(Protocol):
    """An engine whose servers can hold in-flight requests through a weight update instead of
    aborting them (``rollout.pause_mode: keep``): each request keeps its KV cache and decodes on the
    new weights after ``resume``, every token tagged with the version that sampled it."""

    def pause_keeping(self) -> None:
        """Hold every in-flight request on every server at its next decode step, and new ones
        until ``resume``; nothing is aborted."""
        ...


@runtime_checkable
class SupportsWeightChannel(Protocol):
    """An engine that takes collective weight updates (``actor.weight_update: xccl``) through its
    own protocol: it names the trainer half (:mod:`areal_core.api.weight_channel`) and commits."""

    def weight_channel(self, master_addr: str, master_port: int, group_name: str) -> ChannelSpec:
        """The channel every training rank opens to reach this engine's current members, with its
        rendezvous at ``master_addr:master_port`` (hosted by trainer rank 0)."""
        ...

    def commit_weights(self, version: int) -> None:
        """Serve what the channel sent as ``version`` on every member (staging engines swap now;
        until this call the old weights keep serving)."""
        ...
