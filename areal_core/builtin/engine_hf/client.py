"""HFEngine: the client of hf generation servers (see :mod:`areal_core.builtin.engine_hf.server`).

``agenerate``/``agenerate_group`` run on the rollout controller's event loop (a background
thread); a group's unfinished requests go to one server in one ``/generate_batch`` call per
segment. Control calls (``pause``, ``load_weights_from_disk``, ...) come from the main thread and
use blocking HTTP, fanned out to every server in parallel. A pause gate shared by both sides
holds generation between ``pause()`` and ``resume()``.
"""

from __future__ import annotations

import json
import sys
import urllib.request
from pathlib import Path
from typing import TYPE_CHECKING, Any

import attrs

from areal_core.api import from_dict, to_dict
from areal_core.api.http_engine import HTTPServerEngine, Segment, SegmentCall
from areal_core.api.errors import ArealError
from areal_core.api.wire import (
    TOKEN_ENV,
    GenerateBody,
    GenerateResult,
    Health,
    LoadWeightsBody,
    VersionBody,
    from_json,
    to_json,
)
from areal_core.api.scheduler import ProcessSpec

if TYPE_CHECKING:
    from areal_core.api.weight_channel import ChannelSpec

@attrs.frozen(kw_only=True)
class HFEngineArgs:
    """``rollout.engine_args`` the hf server understands (passed as ``--max-batch-size`` etc.)."""

    max_batch_size: int = attrs.field(default=64, validator=attrs.validators.ge(1))  # requests decoded together
    group_timeout: float = attrs.field(default=300.0, validator=attrs.validators.gt(0))  # weight-group collectives (s)


class HFEngine(HTTPServerEngine):
    """Client of ``config.rollout.servers`` hf servers; see the module docstring for threading."""

    name = "hf"
    server_label = "hf server"
    token_env = TOKEN_ENV
    pause_route = "/abort_all"
    resume_route = "/continue"
    commit_route = "/commit_weights"
    rollback_route = "/rollback_weights"
    channel_takes_adapter = True  # a server started with --lora stages and commits adapter tensors

    @classmethod
    def check_engine_args(cls, engine_args: dict[str, Any]) -> None:
        from_dict(engine_args, HFEngineArgs, "rollout.engine_args")

    # ---------------------------------------------------------------- servers
    def server_spec(self, index: int, port: int | str, run_dir: Path, host: str = "127.0.0.1") -> ProcessSpec:
        cmd = [
            sys.executable, "-m", "areal_core.builtin.engine_hf.server",
            "--model", self.config.model.path,
            "--host", host,
            "--port", str(port),
            "--dtype", self.config.model.dtype,
            "--allowed-root", str(run_dir),
            "--seed", str(self.config.seed + index),
        ]  # fmt: skip
        for key, value in self.config.rollout.engine_args.items():
            cmd += [f"--{key.replace('_', '-')}", str(value)]
        if self.config.actor.lora is not None:  # updates then carry the adapter alone
            cmd += ["--lora", json.dumps(to_dict(self.config.actor.lora))]
        return ProcessSpec(
            name=f"hf_server{index}",
            cmd=cmd,
            env={TOKEN_ENV: self.token, **self.platform.engine_env(self.name)},
            threads=self.config.rollout.threads_per_server,
            log_file=str(run_dir / "logs" / f"hf_server{index}.log"),
        )

    def server_is_up(self, address: str) -> bool:
        return _get_health(address, timeout=1.0) is not None

    def server_health(self) -> list[Health | None]:
        """Each server's ``/health`` reply (version, paused, running, queued, served); None if down."""
        return [_get_health(address) for address in self.addresses]

    # ---------------------------------------------------------------- generation
    async def _generate_segments(self, session: Any, address: str, *, calls: list[SegmentCall]) -> list[Segment]:
        """One ``/generate_batch`` call for every request's next segment."""
        bodies = [to_json(_generate_body(c)) for c in calls]
        async with session.post(f"http://{address}/generate_batch", json=bodies) as resp:
            data = await resp.json(content_type=None)
            if resp.status != 200:
                raise ArealError(f"hf server {address} /generate_batch failed ({resp.status}): {data.get('error', data)}")
        if not isinstance(data, list) or len(data) != len(calls):
            raise ArealError(f"hf server {address} /generate_batch answered {data!r:.200} to {len(calls)} requests")
        results = [from_json(GenerateResult, item) for item in data]
        return [
            Segment(output_ids=r.output_ids, logprobs=r.logprobs, versions=r.versions, stop_reason=r.stop_reason)
            for r in results
        ]

    # ---------------------------------------------------------------- control (main thread)
    def pause_keeping(self) -> None:
        """``/hold_all``: every server parks its running requests between decode steps, KV cache
        kept; after ``resume`` they decode on the new weights (``rollout.pause_mode: keep``)."""
        self._gate.close()
        self._broadcast("/hold_all", {})

    def load_weights_from_disk(self, path: str, version: int) -> None:
        body = to_json(LoadWeightsBody(path=str(path), version=version))
        self._broadcast("/load_weights", body)

    def set_version(self, version: int) -> None:
        self._broadcast("/set_version", to_json(VersionBody(version=version)))

    def weight_channel(self, master_addr: str, master_port: int, group_name: str) -> ChannelSpec:
        """Gloo buckets from trainer rank 0 (:mod:`areal_core.builtin.engine_hf.channel`)."""
        return self._channel_spec(
            "areal_core.builtin.engine_hf.channel:HFWeightChannel", "gloo", master_addr, master_port, group_name,
            loads_on_arrival=False,  # staged until /commit_weights
        )

    def commit_weights(self, version: int) -> None:
        """Phase two of a collective update: :meth:`commit_staged` (``/commit_weights``, undone by
        ``/rollback_weights``)."""
        self.commit_staged(version)

    def weights_digest(self) -> list[dict[str, str]]:
        """Per server: parameter name -> sha256 of its dtype, shape and bytes (see ``receiver.tensor_digest``)."""
        return [reply["digest"] for reply in self._broadcast("/weights_digest", {})]


def _generate_body(call: SegmentCall) -> GenerateBody:
    """The ``/generate`` body continuing ``call.request`` after its generated tokens."""
    params = call.request.sampling
    return GenerateBody(
        rid=call.request.request_id,
        input_ids=call.request.input_ids + call.generated,
        max_new_tokens=params.max_new_tokens - len(call.generated),
        temperature=params.temperature,
        top_p=params.top_p,
        greedy=params.greedy,
        stop_token_ids=list(params.stop_token_ids),
        seed=params.seed,
    )


def _get_health(address: str, timeout: float = 5.0) -> Health | None:
    try:
        with urllib.request.urlopen(f"http://{address}/health", timeout=timeout) as resp:
            return from_json(Health, json.loads(resp.read()))
    except (OSError, ValueError):
        return None
