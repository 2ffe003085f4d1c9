"""The proxy's HTTP routes (FastAPI); see :mod:`areal_core.agent.proxy` for the route list."""

from __future__ import annotations

import json
import logging
import math
import secrets
import time
from typing import TYPE_CHECKING, Any

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, Response

from areal_core.agent import anthropic_api, responses_api
from areal_core.agent.openai_api import (
    ChatRequest,
    RequestError,
    parse_chat,
    parse_text,
)
from areal_core.agent.openai_out import (
    chat_chunks,
    chat_response,
    text_chunks,
    text_response,
)
from areal_core.agent.sessions import Session, UnknownCompletion
from areal_core.agent.sse import stream
from areal_core.api.errors import ArealError

if TYPE_CHECKING:
    from areal_core.agent.proxy import AgentProxy, Reply

logger = logging.getLogger(__name__)
SESSION_HEADER = "X-Areal-Session"
MODEL_ID = "areal-policy"


def _bearer(request: Request) -> str | None:
    scheme, _, token = request.headers.get("authorization", "").partition(" ")
    return token.strip() if scheme.lower() == "bearer" and token.strip() else None


def _session(proxy: AgentProxy, request: Request) -> Session:
    key = request.headers.get(SESSION_HEADER) or request.headers.get("x-api-key") or _bearer(request)
    session = proxy.sessions.get(key) if key else None
    if session is None:
        raise RequestError(
            401,
            "unknown or missing session key: send the key the trainer gave your agent as the API key "
            f"(Authorization: Bearer <key> or x-api-key: <key>) or in the {SESSION_HEADER} header",
        )
    return session


def _history(session: Session, response_id: str) -> list[dict[str, Any]]:
    conversation = session.conversations.get(response_id)
    if conversation is None:
        raise RequestError(404, f"previous_response_id: {response_id!r} is not a response of this session", "previous_response_id")
    return list(conversation)


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
        body = anthropic_api.error_body(exc) if request.url.path == "/v1/messages" else exc.body()
        return JSONResponse(body, status_code=exc.status)

    @app.exception_handler(ArealError)
    async def engine_failed(request: Request, exc: ArealError) -> JSONResponse:
        logger.warning("proxy request failed: %s", exc)
        body = {"error": {"message": f"generation failed: {exc}", "type": "server_error", "param": None, "code": None}}
        return JSONResponse(body, status_code=502)

    async def replies(session: Session, chat: ChatRequest, kind: str) -> list[Reply]:
        """Render the chat once, sample ``chat.n`` completions, record them, parse their tool calls."""
        prompt_ids = proxy.render_chat(chat.messages, chat.tools, chat.tool_choice)
        completions = await proxy.complete(session, prompt_ids, chat.sampling, kind, chat.n)
        return [proxy.reply(c, bool(chat.tools)) for c in completions]

    @app.post("/v1/chat/completions", response_model=None)
    async def chat(request: Request) -> dict[str, Any] | Response:
        session = _session(proxy, request)
        parsed = parse_chat(await _body(request, limit))
        out = await replies(session, parsed, "chatcmpl")
        if parsed.stream:
            return stream(chat_chunks(parsed.model, out, parsed.include_usage))
        return chat_response(parsed.model, out)

    @app.post("/v1/completions", response_model=None)
    async def text(request: Request) -> dict[str, Any] | Response:
        session = _session(proxy, request)
        parsed = parse_text(await _body(request, limit))
        completions = await proxy.complete(session, proxy.render_text(parsed.prompt), parsed.sampling, "cmpl", parsed.n)
        out = [proxy.reply(c, parse_tools=False) for c in completions]
        if parsed.stream:
            return stream(text_chunks(parsed.model, out, parsed.include_usage))
        return text_response(parsed.model, out)

    @app.post("/v1/responses", response_model=None)
    async def responses(request: Request) -> dict[str, Any] | Response:
        session = _session(proxy, request)
        body = await _body(request, limit)
        parsed, conversation = responses_api.parse_responses(body, lambda rid: _history(session, rid))
        (reply,) = await replies(session, parsed, "resp")
        session.conversations[reply.completion.id] = [*conversation, responses_api.assistant_message(reply)]
        if parsed.stream:
            return stream(responses_api.response_events(body, reply))
        return responses_api.response_object(body, reply)

    @app.post("/v1/messages", response_model=None)
    async def messages(request: Request) -> dict[str, Any] | Response:
        session = _session(proxy, request)
        parsed = anthropic_api.parse_messages(await _body(request, limit))
        (reply,) = await replies(session, parsed, "msg")
        if parsed.stream:
            return stream(anthropic_api.message_events(parsed.model, reply))
        return anthropic_api.message_object(parsed.model, reply)

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
