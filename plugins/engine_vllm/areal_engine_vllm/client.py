"""VLLMEngine: the ``vllm`` inference engine, a client of real vLLM OpenAI servers.

Generation uses vLLM's own token-in/token-out ``/inference/v1/generate`` (token ids in; token ids,
the sampled tokens' log-probs and the weight version that sampled each token, as the engine core
labels it, out). Control calls use the ``/areal/*`` routes the plugin adds (see
:mod:`areal_engine_vllm.routes`). Threading and pausing are those of the ``hf`` engine: the
shared :class:`~areal_core.api.http_engine.PauseGate` holds generation between ``pause()`` and
``resume()``, and an aborted request is re-submitted as prompt + partial output with the
remaining budget, so one response may carry tokens of two weight versions. ``pause_keeping()``
(``rollout.pause_mode: keep``) is vLLM's own ``pause_generation(mode="keep")``: running requests
are frozen with their KV cache and decode on after ``resume()``, in the same call.

With ``actor.lora`` a disk update is a LoRA adapter, loaded through vLLM's own
``/v1/load_lora_adapter`` under a name per version; requests name the current version's
adapter (the base model's name before the first), and the previous adapter is unloaded.
"""

from __future__ import annotations

import logging
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any

from areal_core.api.engine import GenerationRequest, SamplingParams
from areal_core.api.http_engine import HTTPServerEngine, Segment, SegmentCall, one_call_each
from areal_core.api.http_json import answers_ok, get_json
from areal_core.api.errors import ArealError
from areal_core.api.scheduler import ProcessSpec
from areal_engine_vllm.launch import server_command, server_env
from areal_engine_vllm.protocol import (
    INITIAL_WEIGHT_LABEL,
    SERVED_NAME,
    TOKEN_ENV,
    DiskUpdateBody,
    ServerState,
    VersionBody,
    from_json,
    to_json,
    transfer_backend,
)

logger = logging.getLogger(__name__)

if TYPE_CHECKING:
    from areal_core.api import Config
    from areal_core.api.platform import Platform
    from areal_core.api.weight_channel import ChannelSpec

_LABEL = "vllm server"
_SEED_STRIDE = 1_000_003  # a resumed segment samples with seed * stride + tokens so far


class VLLMEngine(HTTPServerEngine):
    """Client of ``config.rollout.servers`` vLLM servers started with this plugin's patch."""

    name = "vllm"
    server_label = _LABEL
    token_env = TOKEN_ENV
    pause_route = "/areal/pause"
    hold_route = "/areal/hold"
    resume_route = "/areal/resume"
    commit_route = "/areal/commit_weights"
    rollback_route = "/areal/rollback_weights"
    adapters_by_name = True  # /v1/load_lora_adapter under a name per version

    def __init__(self, config: Config, platform: Platform) -> None:
        super().__init__(config, platform)
        self.served_name = SERVED_NAME  # what requests name: the base model, or the current adapter

    @property
    def transfer_backend(self) -> str:
        """vLLM's weight-transfer backend for this platform: ``areal_gloo`` (ours, CPU), ``nccl``, ``hccl``."""
        return transfer_backend(self.platform.device_type)

    # ---------------------------------------------------------------- servers
    def server_spec(self, index: int, port: int | str, run_dir: Path, host: str = "127.0.0.1") -> ProcessSpec:
        return ProcessSpec(
            name=f"vllm_server{index}",
            cmd=[sys.executable, *server_command(self.config, port, self.config.seed + index, self.transfer_backend, host)],
            env=server_env(self.platform, self.token, run_dir, lora=self.config.actor.lora is not None),
            threads=self.config.rollout.threads_per_server,
            log_file=str(run_dir / "logs" / f"vllm_server{index}.log"),
        )

    def server_is_up(self, address: str) -> bool:
        return answers_ok(address)

    def server_states(self) -> list[ServerState]:
        """Each server's served weight version and pause flag (``GET /areal/state``)."""
        return [
            from_json(ServerState, get_json(address, "/areal/state", self._headers(), 10.0, _LABEL))
            for address in self.addresses
        ]

    # ---------------------------------------------------------------- generation
    async def _generate_segments(self, session: Any, address: str, *, calls: list[SegmentCall]) -> list[Segment]:
        return await one_call_each(self._generate_segment, session, address, calls)

    async def _generate_segment(
        self, session: Any, address: str, *, request: GenerationRequest, generated: list[int], attempt: int
    ) -> Segment:
        body = _generate_body(self.served_name, request.input_ids + generated, request.sampling, len(generated))
        async with session.post(f"http://{address}/inference/v1/generate", json=body) as resp:
            data = await resp.json(content_type=None)
            if resp.status != 200:
                raise ArealError(f"{_LABEL} {address} /inference/v1/generate failed ({resp.status}): {data}")
        choice = data["choices"][0]
        ids = [int(i) for i in choice["token_ids"]]
        return Segment(
            output_ids=ids,
            logprobs=[float(entry["logprob"]) for entry in (choice["logprobs"] or {}).get("content") or []],
            versions=_token_versions(choice.get("weight_versions"), len(ids), address),
            stop_reason=choice.get("finish_reason") or "abort",
        )

    # ---------------------------------------------------------------- control (main thread)
    def pause_keeping(self) -> None:
        """``/areal/hold``: every server freezes its running requests, KV cache kept; after
        ``resume`` they decode on the weights loaded meanwhile (``rollout.pause_mode: keep``)."""
        self._gate.close()
        self._broadcast(self.hold_route, {})

    def load_weights_from_disk(self, path: str, version: int) -> None:
        if self.config.actor.lora is not None:
            self._load_adapter(path, version)
            return
        self._broadcast("/areal/update_weights_from_disk", to_json(DiskUpdateBody(path=str(path), version=version)))

    def _load_adapter(self, path: str, version: int) -> None:
        """Load the adapter at ``path`` as ``version`` (every member), then unload the previous one
        where it is loaded."""
        name = f"{SERVED_NAME}-lora-v{version}"
        self._broadcast("/v1/load_lora_adapter", {"lora_name": name, "lora_path": str(path)})
        previous, self.served_name = self.served_name, name
        self.set_version(version)
        if previous not in (SERVED_NAME, name):  # a server that joined since never had it: nothing to unload there
            bodies = [{"lora_name": previous}] * len(self.members())
            for address, outcome in self._post_each("/v1/unload_lora_adapter", bodies):
                if isinstance(outcome, ArealError):
                    logger.info("%s: adapter %s not unloaded: %s", address, previous, outcome)

    def set_version(self, version: int) -> None:
        self._broadcast("/areal/set_version", to_json(VersionBody(version=version)))

    def weight_channel(self, master_addr: str, master_port: int, group_name: str) -> ChannelSpec:
        """vLLM's trainer engine for :attr:`transfer_backend`, driven from every training rank by
        :class:`~areal_engine_vllm.channel.VLLMWeightChannel`."""
        backend = self.transfer_backend
        return self._channel_spec(
            "areal_engine_vllm.channel:VLLMWeightChannel", backend, master_addr, master_port, group_name,
            loads_on_arrival=backend != "areal_gloo",  # only ours stages until the commit
        )

    def commit_weights(self, version: int) -> None:
        """Phase two of a collective update: :meth:`commit_staged` (``/areal/commit_weights``, undone
        by ``/areal/rollback_weights``). With vLLM's ``nccl``, which loads on arrival
        (``ChannelSpec.loads_on_arrival``), a commit only sets the version and a rollback is refused
        (the server is then replaced)."""
        self.commit_staged(version)

    def weights_digest(self) -> list[dict[str, str]]:
        """Per server: ``"worker:parameter"`` -> sha256 of what it serves (vLLM's layout)."""
        return [reply["digest"] for reply in self._broadcast("/areal/weights_digest", {})]


def _generate_body(model: str, prompt: list[int], params: SamplingParams, generated: int) -> dict[str, Any]:
    """An ``/inference/v1/generate`` request to ``model`` continuing after ``generated`` tokens of
    ``params``' budget."""
    sampling: dict[str, Any] = {
        "max_tokens": params.max_new_tokens - generated,
        "temperature": 0.0 if params.greedy else params.temperature,
        "top_p": 1.0 if params.greedy else params.top_p,
        "logprobs": 0,  # the sampled token's log-prob only
        "stop_token_ids": list(params.stop_token_ids),
        "skip_special_tokens": False,
        "detokenize": False,
    }
    if params.seed is not None:
        sampling["seed"] = (params.seed * _SEED_STRIDE + generated) % (1 << 63)
    return {"model": model, "token_ids": prompt, "sampling_params": sampling, "output_mode": "tokens"}


def _token_versions(spans: list[dict[str, Any]] | None, n_tokens: int, address: str) -> list[int]:
    """The weight version of each output token, from vLLM's spans (``{"version", "start", "end"}``:
    tokens ``[start, end)`` were sampled by the weights labelled ``version``)."""
    versions: list[int] = []
    for span in spans or []:
        label = span["version"]
        versions += [0 if label == INITIAL_WEIGHT_LABEL else int(label)] * (span["end"] - span["start"])
    if len(versions) != n_tokens:
        raise ArealError(f"{_LABEL} {address} labelled {len(versions)} of {n_tokens} tokens with a weight version: {spans}")
    return versions
