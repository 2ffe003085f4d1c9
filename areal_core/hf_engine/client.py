"""HFEngine: the client of hf generation servers (see :mod:`areal_core.hf_engine.server`).

``agenerate`` runs on the rollout controller's event loop (a background thread) with one aiohttp
session per call; control calls (``pause``, ``load_weights_from_disk``, ...) come from the main
thread and use blocking HTTP, fanned out to every server in parallel. A pause gate shared by
both sides holds generation between ``pause()`` and ``resume()``.
"""

from __future__ import annotations

import functools
import json
import os
import secrets
import sys
import time
import urllib.request
from pathlib import Path
from typing import TYPE_CHECKING, Any

from areal_core.engine import GenerationRequest, GenerationResponse, InferenceEngine
from areal_core.engine_http import PauseGate, Router, fan_out, wait_healthy
from areal_core.errors import ArealError, ConfigError
from areal_core.hf_engine.protocol import (
    TOKEN_ENV,
    CommitWeightsBody,
    GenerateBody,
    GenerateResult,
    Health,
    LoadWeightsBody,
    ReceiveWeightsBody,
    SetVersionBody,
    WeightGroupBody,
    from_json,
    to_json,
)
from areal_core.scheduler.base import ProcessHandle, ProcessSpec, free_port

if TYPE_CHECKING:
    from areal_core.config import Config
    from areal_core.platform import Platform
    from areal_core.scheduler.base import Scheduler
    from areal_core.weights import WeightUpdateMeta

#: ``rollout.engine_args`` keys the hf server understands (passed as ``--max-batch-size`` etc.).
ENGINE_ARGS = ("max_batch_size", "group_timeout")

class HFEngine(InferenceEngine):
    """Client of ``config.rollout.servers`` hf servers; see the module docstring for threading."""

    name = "hf"

    def __init__(self, config: Config, platform: Platform) -> None:
        super().__init__(config, platform)
        self.token = os.environ.get(TOKEN_ENV) or secrets.token_hex(16)
        self.addresses: list[str] = []
        self._router = Router(1)
        self._gate = PauseGate()

    # ---------------------------------------------------------------- servers
    def launch_servers(self, scheduler: Scheduler) -> list[str]:
        rollout = self.config.rollout
        if not self.config.model.path:
            raise ConfigError("model.path", "the hf engine needs a model directory (tiny models: ensure_tiny_model)")
        unknown = sorted(set(rollout.engine_args) - set(ENGINE_ARGS))
        if unknown:
            known = ", ".join(ENGINE_ARGS)
            raise ConfigError(f"rollout.engine_args.{unknown[0]}", f"unknown hf engine arg; known: {known}")
        run_dir = self.config.run_dir.resolve()
        (run_dir / "logs").mkdir(parents=True, exist_ok=True)
        started: list[tuple[str, ProcessHandle, Path]] = []
        for i in range(rollout.servers):
            address = f"127.0.0.1:{free_port()}"
            log_file = run_dir / "logs" / f"hf_server{i}.log"
            spec = ProcessSpec(
                name=f"hf_server{i}",
                cmd=self._server_cmd(address, run_dir, seed=self.config.seed + i),
                env={TOKEN_ENV: self.token, **self.platform.engine_env(self.name)},
                threads=rollout.threads_per_server,
                log_file=str(log_file),
            )
            started.append((address, scheduler.start(spec), log_file))
        deadline = time.monotonic() + rollout.server_startup_timeout
        for address, handle, log_file in started:
            up = functools.partial(_is_up, address)
            wait_healthy(up, handle, address, log_file, deadline, "hf server")
        self.attach([address for address, _, _ in started])
        return list(self.addresses)

    def _server_cmd(self, address: str, run_dir: Path, seed: int) -> list[str]:
        cmd = [
            sys.executable, "-m", "areal_core.hf_engine.server",
            "--model", self.config.model.path,
            "--port", address.rsplit(":", 1)[1],
            "--dtype", self.config.model.dtype,
            "--allowed-root", str(run_dir),
            "--seed", str(seed),
        ]  # fmt: skip
        for key, value in self.config.rollout.engine_args.items():
            cmd += [f"--{key.replace('_', '-')}", str(value)]
        return cmd

    def attach(self, addresses: list[str]) -> None:
        if not addresses:
            raise ValueError("attach() needs at least one server address (host:port)")
        self.addresses = list(addresses)
        self._router = Router(len(addresses))

    def health(self) -> list[bool]:
        return [state is not None for state in self.server_health()]

    def server_health(self) -> list[Health | None]:
        """Each server's ``/health`` reply (version, paused, running, queued, served); None if down."""
        return [_get_health(address) for address in self.addresses]

    # ---------------------------------------------------------------- generation
    async def agenerate(self, request: GenerationRequest) -> GenerationResponse:
        import aiohttp

        params = request.sampling
        start = time.monotonic()
        output_ids: list[int] = []
        logprobs: list[float] = []
        versions: list[int] = []
        server = self._router.acquire(request.request_id)
        timeout = aiohttp.ClientTimeout(total=self.config.rollout.request_timeout)
        try:
            async with aiohttp.ClientSession(timeout=timeout, headers=self._headers()) as session:
                while True:
                    await self._gate.wait()
                    body = GenerateBody(
                        rid=request.request_id,
                        input_ids=request.input_ids + output_ids,
                        max_new_tokens=params.max_new_tokens - len(output_ids),
                        temperature=params.temperature,
                        top_p=params.top_p,
                        greedy=params.greedy,
                        stop_token_ids=list(params.stop_token_ids),
                        seed=params.seed,
                    )
                    result = await self._agenerate_once(session, self.addresses[server], body)
                    output_ids += result.output_ids
                    logprobs += result.logprobs
                    versions += result.versions
                    if result.stop_reason != "abort":  # aborted by pause(): wait, then continue
                        break
        finally:
            self._router.release(server)
        return GenerationResponse(
            input_ids=list(request.input_ids),
            output_ids=output_ids,
            logprobs=logprobs,
            versions=versions,
            stop_reason=result.stop_reason,  # type: ignore[arg-type]
            latency=time.monotonic() - start,
        )

    async def _agenerate_once(self, session: Any, address: str, body: GenerateBody) -> GenerateResult:
        async with session.post(f"http://{address}/generate", json=to_json(body)) as resp:
            data = await resp.json(content_type=None)
            if resp.status != 200:
                raise ArealError(f"hf server {address} /generate failed ({resp.status}): {data.get('error', data)}")
        return from_json(GenerateResult, data)

    # ---------------------------------------------------------------- control (main thread)
    def pause(self) -> None:
        self._gate.close()
        self._fan_out("/abort_all", [{}] * len(self.addresses))

    def resume(self) -> None:
        self._fan_out("/continue", [{}] * len(self.addresses))
        self._gate.open()

    def load_weights_from_disk(self, path: str, version: int) -> None:
        body = to_json(LoadWeightsBody(path=str(path), version=version))
        self._fan_out("/load_weights", [body] * len(self.addresses))

    def set_version(self, version: int) -> None:
        self._fan_out("/set_version", [to_json(SetVersionBody(version=version))] * len(self.addresses))

    def init_weight_group(self, meta: WeightUpdateMeta) -> None:
        """Server ``i`` joins as rank ``1 + i``; blocks until the trainer (rank 0) joins too."""
        if meta.world_size != 1 + len(self.addresses):
            raise ValueError(
                f"world_size {meta.world_size} must be 1 (trainer) + {len(self.addresses)} hf servers"
            )
        bodies = [
            to_json(
                WeightGroupBody(
                    master_addr=meta.master_addr,
                    master_port=meta.master_port,
                    rank_offset=1 + i,
                    world_size=meta.world_size,
                    backend=meta.backend,
                    group_name=meta.group_name,
                )
            )
            for i in range(len(self.addresses))
        ]
        self._fan_out("/init_weight_group", bodies)

    def receive_weights(self, meta: WeightUpdateMeta) -> None:
        """Blocks until rank 0 broadcasts the bucket; it stays staged until ``commit_weights``."""
        body = ReceiveWeightsBody(
            names=list(meta.names),
            dtypes=list(meta.dtypes),
            shapes=[list(s) for s in meta.shapes],
            version=meta.version,
        )
        self._fan_out("/receive_weights", [to_json(body)] * len(self.addresses))

    def commit_weights(self, version: int) -> None:
        self._fan_out("/commit_weights", [to_json(CommitWeightsBody(version=version))] * len(self.addresses))

    def weights_digest(self) -> list[dict[str, str]]:
        """Per server: parameter name -> sha256 of its dtype, shape and bytes (see ``receiver.tensor_digest``)."""
        return [reply["digest"] for reply in self._fan_out("/weights_digest", [{}] * len(self.addresses))]

    def close(self) -> None:
        """Nothing to release: sessions live per ``agenerate`` call, control calls are one-shot."""

    # ---------------------------------------------------------------- HTTP helpers
    def _headers(self) -> dict[str, str]:
        return {"Authorization": f"Bearer {self.token}"}

    def _fan_out(self, endpoint: str, bodies: list[dict[str, Any]]) -> list[dict[str, Any]]:
        """POST ``bodies[i]`` to server ``i`` (in parallel); raise on the first failure."""
        timeout = self.config.rollout.request_timeout
        return fan_out(self.addresses, endpoint, bodies, self._headers(), timeout, "hf server")


def _get_health(address: str, timeout: float = 5.0) -> Health | None:
    try:
        with urllib.request.urlopen(f"http://{address}/health", timeout=timeout) as resp:
            return from_json(Health, json.loads(resp.read()))
    except (OSError, ValueError):
        return None


def _is_up(address: str) -> bool:
    return _get_health(address, timeout=1.0) is not None
