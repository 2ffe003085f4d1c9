"""SGLangEngine: the ``sglang`` inference engine, a client of SGLang servers' native HTTP API.

Generation is ``/generate`` with token ids and ``return_logprob``. ``pause()`` closes the shared
:class:`~areal_core.api.http_engine.PauseGate` and calls ``/pause_generation`` (mode ``abort``): SGLang
ends every running and queued request with its partial output and holds new ones until
``/continue_generation``. ``agenerate`` then waits for ``resume()`` and re-submits prompt + partial
output with the rest of the budget, so one response may carry tokens of two weight versions.
``pause_keeping()`` (``rollout.pause_mode: keep``) is mode ``in_place``: SGLang holds running requests
with their KV cache, and they decode on after ``/continue_generation`` in the same call. SGLang refuses
to flush its cache under held requests, so updates meanwhile leave it (``flush_cache`` false): a
new request may then reuse a prefix the old weights computed, as the held requests do.

With ``actor.lora`` a disk update is a LoRA adapter: ``/load_lora_adapter`` under a name per
version, requests name it (``lora_path``), the previous one is unloaded (``/unload_lora_adapter``).

Weight versions are SGLang's own: servers start with ``--weight-version 0``, updates pass
``weight_version``, ``set_version`` calls ``/update_weight_version``, and each reply's
``meta_info.weight_versions`` spans tag its tokens.

Collective updates (``xccl``) go through SGLang's own protocol: ``weight_channel`` names the
trainer half (:mod:`areal_engine_sglang.channel`: SGLang's group handshake, then per bucket
``/update_weights_from_distributed`` with ``load_format: flattened_bucket`` inside a
``/begin_weight_update`` session) and ``commit_weights`` ends the session and sets the version.
SGLang 0.5.23 loads each bucket into the served model as it arrives (there is no staging API), so
until the commit only paused generation (the trainer pauses around updates) keeps tokens off a
half-updated model, and the channel says so (``ChannelSpec.loads_on_arrival``): an update that
fails midway is sent again at once, and if that fails too its servers are replaced (see
:class:`~areal_reshard_xccl.updater.XcclWeightUpdater`), so none serves a mix of old and new weights.
"""

from __future__ import annotations

import logging
import sys
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

from areal_core.api.engine import GenerationRequest
from areal_core.api.http_engine import HTTPServerEngine, Segment, SegmentCall, one_call_each
from areal_core.api.http_json import answers_ok, get_json
from areal_core.api.errors import ArealError
from areal_core.api.scheduler import ProcessSpec
from areal_engine_sglang.launch import require_sglang, server_command, server_env
from areal_engine_sglang.protocol import (
    DiskUpdateBody,
    GenerateBody,
    LoraLoadBody,
    LoraUnloadBody,
    PauseBody,
    WeightVersionBody,
    parse_generate,
    sampling_params,
    to_json,
)

logger = logging.getLogger(__name__)

if TYPE_CHECKING:
    from areal_core.api import Config
    from areal_core.api.platform import Platform
    from areal_core.api.scheduler import Scheduler
    from areal_core.api.weight_channel import ChannelSpec

#: The bearer token (SGLang's ``--api-key``); set it to attach to servers started by hand.
TOKEN_ENV = "AREAL_SGLANG_TOKEN"
_LABEL = "sglang server"


class SGLangEngine(HTTPServerEngine):
    """Client of ``config.rollout.servers`` SGLang servers (``rollout.engine: sglang``)."""

    name = "sglang"
    server_label = _LABEL
    token_env = TOKEN_ENV
    pause_route = "/pause_generation"
    resume_route = "/continue_generation"
    adapters_by_name = True  # /load_lora_adapter under a name per version

    def __init__(self, config: Config, platform: Platform) -> None:
        super().__init__(config, platform)
        self.adapter: str | None = None  # the LoRA adapter requests name (None: the base model)

    # ---------------------------------------------------------------- servers
    def start_servers(self, scheduler: Scheduler) -> Callable[[], list[str]]:
        require_sglang()
        return super().start_servers(scheduler)

    def server_spec(self, index: int, port: int | str, run_dir: Path, host: str = "127.0.0.1") -> ProcessSpec:
        seed = self.config.seed + index
        return ProcessSpec(
            name=f"sglang_server{index}",
            cmd=[sys.executable, *server_command(self.config, port, seed=seed, token=self.token, host=host)],
            env=server_env(self.platform),
            threads=self.config.rollout.threads_per_server,
            log_file=str(run_dir / "logs" / f"sglang_server{index}.log"),
        )

    def server_is_up(self, address: str) -> bool:
        """``GET /health`` answers 200 (open route; slow on servers started without our env, see launch)."""
        return answers_ok(address, timeout=5.0)

    def served_versions(self) -> list[int]:
        """Each server's current weight version (``GET /model_info``)."""
        versions = []
        for address in self.addresses:
            info = get_json(address, "/model_info", self._headers(), 10.0, _LABEL)
            try:
                versions.append(int(info["weight_version"]))
            except (KeyError, TypeError, ValueError):
                raise ArealError(f"{_LABEL} {address} /model_info has no integer weight_version: {info}") from None
        return versions

    # ---------------------------------------------------------------- generation
    async def _generate_segments(self, session: Any, address: str, *, calls: list[SegmentCall]) -> list[Segment]:
        return await one_call_each(self._generate_segment, session, address, calls)

    async def _generate_segment(
        self, session: Any, address: str, *, request: GenerationRequest, generated: list[int], attempt: int
    ) -> Segment:
        body = GenerateBody(
            rid=f"{request.request_id}-{attempt}",  # SGLang keys in-flight state by rid
            input_ids=request.input_ids + generated,
            sampling_params=sampling_params(request.sampling, len(generated)),
            lora_path=self.adapter,
        )
        async with session.post(f"http://{address}/generate", json=to_json(body)) as resp:
            data = await resp.json(content_type=None)
            if resp.status != 200:
                error = data.get("error", data) if isinstance(data, dict) else data
                message = error.get("message", error) if isinstance(error, dict) else error
                raise ArealError(f"{_LABEL} {address} /generate failed ({resp.status}): {message}")
        return parse_generate(data)

    # ---------------------------------------------------------------- control (main thread)
    def pause(self) -> None:
        self._gate.close()
        self._broadcast(self.pause_route, to_json(PauseBody(mode="abort")))

    def pause_keeping(self) -> None:
        """``/pause_generation`` mode ``in_place``: running requests stay on every server with their
        KV cache and decode on after ``resume`` (``rollout.pause_mode: keep``)."""
        self._gate.close()
        self._broadcast(self.pause_route, to_json(PauseBody(mode="in_place")))

    def load_weights_from_disk(self, path: str, version: int) -> None:
        if self.config.actor.lora is not None:
            self._load_adapter(path, version)
            return
        body = DiskUpdateBody(model_path=str(path), weight_version=str(version), flush_cache=not self.holds_requests)
        self._broadcast("/update_weights_from_disk", to_json(body))

    def _load_adapter(self, path: str, version: int) -> None:
        """Load the adapter at ``path`` as ``version`` (every member), then unload the previous one
        where it is loaded."""
        name = f"areal-lora-v{version}"
        self._broadcast("/load_lora_adapter", to_json(LoraLoadBody(lora_name=name, lora_path=str(path))))
        previous, self.adapter = self.adapter, name
        self.set_version(version)
        if previous not in (None, name):  # a server that joined since never had it: nothing to unload there
            bodies = [to_json(LoraUnloadBody(lora_name=previous))] * len(self.members())
            for address, outcome in self._post_each("/unload_lora_adapter", bodies):
                if isinstance(outcome, ArealError):
                    logger.info("%s: adapter %s not unloaded: %s", address, previous, outcome)

    def set_version(self, version: int) -> None:
        self._broadcast("/update_weight_version", to_json(WeightVersionBody(new_version=str(version))))

    def weight_channel(self, master_addr: str, master_port: int, group_name: str) -> ChannelSpec:
        """SGLang's group handshake and ``flattened_bucket`` broadcasts over the platform's backend."""
        return self._channel_spec(
            "areal_engine_sglang.channel:SGLangWeightChannel",
            self.platform.dist_backend,
            master_addr,
            master_port,
            group_name,
            loads_on_arrival=True,  # SGLang has no staging API
        )

    def commit_weights(self, version: int) -> None:
        """End the weight-update session the channel opened, then serve ``version``; SGLang refuses
        the end (``no weight-update session is open``) when nothing was sent."""
        self._broadcast("/end_weight_update", {})
        self.set_version(version)
