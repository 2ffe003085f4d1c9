"""The proxy's HTTP routes (FastAPI); see :mod:`areal_core.agent.proxy` for the route list."""

from __future__ import annotations

import json
import logging
import math
import secrets
import time
from typing import TYPE_CHECKING, Any

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse

from areal_core.agent.openai_api import (
    RequestError,
    chat_response,
    parse_chat,
    parse_text,
    text_response,
)
from areal_core.agent.sessions import Session, UnknownCompletion
from areal_core.errors import ArealError

if TYPE_CHECKING:
    from areal_core.agent.proxy import AgentProxy

logger = logging.getLogger(__name__)
SESSION_HEADER = "X-Areal-Session"
MODEL_ID = "areal-policy"


def _bearer(request: Request) -> str | None:
    scheme, _, token = request.headers.get("authorization", "").partition(" ")
    return token.strip() if scheme.lower() == "bearer" and token.strip() else None


def _session(proxy: AgentProxy, request: Request) -> Session:
    key = request.headers.get(SESSION_HEADER) or _bearer(request)
    session = proxy.sessions.get(key) if key else None
    if session is None:
        raise RequestError(
            401,
            "unknown or missing session key: send the key the trainer gave your agent as the API key "
            f"(Authorization: Bearer <key>) or in the {SESSION_HEADER} header",
        )
    return session


async def _body(request: Request, limit: int) -> Any:
    """The JSON body, refused with 413 as soon as it passes ``limit`` bytes (declared or read)."""
    too_big = RequestError(413, f"request body over the proxy's limit of {limit} bytes (agent.max_body_bytes)")
    declared = request.headers.get("content-length", "")
    if declared.isdigit() and int(declared) > limit:
        raise too_big
    chunks, size = [], 0
    async for chunk in request.stream():
        size += len(chunk)
        if size > limit:
            raise too_big
        chunks.append(chunk)
    try:
        return json.loads(b"".join(chunks))
    except ValueError as exc:
        raise RequestError(400, f"the request body is not valid JSON: {exc}") from None


def build_app(proxy: AgentProxy) -> FastAPI:
    app = FastAPI(title="areal agent proxy", docs_url=None, redoc_url=None, openapi_url=None)
    limit = proxy.max_body_bytes

    @app.exception_handler(RequestError)
    async def refused(request: Request, exc: RequestError) -> JSONResponse:
        return JSONResponse(exc.body(), status_code=exc.status)

    @app.exception_handler(ArealError)
    async def engine_failed(request: Request, exc: ArealError) -> JSONResponse:
        logger.warning("proxy request failed: %s", exc)
        body = {"error": {"message": f"generation failed: {exc}", "type": "server_error", "param": None, "code": None}}
        return JSONResponse(body, status_code=502)

    @app.post("/v1/chat/completions")
    async def chat(request: Request) -> dict[str, Any]:
        session = _session(proxy, request)
        parsed = parse_chat(await _body(request, limit))
        prompt_ids = proxy.render_chat(parsed.messages, parsed.tools, parsed.tool_choice)
        c = await proxy.complete(session, prompt_ids, parsed.sampling, "chatcmpl")
        n_prompt, n_out = len(c.prompt_ids), len(c.output_ids)
        return chat_response(c.id, parsed.model, c.text, c.finish_reason, n_prompt, n_out, bool(parsed.tools))

    @app.post("/v1/completions")
    async def text(request: Request) -> dict[str, Any]:
        session = _session(proxy, request)
        parsed = parse_text(await _body(request, limit))
        prompt_ids = proxy.render_text(parsed.prompt)
        c = await proxy.complete(session, prompt_ids, parsed.sampling, "cmpl")
        return text_response(c.id, parsed.model, c.text, c.finish_reason, len(c.prompt_ids), len(c.output_ids))

    @app.post("/v1/reward")
    async def reward(request: Request) -> dict[str, Any]:
        session = _session(proxy, request)
        body = await _body(request, limit)
        value = body.get("reward") if isinstance(body, dict) else None
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
            raise RequestError(400, f'reward: send {{"reward": <finite number>}}, got {body!r:.100}', "reward")
        completion_id = body.get("completion_id")
        if completion_id is not None and not isinstance(completion_id, str):
            raise RequestError(400, f"completion_id: must be a string, got {completion_id!r}", "completion_id")
        if session.ended:
            raise RequestError(409, "this session has ended; rewards can no longer be set")
        try:
            session.set_reward(float(value), completion_id)
        except UnknownCompletion as exc:
            raise RequestError(404, str(exc), "completion_id") from None
        return {"ok": True}

    @app.get("/v1/session")
    async def summary(request: Request) -> dict[str, Any]:
        return _session(proxy, request).summary()

    @app.post("/v1/session/end")
    async def end(request: Request) -> dict[str, Any]:
        _session(proxy, request).ended = True
        return {"ok": True}

    @app.post("/v1/sessions")
    async def start(request: Request) -> dict[str, Any]:
        if not secrets.compare_digest((_bearer(request) or "").encode(), proxy.admin_key.encode()):
            raise RequestError(401, "starting a session over HTTP needs the proxy's admin key as the bearer token")
        return {"session_key": proxy.sessions.start().key}

    @app.get("/v1/models")
    async def models() -> dict[str, Any]:
        model = {"id": MODEL_ID, "object": "model", "created": int(time.time()), "owned_by": "areal"}
        return {"object": "list", "data": [model]}

    return app
