"""The hf generation server: ``python -m areal_core.builtin.engine_hf.server --model DIR --port N ...``.

An aiohttp app on ``--host`` (127.0.0.1 by default) in front of a :class:`Generator`. ``GET /health`` is open; every
other endpoint needs ``Authorization: Bearer $AREAL_SERVER_TOKEN``. Bodies are the attrs classes
of :mod:`areal_core.api.wire`; errors are ``{"error": "..."}`` with status 400/401/409.
"""

from __future__ import annotations

import argparse
import asyncio
import hmac
import logging
import os
import sys
from pathlib import Path
from typing import Any, AsyncIterator, Awaitable, Callable

import torch
from aiohttp import web

from areal_core.builtin.engine_hf.generator import Generator
from areal_core.api.wire import (
    TOKEN_ENV,
    GenerateBody,
    Health,
    LoadWeightsBody,
    ReceiveWeightsBody,
    VersionBody,
    WeightGroupBody,
    from_json,
    to_json,
)
from areal_core.builtin.engine_hf.receiver import StagedWeights, WeightGroup, check_names_and_shapes, copy_into_model, model_digest, read_safetensors_dir
from areal_core.api.wire import check_load_path

log = logging.getLogger("areal_core.builtin.engine_hf.server")
#: Test hook: a server started with this set to a version fails that version's commit.
FAIL_COMMIT_ENV = "AREAL_HF_FAIL_COMMIT"
Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


def _error(status: int, message: str) -> web.Response:
    return web.json_response({"error": message}, status=status)


def _auth_middleware(token: str):
    expected = f"Bearer {token}".encode()

    @web.middleware
    async def check(request: web.Request, handler: Handler) -> web.StreamResponse:
        if request.path != "/health":
            given = request.headers.get("Authorization", "").encode()
            if not hmac.compare_digest(given, expected):
                return _error(401, f"missing or wrong bearer token (the client must send ${TOKEN_ENV})")
        try:
            return await handler(request)
        except ValueError as exc:  # bad input: tell the caller what to fix
            log.warning("%s refused: %s", request.path, exc)
            return _error(400, str(exc))
        except Exception as exc:  # noqa: BLE001 - report it to the client, keep serving
            log.exception("%s failed", request.path)
            return _error(500, f"{type(exc).__name__}: {exc}")

    return check


async def _json(request: web.Request) -> Any:
    try:
        return await request.json()
    except ValueError:
        raise ValueError(f"{request.path} expects a JSON body") from None


async def _body(request: web.Request, cls: type) -> Any:
    return from_json(cls, await _json(request))


class _Routes:
    """Endpoint handlers over one generator (and, once joined, one weight group)."""

    def __init__(self, generator: Generator, allowed_root: Path, group_timeout_s: float) -> None:
        self.gen = generator
        self.allowed_root = allowed_root
        self.group_timeout_s = group_timeout_s
        self.group: WeightGroup | None = None
        self.staged = StagedWeights()
        self._previous_version = 0  # served before the last commit (for a rollback)

    def add_to(self, app: web.Application) -> None:
        app.router.add_get("/health", self.health)
        app.router.add_post("/generate", self.generate)
        app.router.add_post("/generate_batch", self.generate_batch)
        app.router.add_post("/abort_all", self.abort_all)
        app.router.add_post("/hold_all", self.hold_all)
        app.router.add_post("/continue", self.continue_)
        app.router.add_post("/set_version", self.set_version)
        app.router.add_post("/load_weights", self.load_weights)
        app.router.add_post("/init_weight_group", self.init_weight_group)
        app.router.add_post("/receive_weights", self.receive_weights)
        app.router.add_post("/commit_weights", self.commit_weights)
        app.router.add_post("/rollback_weights", self.rollback_weights)
        app.router.add_post("/weights_digest", self.weights_digest)

    async def health(self, request: web.Request) -> web.Response:
        gen = self.gen
        health = Health(
            status="ok",
            version=gen.version,
            paused=gen.paused,
            running=gen.running,
            queued=gen.queued,
            served=gen.served,
        )
        return web.json_response(to_json(health))

    async def generate(self, request: web.Request) -> web.Response:
        body = await _body(request, GenerateBody)
        return web.json_response(to_json(await self.gen.generate(body)))

    async def generate_batch(self, request: web.Request) -> web.Response:
        """A JSON list of ``/generate`` bodies in one call (e.g. a group's samples); the reply
        lists their results in order."""
        data = await _json(request)
        if not isinstance(data, list) or not data:
            raise ValueError("/generate_batch expects a non-empty JSON list of /generate bodies")
        results = await self.gen.generate_many([from_json(GenerateBody, item) for item in data])
        return web.json_response([to_json(result) for result in results])

    async def abort_all(self, request: web.Request) -> web.Response:
        aborted = await self.gen.pause()
        log.info("paused; aborted %d running requests", aborted)
        return web.json_response({"aborted": aborted})

    async def hold_all(self, request: web.Request) -> web.Response:
        held = await self.gen.pause(keep=True)
        log.info("paused; holding %d running requests", held)
        return web.json_response({"held": held})

    async def continue_(self, request: web.Request) -> web.Response:
        self.gen.resume()
        log.info("resumed")
        return web.json_response({"paused": False})

    async def set_version(self, request: web.Request) -> web.Response:
        body = await _body(request, VersionBody)
        self.gen.version = body.version
        return web.json_response({"version": body.version})

    async def load_weights(self, request: web.Request) -> web.Response:
        body = await _body(request, LoadWeightsBody)
        directory = check_load_path(body.path, self.allowed_root)
        tensors = await asyncio.to_thread(read_safetensors_dir, directory)

        def swap() -> None:
            copy_into_model(self.gen.model, tensors, complete=True)
            self.staged.forget_rollback()
            self.gen.version = body.version

        await self.gen.on_model_thread(swap)
        log.info("loaded %s as version %d", directory, body.version)
        return web.json_response({"version": body.version})

    async def init_weight_group(self, request: web.Request) -> web.Response:
        body = await _body(request, WeightGroupBody)
        self._leave_group()  # a re-created group (e.g. after a server was replaced) replaces the old one
        self.group = await asyncio.to_thread(WeightGroup, body, body.timeout_s or self.group_timeout_s)
        return web.json_response({"rank": self.group.rank})

    async def receive_weights(self, request: web.Request) -> web.Response:
        """Receive and stage an update's buckets; the served weights change only at ``/commit_weights``."""
        body = await _body(request, ReceiveWeightsBody)
        group = self.group
        if group is None:
            return _error(409, "no weight group: call /init_weight_group first")
        try:
            body.buckets()  # the lists agree
            check_names_and_shapes(self.gen.model, dict(zip(body.names, map(tuple, body.shapes))))
            await asyncio.to_thread(group.receive, body, self.staged)
        except BaseException:
            if self.group is group:  # not a newer group, joined while this receive was failing
                self._leave_group()  # so the sender and the other servers fail now, not at the timeout
            raise
        return web.json_response({"staged": len(self.staged.tensors)})

    async def commit_weights(self, request: web.Request) -> web.Response:
        """Phase two: serve every bucket staged for ``version``; replies the staged bytes' digest,
        which the client compares across servers (``/rollback_weights`` undoes this commit)."""
        body = await _body(request, VersionBody)
        if os.environ.get(FAIL_COMMIT_ENV) == str(body.version):
            raise RuntimeError(f"{FAIL_COMMIT_ENV}={body.version}: this commit fails on purpose (test hook)")

        def swap() -> tuple[int, str]:
            count, digest = self.staged.commit(self.gen.model, body.version)
            self._previous_version, self.gen.version = self.gen.version, body.version
            return count, digest

        count, digest = await self.gen.on_model_thread(swap)
        log.info("committed %d staged tensors as version %d", count, body.version)
        return web.json_response({"version": body.version, "digest": digest})

    async def rollback_weights(self, request: web.Request) -> web.Response:
        """Undo the last commit: the weights it replaced serve again, under their version."""

        def swap() -> int:
            count = self.staged.rollback(self.gen.model)
            self.gen.version = self._previous_version
            return count

        count = await self.gen.on_model_thread(swap)
        log.info("rolled back %d tensors to version %d", count, self.gen.version)
        return web.json_response({"version": self.gen.version})

    async def weights_digest(self, request: web.Request) -> web.Response:
        digest = await self.gen.on_model_thread(model_digest, self.gen.model)
        return web.json_response({"version": self.gen.version, "digest": digest})

    def _leave_group(self) -> None:
        self.staged.clear()
        if self.group is not None:
            group, self.group = self.group, None
            group.close()


def load_served_model(path: str, dtype: str, lora: str = "") -> tuple[Any, frozenset[int], int]:
    """The model in eval mode, its end-of-sequence ids and a pad id. ``lora`` (an ``actor.lora``
    section as JSON) adds a fresh peft adapter (zero update): weight updates then carry the
    adapter's tensors alone (:func:`areal_core.builtin.engine_hf.receiver.copy_into_model`)."""
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(path, dtype=getattr(torch, dtype))
    if lora:
        model = _with_adapter(model, lora)
    model.eval()
    eos: set[int] = set()
    for source in (model.config, model.generation_config):
        value = getattr(source, "eos_token_id", None)
        eos.update([value] if isinstance(value, int) else value or [])
    pad = model.generation_config.pad_token_id
    pad = pad if isinstance(pad, int) else min(eos, default=0)
    return model, frozenset(eos), pad


def _with_adapter(model: Any, lora_json: str) -> Any:
    """``model`` with peft's LoRA layers injected in place (generation calls it as before)."""
    import json

    import peft

    from areal_core.api import LoraConfig, from_dict
    from areal_core.api.lora import peft_config

    config = from_dict(json.loads(lora_json), LoraConfig, "--lora")
    return peft.get_peft_model(model, peft_config(config)).get_base_model()


def build_app(args: argparse.Namespace, token: str) -> web.Application:
    torch.set_num_threads(int(os.environ.get("AREAL_NUM_THREADS", "1")))
    model, eos, pad = load_served_model(args.model, args.dtype, args.lora)
    generator = Generator(model, eos_ids=eos, pad_id=pad, max_batch_size=args.max_batch_size, seed=args.seed)
    app = web.Application(middlewares=[_auth_middleware(token)], client_max_size=1 << 26)
    _Routes(generator, Path(args.allowed_root), args.group_timeout).add_to(app)
    run_generator_with(app, generator)
    return app


def run_generator_with(app: web.Application, generator: Generator) -> None:
    """Run ``generator``'s batching loop for as long as ``app`` serves."""

    async def run_generator(app: web.Application) -> AsyncIterator[None]:
        task = asyncio.create_task(generator.serve_forever())
        yield
        task.cancel()

    app.cleanup_ctx.append(run_generator)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", required=True, help="Hugging Face model directory")
    parser.add_argument("--host", default="127.0.0.1", help="address to bind")
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--dtype", choices=["float32", "bfloat16"], default="float32")
    parser.add_argument("--allowed-root", required=True, help="only weights under this directory may be loaded")
    parser.add_argument("--max-batch-size", type=int, default=64)
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--group-timeout", type=float, default=300.0, help="seconds for weight-group collectives")
    parser.add_argument("--lora", default="", help="serve a LoRA adapter: the actor.lora section as JSON")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s", stream=sys.stdout)
    token = os.environ.get(TOKEN_ENV, "")
    if not token:
        parser.error(f"set {TOKEN_ENV} to the bearer token clients will send")
    log.info("loading %s (%s), serving on %s:%d", args.model, args.dtype, args.host, args.port)
    # SIGTERM means the run is stopping: requests still open (held by a pause, or decoding) are not
    # waited for (aiohttp's default grace is 60 s), their clients are gone or re-submit elsewhere
    web.run_app(build_app(args, token), host=args.host, port=args.port, print=None, access_log=None, shutdown_timeout=1.0)


if __name__ == "__main__":
    main()
