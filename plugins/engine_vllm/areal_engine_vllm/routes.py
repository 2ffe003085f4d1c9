"""The ``vllm.endpoint_plugins`` entry point: bearer-token ``/areal/*`` routes on vLLM's API server.

Each route is a thin call into vLLM's own engine client. vLLM loads it only when ``VLLM_PLUGINS``
names ``areal``; without ``AREAL_VLLM_TOKEN`` it adds nothing.

| route | vLLM call |
| --- | --- |
| POST /areal/pause | ``pause_generation(mode="abort")``: in-flight requests end with finish_reason "abort" |
| POST /areal/hold | ``pause_generation(mode="keep", clear_cache=False)``: in-flight requests freeze, KV cache kept, until resumed |
| POST /areal/resume | ``resume_generation()`` |
| POST /areal/update_weights_from_disk | ``collective_rpc("areal_reload_from_dir")`` (worker extension) |
| POST /areal/init_weight_transfer_engine | ``init_weight_transfer_engine`` (body ``{"init_info": {...}}``), after ending an update a dead trainer abandoned |
| POST /areal/start_weight_update | ``start_weight_update()`` |
| POST /areal/update_weights | ``update_weights`` (body ``{"update_info": ...}``) |
| POST /areal/finish_weight_update | ``finish_weight_update(weight_version)``, then the prefix cache is reset |
| POST /areal/commit_weights | ``collective_rpc("areal_commit_staged")``: phase two, serve the staged update as ``version``; replies its digest |
| POST /areal/rollback_weights | ``collective_rpc("areal_rollback")``: serve again what the last commit replaced, under its version |
| POST /areal/weights_digest | ``collective_rpc("areal_weights_digest")``: sha256 of every served parameter |
| POST /areal/shutdown_weight_transfer_engine | ``shutdown_weight_transfer_engine()``, after ending an abandoned update |
| POST /areal/set_version | ``update_weight_version`` |
| GET /areal/state | the served version and whether generation is paused |

With ``areal_gloo`` (CPU) ``finish_weight_update`` only seals what was staged: the served weights
change at ``/areal/commit_weights``, which the controller calls on every server once all staged
(a two-phase commit, :meth:`areal_core.api.http_engine.HTTPServerEngine.commit_staged`).

The five weight-transfer routes are vLLM's own RL routes (same names and bodies) behind the
token: vLLM serves those only with ``VLLM_SERVER_DEV_MODE=1``, unauthenticated and next to
``/collective_rpc``. ``/areal/set_version`` (and every route that loads weights) sets vLLM's own
weight-version label (``update_weight_version``), which the engine core stamps on every step's
output: ``/inference/v1/generate`` replies say which label sampled which tokens.
"""

from __future__ import annotations

import hmac
import importlib
import logging
import os
from argparse import Namespace
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse
from starlette.datastructures import State

from areal_engine_vllm.protocol import (
    ALLOWED_ROOT_ENV,
    FAIL_COMMIT_ENV,
    TOKEN_ENV,
    VLLM_PLUGIN_NAME,
    DiskUpdateBody,
    ServerState,
    VersionBody,
    from_json,
    to_json,
)
from areal_engine_vllm.vllm_internals import internal

log = logging.getLogger(f"vllm.{__name__}")  # under "vllm", whose handlers write the server log


class _Weights:
    """The engine client and the served version (cached for the reply header), on the API server."""

    def __init__(self, engine: Any) -> None:
        self.engine = engine
        self.version = 0
        self.previous = 0  # served before the last commit (for a rollback)

    async def set_version(self, version: int) -> None:
        await self.engine.update_weight_version(str(version))
        self.version = version

    async def reset_caches(self) -> None:
        await self.engine.reset_prefix_cache()


class ArealRoutes:
    """vLLM ``EndpointPlugin``: adds the routes (``attach_router``) and their state (``init_state``)."""

    name = VLLM_PLUGIN_NAME
    required_tasks = ("generate",)

    def __init__(self) -> None:
        self.token = os.environ.get(TOKEN_ENV, "")
        self.weights: _Weights | None = None

    def attach_router(self, app: FastAPI) -> None:
        if not self.token:
            log.warning("areal: %s is not set; the /areal routes are not added", TOKEN_ENV)
            return
        _tolerate_structured_decisions_failure()
        routes: dict[str, Callable[[Request], Awaitable[dict[str, Any]]]] = {
            "/areal/pause": self.pause,
            "/areal/hold": self.hold,
            "/areal/resume": self.resume,
            "/areal/update_weights_from_disk": self.update_from_disk,
            "/areal/init_weight_transfer_engine": self.init_weight_transfer_engine,
            "/areal/start_weight_update": self.start_weight_update,
            "/areal/update_weights": self.update_weights,
            "/areal/finish_weight_update": self.finish_weight_update,
            "/areal/shutdown_weight_transfer_engine": self.shutdown_weight_transfer_engine,
            "/areal/commit_weights": self.commit_weights,
            "/areal/rollback_weights": self.rollback_weights,
            "/areal/weights_digest": self.weights_digest,
            "/areal/set_version": self.set_version,
        }
        for path, handler in routes.items():
            app.add_api_route(path, self._guarded(handler), methods=["POST"])
        app.add_api_route("/areal/state", self._guarded(self.state), methods=["GET"])

    async def init_state(self, engine_client: Any, state: State, args: Namespace) -> None:
        if engine_client is not None:
            self.weights = _Weights(engine_client)

    # ------------------------------------------------------------------ handlers
    def _guarded(self, handler: Callable[[Request], Awaitable[dict[str, Any]]]) -> Any:
        expected = f"Bearer {self.token}".encode()

        async def route(request: Request) -> JSONResponse:
            if not hmac.compare_digest(request.headers.get("authorization", "").encode(), expected):
                return JSONResponse({"error": f"missing or wrong bearer token (send ${TOKEN_ENV})"}, status_code=401)
            if self.weights is None:
                return JSONResponse({"error": "this server has no engine"}, status_code=409)
            try:
                return JSONResponse(await handler(request))
            except ValueError as exc:
                log.warning("%s refused: %s", request.url.path, exc)
                return JSONResponse({"error": str(exc)}, status_code=400)
            except Exception as exc:  # noqa: BLE001 - report it to the client, keep serving
                log.exception("%s failed", request.url.path)
                return JSONResponse({"error": f"{type(exc).__name__}: {exc}"}, status_code=500)

        return route

    async def state(self, request: Request) -> dict[str, Any]:
        weights = self._weights()
        return to_json(ServerState(version=weights.version, paused=bool(await weights.engine.is_paused())))

    async def pause(self, request: Request) -> dict[str, Any]:
        await self._weights().engine.pause_generation(mode="abort", clear_cache=True)
        return {"paused": True}

    async def hold(self, request: Request) -> dict[str, Any]:
        await self._weights().engine.pause_generation(mode="keep", clear_cache=False)
        return {"paused": True}

    async def resume(self, request: Request) -> dict[str, Any]:
        await self._weights().engine.resume_generation()
        return {"paused": False}

    async def update_from_disk(self, request: Request) -> dict[str, Any]:
        body = from_json(DiskUpdateBody, await _json(request))
        directory = _check_load_path(body.path)
        _fail_on_purpose(body.version, "disk load")
        weights = self._weights()
        await weights.engine.collective_rpc("areal_reload_from_dir", kwargs={"path": str(directory)})
        await weights.reset_caches()
        await weights.set_version(body.version)
        log.info("areal: loaded %s as version %d", directory, body.version)
        return {"version": body.version}

    async def init_weight_transfer_engine(self, request: Request) -> dict[str, Any]:
        from vllm.distributed.weight_transfer.base import WeightTransferInitRequest

        init_info = _field(await _json(request), "init_info", dict)
        await self._end_abandoned_update()
        await self._weights().engine.init_weight_transfer_engine(WeightTransferInitRequest(init_info=init_info))
        return {"message": "Weight transfer initialized"}

    async def start_weight_update(self, request: Request) -> dict[str, Any]:
        await self._weights().engine.start_weight_update()
        return {"message": "Weight update started"}

    async def update_weights(self, request: Request) -> dict[str, Any]:
        from vllm.distributed.weight_transfer.base import WeightTransferUpdateRequest

        update_info = _field(await _json(request), "update_info", (dict, list))
        await self._weights().engine.update_weights(request=WeightTransferUpdateRequest(update_info=update_info))
        return {"message": "Weights updated"}

    async def finish_weight_update(self, request: Request) -> dict[str, Any]:
        body = await _json(request, empty={})
        raw = body.get("weight_version") if isinstance(body, dict) else None
        version = None if raw is None else int(raw)  # our versions are integers
        weights = self._weights()
        await weights.engine.finish_weight_update(None if version is None else str(version))
        await weights.reset_caches()  # nothing cached may outlive the weights it was computed with
        if version is not None:
            weights.version = version
        log.info("areal: weight update finished%s", "" if version is None else f" as version {version}")
        return {"message": "Weight update finished"}

    async def commit_weights(self, request: Request) -> dict[str, Any]:
        body = from_json(VersionBody, await _json(request))
        _fail_on_purpose(body.version, "commit")
        weights = self._weights()
        digests = await weights.engine.collective_rpc("areal_commit_staged")
        await weights.reset_caches()
        weights.previous = weights.version
        await weights.set_version(body.version)
        log.info("areal: committed the staged update as version %d", body.version)
        digest = None if None in digests else ",".join(digests)  # None: the backend loaded on arrival
        return {"version": body.version, "digest": digest}

    async def rollback_weights(self, request: Request) -> dict[str, Any]:
        weights = self._weights()
        await weights.engine.collective_rpc("areal_rollback")
        await weights.reset_caches()
        await weights.set_version(weights.previous)
        log.info("areal: rolled back to version %d", weights.version)
        return {"version": weights.version}

    async def weights_digest(self, request: Request) -> dict[str, Any]:
        weights = self._weights()
        per_worker = await weights.engine.collective_rpc("areal_weights_digest")
        digest = {f"{rank}:{name}": value for rank, names in enumerate(per_worker) for name, value in names.items()}
        return {"version": weights.version, "digest": digest}

    async def shutdown_weight_transfer_engine(self, request: Request) -> dict[str, Any]:
        await self._end_abandoned_update()
        await self._weights().engine.shutdown_weight_transfer_engine()
        return {"message": "Weight transfer shut down"}

    async def set_version(self, request: Request) -> dict[str, Any]:
        body = from_json(VersionBody, await _json(request))
        await self._weights().set_version(body.version)
        return {"version": body.version}

    async def _end_abandoned_update(self) -> None:
        """A new trainer joins, or the trainer leaves: an update session still open was abandoned."""
        if any(await self._weights().engine.collective_rpc("areal_abandon_update")):
            log.warning("areal: ended a weight update its trainer abandoned (nothing of it is served)")

    def _weights(self) -> _Weights:
        assert self.weights is not None  # checked by _guarded
        return self.weights


async def _json(request: Request, empty: Any = None) -> Any:
    """The request's JSON body; ``empty`` (when given) stands for no body at all."""
    if empty is not None and not await request.body():
        return empty
    try:
        return await request.json()
    except ValueError:
        raise ValueError(f"{request.url.path} expects a JSON body") from None


def _field(body: Any, key: str, kind: type | tuple[type, ...]) -> Any:
    """``body[key]``, checked to be a ``kind`` (vLLM's RL routes embed their argument under ``key``)."""
    value = body.get(key) if isinstance(body, dict) else None
    if not isinstance(value, kind):
        raise ValueError(f'expects a JSON body {{"{key}": ...}} (got {str(body)[:200]})')
    return value


def _fail_on_purpose(version: int, what: str) -> None:
    """The test hook: fail ``version``'s ``what`` when ``AREAL_VLLM_FAIL_COMMIT`` lists it."""
    if str(version) in os.environ.get(FAIL_COMMIT_ENV, "").split(","):
        raise RuntimeError(f"{FAIL_COMMIT_ENV} lists {version}: this {what} fails on purpose (test hook)")


def _check_load_path(path: str) -> Path:
    """The directory to load; under ``AREAL_VLLM_ALLOWED_ROOT`` when set (no '.'-prefixed parts)."""
    root = os.environ.get(ALLOWED_ROOT_ENV)
    if root:
        from areal_core.api.wire import check_load_path

        return check_load_path(path, Path(root))
    target = Path(path).resolve()
    if not target.is_dir():
        raise ValueError(f"refusing to load {path!r}: not a directory")
    return target


def _tolerate_structured_decisions_failure() -> None:
    """Let vLLM start when its optional /v1/systemone probe cannot tokenize (tiny character vocabularies).

    That probe encodes a chat message with letters a small vocabulary lacks; its failure would stop
    the server, although token-id generation never uses it. Idempotent; fails with one line when
    vLLM no longer has the function (see :mod:`areal_engine_vllm.vllm_internals`).
    """
    module = "vllm.entrypoints.generate.structured_decisions.api_router"
    original = internal(module, "init_structured_decisions_state")
    if getattr(original, "_areal_tolerant", False):
        return

    def tolerant(engine_client: Any, state: State, *args: Any, **kwargs: Any) -> None:
        try:
            original(engine_client, state, *args, **kwargs)
        except Exception as exc:  # noqa: BLE001 - the endpoint is optional; say why it is off
            log.warning("areal: /v1/systemone disabled: %s", exc)
            state.serving_structured_decisions = None

    tolerant._areal_tolerant = True  # type: ignore[attr-defined]
    # vLLM imports it by name when it builds the app state, which is after this runs
    importlib.import_module(module).init_structured_decisions_state = tolerant
