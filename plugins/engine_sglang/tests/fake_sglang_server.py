"""FakeSGLangServer: a stand-in for ``python -m sglang.launch_server`` where SGLang cannot run (CPU CI).

A FAKE, named so everywhere. It is a real HTTP server process that answers SGLang 0.5.23's native
routes with their request fields, defaults, reply JSON (``meta_info`` keys included), status codes,
error bodies and ``--api-key`` bearer auth, written from the ``sglang==0.5.23`` wheel's sources:
``sglang/srt/entrypoints/http_server.py`` (routes, replies, error shapes), ``sglang/srt/utils/auth.py``
(auth), ``sglang/srt/entrypoints/v1_loads.py`` + ``sglang/srt/managers/load_snapshot.py`` (``/v1/loads``),
``sglang/srt/managers/io_struct.py`` (``GenerateReqInput``, ``PauseGenerationReqInput``,
``UpdateWeightFromDiskReqInput``, ``InitWeightsUpdateGroupReqInput``, ``UpdateWeightsFromDistributedReqInput``,
``Begin/EndWeightUpdateReqInput``, ``UpdateWeightVersionReqInput``), ``sglang/api/v1/api_types.py`` (the
``/generate`` contract: ``SamplingParams`` keys, ``GenerateMetaInfo``), ``sglang/srt/sampling/sampling_params.py``
(``verify`` messages), ``sglang/srt/managers/scheduler_components/weight_updater.py`` (update sessions,
flush after update), ``sglang/srt/utils/weight_versions.py`` (per-token version spans), and for LoRA
``LoadLoRAAdapterReqInput``/``UnloadLoRAAdapterReqInput``/``LoRAUpdateOutput`` (io_struct.py),
``sglang/srt/managers/tokenizer_control_mixin.py``, ``sglang/srt/lora/lora_registry.py`` and
``sglang/srt/lora/lora_manager.py`` (their checks and messages).

Generation is transformers through ``areal_core.builtin.engine_hf``'s batched :class:`Generator` (real
log-probs, abort); disk reloads use its receiver helpers. The weight group is SGLang's own
handshake and ``flattened_bucket`` split (:mod:`sglang_weight_group`: SGLang's code where
``sglang`` imports, else a FAKE of it), never ours, so a trainer that joins differently fails. Where it
differs from SGLang: one prompt per ``/generate`` (no batches, no streaming, no top-k other than
greedy), ``/pause_generation`` modes ``abort`` and ``in_place`` (not ``retract``), no radix cache
(``/flush_cache`` only checks that nothing runs or waits, held requests included), out-of-vocabulary ``input_ids`` are a 400, and FastAPI's validation texts are
shortened to the offending field. LoRA adapters are peft's (loaded by name, one applied at a time:
a request naming another adapter than the running requests' is a 400; SGLang batches adapters).

Usage: ``python fake_sglang_server.py --model-path DIR --port N [--api-key KEY] [--weight-version V]``;
other ``sglang.launch_server`` flags are accepted and ignored.

Test hook (the fake's own, not SGLang's): with ``AREAL_SGLANG_FAIL_BUCKET=2,3`` the second bucket of
the 2nd and 3rd weight-update sessions (``/begin_weight_update`` calls since start) is received but
not loaded, answered as SGLang answers a load that fails midway ("Failed to update parameter
online ... partially updated"): the buckets before it stay loaded.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import hmac
import json
import logging
import math
import os
import sys
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path
from typing import Any

import torch
from aiohttp import web

from areal_core.builtin.engine_hf.generator import Generator
from areal_core.api.wire import GenerateBody, GenerateResult
from areal_core.builtin.engine_hf.receiver import copy_into_model, read_safetensors_dir
from areal_core.builtin.engine_hf.server import load_served_model, run_generator_with

import sglang_weight_group  # a sibling (this file runs as a script): SGLang's own group handshake, or a FAKE

log = logging.getLogger("fake_sglang_server")
Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]
REQUIRED = object()
#: The test hook (see the module docstring): weight-update session numbers whose second bucket fails.
FAIL_BUCKET_ENV = "AREAL_SGLANG_FAIL_BUCKET"

# Server-side field tables (name -> default; REQUIRED = no default). Unknown keys are ignored, as
# SGLang's pydantic schemas for these msgspec structs do ("extra_behavior=ignore").
PAUSE_FIELDS = {"mode": "abort"}
CONTINUE_FIELDS = {"torch_empty_cache": True}
DISK_FIELDS = {
    "model_path": REQUIRED, "load_format": None, "abort_all_requests": False, "weight_version": None,
    "is_async": False, "torch_empty_cache": False, "keep_pause": False, "recapture_cuda_graph": False,
    "token_step": 0, "flush_cache": True, "manifest": None,
}  # fmt: skip
GROUP_FIELDS = {
    "master_address": REQUIRED, "master_port": REQUIRED, "rank_offset": REQUIRED, "world_size": REQUIRED,
    "group_name": "weight_update_group", "backend": "nccl",
}  # fmt: skip
DESTROY_FIELDS = {"group_name": "weight_update_group"}
LORA_LOAD_FIELDS = {"lora_name": REQUIRED, "lora_path": REQUIRED, "pinned": False, "lora_id": None}
LORA_UNLOAD_FIELDS = {"lora_name": REQUIRED, "lora_id": None}
DISTRIBUTED_FIELDS = {
    "names": REQUIRED, "dtypes": REQUIRED, "shapes": REQUIRED, "group_name": "weight_update_group",
    "flush_cache": True, "abort_all_requests": False, "weight_version": None, "load_format": None,
    "selector": "all", "torch_empty_cache": False,
}  # fmt: skip
SESSION_FIELDS = {"selector": "all"}
WEIGHTS_BY_NAME_FIELDS = {"name": REQUIRED, "truncate_size": 100}
VERSION_FIELDS = {"new_version": REQUIRED, "abort_all_requests": True}
#: ``sglang.api.v1.SamplingParams``: the only object of the ``/generate`` contract that rejects unknown keys.
SAMPLING_KEYS = (
    "max_new_tokens", "stop", "stop_token_ids", "stop_regex", "temperature", "top_p", "top_k", "min_p",
    "frequency_penalty", "presence_penalty", "repetition_penalty", "min_new_tokens", "n", "json_schema",
    "regex", "ebnf", "structural_tag", "ignore_eos", "skip_special_tokens", "spaces_between_special_tokens",
    "no_stop_trim", "stream_interval", "logit_bias", "sampling_seed", "custom_params", "beam_width",
    "watermark", "choice",
)  # fmt: skip
_SAMPLING_EPS = 1e-6  # SGLang: temperature below this is greedy
_TOP_K_ALL = 1 << 30


class BadRequest(Exception):
    """A refused request: ``body`` is the JSON SGLang sends for it, with status 400."""

    def __init__(self, body: Any) -> None:
        super().__init__(str(body))
        self.body = body


def _validation_error(message: str) -> BadRequest:
    """FastAPI's RequestValidationError as SGLang reshapes it (``ErrorResponse``, status 400)."""
    return BadRequest({"object": "error", "message": message, "type": "Bad Request", "param": None, "code": 400})


def _value_error(message: str) -> BadRequest:
    """A ValueError from SGLang's tokenizer manager (``_create_error_response``)."""
    return BadRequest({"error": {"message": message}})


def _contract_error(message: str) -> BadRequest:
    """A ``/generate`` body the ``sglang.api.v1`` contract rejects (serde-style text)."""
    return BadRequest({"error": message})


def _unexpected(value: Any) -> str:
    if isinstance(value, bool):
        return f"boolean `{'true' if value else 'false'}`"
    if isinstance(value, int):
        return f"integer `{value}`"
    if isinstance(value, float):
        return f"floating point `{value}`"
    if isinstance(value, str):
        return f'string "{value}"'
    return {list: "sequence", dict: "map", type(None): "null"}.get(type(value), type(value).__name__)


async def _fields(request: web.Request, table: dict[str, Any]) -> dict[str, Any]:
    """The JSON body read against ``table`` (defaults filled, unknown keys dropped)."""
    raw = await request.read()
    try:
        data = json.loads(raw) if raw else {}
    except ValueError:
        raise _validation_error("[{'type': 'json_invalid', 'loc': ('body',), 'msg': 'JSON decode error'}]") from None
    if not isinstance(data, dict):
        raise _validation_error(
            "[{'type': 'dict_type', 'loc': ('body',), 'msg': 'Input should be a valid dictionary'}]"
        )
    out = {}
    for name, default in table.items():
        if name in data:
            out[name] = data[name]
        elif default is REQUIRED:
            raise _validation_error(f"[{{'type': 'missing', 'loc': ('body', '{name}'), 'msg': 'Field required'}}]")
        else:
            out[name] = default
    return out


def _auth_middleware(api_key: str | None):
    """``decide_request_auth`` with only ``--api-key``: every route but health/ready/metrics needs it."""

    @web.middleware
    async def check(request: web.Request, handler: Handler) -> web.StreamResponse:
        open_path = request.path.startswith(("/health", "/ready", "/metrics")) or request.method == "OPTIONS"
        if api_key and not open_path:
            scheme, _, given = request.headers.get("Authorization", "").partition(" ")
            if scheme.lower() != "bearer" or not hmac.compare_digest(given.encode(), api_key.encode()):
                return web.json_response({"error": "Unauthorized"}, status=401)
        try:
            return await handler(request)
        except BadRequest as exc:
            log.warning("%s refused: %s", request.path, exc.body)
            return web.json_response(exc.body, status=400)

    return check


class FakeSGLangServer:
    """The routes over one :class:`Generator`; versions are SGLang's strings, tokens tagged by index."""

    def __init__(self, generator: Generator, tokenizer: Any, model_path: str, weight_version: str) -> None:
        self.gen = generator
        self.tokenizer = tokenizer
        self.model_path = model_path
        self.versions = [weight_version]  # Generator.version indexes this list
        self.groups: dict[str, Any] = {}  # group name -> torch ProcessGroup
        self.session_open = False
        self.sessions = 0  # weight-update sessions begun (the test hook counts them)
        self.session_buckets = 0  # buckets received in the current one
        self.paused = False
        self.writing = False  # SGLang's model_update_lock writer: new requests wait, running ones finish
        self.inflight = 0
        self._cond = asyncio.Condition()
        self._scheduler = asyncio.Lock()  # SGLang's scheduler process runs weight requests one at a time
        self.lora: _Adapters | None = None  # with --enable-lora

    def add_to(self, app: web.Application) -> None:
        for path in ("/health", "/health_generate", "/ready"):
            app.router.add_get(path, self.health)
        app.router.add_get("/model_info", self.model_info)
        app.router.add_get("/v1/loads", self.loads)
        app.router.add_route("POST", "/generate", self.generate)
        app.router.add_route("PUT", "/generate", self.generate)
        app.router.add_post("/pause_generation", self.pause_generation)
        app.router.add_post("/continue_generation", self.continue_generation)
        app.router.add_route("GET", "/flush_cache", self.flush_cache)
        app.router.add_route("POST", "/flush_cache", self.flush_cache)
        for path, handler in (
            ("/update_weights_from_disk", self.update_weights_from_disk),
            ("/init_weights_update_group", self.init_weights_update_group),
            ("/destroy_weights_update_group", self.destroy_weights_update_group),
            ("/begin_weight_update", self.begin_weight_update),
            ("/end_weight_update", self.end_weight_update),
            ("/update_weights_from_distributed", self.update_weights_from_distributed),
        ):
            app.router.add_post(path, self._on_scheduler(handler))
        app.router.add_post("/update_weight_version", self.update_weight_version)
        app.router.add_route("GET", "/get_weights_by_name", self.get_weights_by_name)
        app.router.add_route("POST", "/get_weights_by_name", self.get_weights_by_name)
        app.router.add_post("/load_lora_adapter", self._on_scheduler(self.load_lora_adapter))
        app.router.add_post("/unload_lora_adapter", self._on_scheduler(self.unload_lora_adapter))

    def _on_scheduler(self, handler: Handler) -> Handler:
        """``handler`` queued behind any weight request the scheduler is running (e.g. one blocked in a broadcast)."""

        async def run(request: web.Request) -> web.StreamResponse:
            async with self._scheduler:
                return await handler(request)

        return run

    @property
    def weight_version(self) -> str:
        return self.versions[self.gen.version]

    # ------------------------------------------------------------------ info
    async def health(self, request: web.Request) -> web.Response:
        return web.Response(status=200)

    async def model_info(self, request: web.Request) -> web.Response:
        info = {
            "model_path": self.model_path, "served_model_name": None, "tokenizer_path": self.model_path,
            "is_generation": True, "weight_version": self.weight_version, "load_format": "auto",
        }  # fmt: skip
        return web.json_response(info)

    async def loads(self, request: web.Request) -> web.Response:
        """``GET /v1/loads`` (``LoadSnapshot``'s core keys; the fake has no memory/queue sections)."""
        load = {
            "timestamp": 0.0, "dp_rank": 0, "num_running_reqs": self.gen.running, "num_waiting_reqs": self.gen.queued,
            "num_used_tokens": 0, "num_total_tokens": 0, "max_running_requests": self.gen.max_batch_size,
        }  # fmt: skip
        return web.json_response({"version": "0.5.23", "accelerator": None, "num_accelerators": 1, "loads": [load]})

    # ------------------------------------------------------------------ generation
    async def generate(self, request: web.Request) -> web.Response:
        try:
            data = json.loads(await request.read())
        except ValueError:
            raise _validation_error(
                "[{'type': 'json_invalid', 'loc': ('body',), 'msg': 'JSON decode error'}]"
            ) from None
        body = self._generate_body(data)
        adapter = data.get("lora_path") if isinstance(data, dict) else None
        async with self._cond:
            await self._cond.wait_for(lambda: not self.paused and not self.writing)  # is_pause_cond, reader lock
            if adapter is not None or self.lora is not None:
                await self._use_adapter(adapter)
            self.inflight += 1
        try:
            if body.max_new_tokens == 0:  # valid in SGLang; the hf generator wants >= 1
                result = GenerateResult(output_ids=[], logprobs=[], versions=[], stop_reason="length")
            else:
                result = await self.gen.generate(body)
        except ValueError as exc:  # the generator's input checks (e.g. token ids outside the vocabulary)
            raise _value_error(str(exc)) from None
        finally:
            async with self._cond:
                self.inflight -= 1
                self._cond.notify_all()
        return web.json_response(self._reply(body, result))

    def _generate_body(self, data: Any) -> GenerateBody:
        """Check ``data`` as SGLang does (contract, then GenerateReqInput, then SamplingParams.verify)."""
        if not isinstance(data, dict):
            raise _contract_error(f"invalid type: {_unexpected(data)}, expected struct GenerateRequest")
        params = data.get("sampling_params") or {}
        if not isinstance(params, dict):
            raise _contract_error(f"invalid type: {_unexpected(params)}, expected struct SamplingParams")
        for key in params:
            if key not in SAMPLING_KEYS:
                listed = ", ".join(f"`{k}`" for k in SAMPLING_KEYS)
                raise _contract_error(f"unknown field `{key}`, expected one of {listed}")
        for key, kind in (
            ("max_new_tokens", "i64"),
            ("top_k", "i64"),
            ("sampling_seed", "i64"),
            ("temperature", "f64"),
            ("top_p", "f64"),
        ):
            value = params.get(key)
            number = isinstance(value, (int, float)) and not isinstance(value, bool)
            if value is not None and not (number and (kind == "f64" or isinstance(value, int))):
                raise _contract_error(f"invalid type: {_unexpected(value)}, expected {kind}")
        params = {key: value for key, value in params.items() if value is not None}  # null: the default
        input_ids = data.get("input_ids")
        if input_ids is None and isinstance(data.get("text"), str):
            input_ids = self.tokenizer.encode(data["text"])
        if input_ids is None:
            raise _value_error("Either text, input_ids or input_embeds should be provided.")
        if not isinstance(input_ids, list) or not all(
            isinstance(t, int) and not isinstance(t, bool) for t in input_ids
        ):
            raise _value_error("FakeSGLangServer serves one prompt per request: input_ids must be a list of token ids")
        temperature = float(params.get("temperature", 1.0))
        top_p = float(params.get("top_p", 1.0))
        top_k = int(params.get("top_k", _TOP_K_ALL))
        max_new_tokens = int(params.get("max_new_tokens", 128))
        if not math.isfinite(temperature) or temperature < 0.0:
            raise _value_error(f"temperature must be a non-negative finite number, got {temperature}.")
        if not 0.0 < top_p <= 1.0:
            raise _value_error(f"top_p must be in (0, 1], got {top_p}.")
        if top_k < 1 and top_k != -1:
            raise _value_error(f"top_k must be -1 (disable) or at least 1, got {top_k}.")
        if max_new_tokens < 0:
            raise _value_error(f"max_new_tokens must be at least 0, got {max_new_tokens}.")
        greedy = temperature < _SAMPLING_EPS or top_k == 1
        if not greedy and top_k not in (-1, _TOP_K_ALL):
            raise _value_error("FakeSGLangServer samples with top_k -1 (all) or 1 (greedy) only")
        context = int(getattr(self.gen.model.config, "max_position_embeddings", 1 << 30))
        if len(input_ids) + max_new_tokens > context:
            raise _value_error(
                "Requested token count exceeds the model's maximum context length "
                f"of {context} tokens. You requested a total of {len(input_ids) + max_new_tokens} tokens: "
                f"{len(input_ids)} tokens from the input messages and {max_new_tokens} tokens for the completion. "
                "Please reduce the number of tokens in the input messages or the completion to fit within the limit."
            )
        return GenerateBody(
            rid=str(data.get("rid") or os.urandom(16).hex()),
            input_ids=input_ids,
            max_new_tokens=max_new_tokens,
            temperature=1.0 if greedy else temperature,
            top_p=top_p,
            greedy=greedy,
            stop_token_ids=[int(t) for t in params.get("stop_token_ids") or []],
            seed=params.get("sampling_seed"),
        )

    def _reply(self, body: GenerateBody, result: GenerateResult) -> dict[str, Any]:
        """``GenerateResponse`` with ``meta_info`` as SGLang's tokenizer manager builds it."""
        n = len(result.output_ids)
        if result.stop_reason == "stop":
            finish: dict[str, Any] = {"type": "stop", "matched": result.output_ids[-1]}
        elif result.stop_reason == "length":
            finish = {"type": "length", "length": n}
        elif n:  # aborted while running
            finish = {"type": "abort", "message": "Aborted", "status_code": None, "err_type": None}
        else:  # aborted in the waiting queue
            finish = {"type": "abort", "message": "Abort in waiting queue"}
        spans = self._spans(result.versions) if n else [{"version": self.weight_version, "start": 0, "end": 0}]
        meta = {
            "id": body.rid,
            "finish_reason": finish,
            "prompt_tokens": len(body.input_ids),
            "weight_version": spans[-1]["version"],
            "num_retractions": 0,
            "input_token_logprobs": [],  # logprob_start_len defaults to the prompt's end
            "output_token_logprobs": [[lp, t, None] for lp, t in zip(result.logprobs, result.output_ids)],
            "output_token_logprobs_length": n,
            "reasoning_tokens": 0,
            "completion_tokens": n,
            "cached_tokens": 0,
            "weight_versions": spans,
        }
        text = self.tokenizer.decode(result.output_ids) if self.tokenizer is not None else ""
        return {"text": text, "output_ids": list(result.output_ids), "meta_info": meta}

    def _spans(self, indices: list[int]) -> list[dict[str, Any]]:
        spans: list[dict[str, Any]] = []
        for pos, index in enumerate(indices):
            name = self.versions[index]
            if spans and spans[-1]["version"] == name:
                spans[-1]["end"] = pos + 1
            else:
                spans.append({"version": name, "start": pos, "end": pos + 1})
        return spans

    # ------------------------------------------------------------------ pause / continue
    async def pause_generation(self, request: web.Request) -> web.Response:
        fields = await _fields(request, PAUSE_FIELDS)
        if fields["mode"] not in ("abort", "retract", "in_place"):
            raise _validation_error(
                "[{'type': 'literal_error', 'loc': ('body', 'mode'), 'msg': \"Input should be 'abort', 'retract' or 'in_place'\"}]"
            )
        if fields["mode"] == "retract":
            raise _value_error("FakeSGLangServer implements pause modes 'abort' and 'in_place' only")
        async with self._cond:
            self.paused = True
        if fields["mode"] == "abort":
            await self._abort_all()
        else:  # in_place: the running batch stays, KV cache and all, and decodes on after continue
            await self.gen.pause(keep=True)
        log.info("paused (%s)", fields["mode"])
        return web.json_response({"message": "Generation paused successfully.", "status": "ok"})

    async def continue_generation(self, request: web.Request) -> web.Response:
        await _fields(request, CONTINUE_FIELDS)
        async with self._cond:
            self.paused = False
            self._cond.notify_all()
        self.gen.resume()  # held by an in_place pause (a no-op after an abort)
        log.info("continued")
        return web.json_response({"message": "Generation continued successfully.", "status": "ok"})

    async def _abort_all(self) -> None:
        """``abort_request(abort_all=True)``: running requests end with their partial output, queued ones empty."""
        await self.gen.pause()
        self.gen.abort_queued()
        self.gen.resume()

    async def flush_cache(self, request: web.Request) -> web.Response:
        if self.gen.running or self.gen.queued:
            return web.Response(text="Flush cache failed.\n", status=400)
        return web.Response(
            text="Cache flushed.\nPlease check backend logs for more details. "
            "(When there are running or waiting requests, the operation will not be performed.)\n"
        )

    async def _use_adapter(self, name: str | None) -> None:
        """Apply adapter ``name`` (None: the base model) for a request about to run (under ``_cond``)."""
        lora = self.lora
        if lora is None:
            raise _value_error("LoRA is not enabled. Please set `--enable-lora` to enable LoRA.")
        if name is not None and name not in lora.paths:
            raise _value_error(
                f"The following requested LoRA adapters are not loaded: {name}\nLoaded adapters: {lora.paths.keys()}."
            )
        if name != lora.applied:
            if self.inflight:
                raise _value_error(f"FakeSGLangServer applies one LoRA adapter at a time; {lora.applied!r} is running")
            await self.gen.on_model_thread(lora.apply, name)

    # ------------------------------------------------------------------ LoRA
    async def load_lora_adapter(self, request: web.Request) -> web.Response:
        fields = await _fields(request, LORA_LOAD_FIELDS)
        name, path = str(fields["lora_name"]), str(fields["lora_path"])
        try:
            lora = self._lora_enabled()
            if name in lora.paths:
                raise ValueError(f"LoRA with name {name} already exists. Loaded LoRAs: {lora.paths.keys()}")
            await self.gen.on_model_thread(lora.load, name, path)
        except ValueError as exc:
            return self._lora_reply(False, str(exc))
        log.info("loaded LoRA adapter %s from %s", name, path)
        return self._lora_reply(True, None)

    async def unload_lora_adapter(self, request: web.Request) -> web.Response:
        fields = await _fields(request, LORA_UNLOAD_FIELDS)
        name = str(fields["lora_name"])
        try:
            lora = self._lora_enabled()
            if name not in lora.paths:
                raise ValueError(f"LoRA with name {name} does not exist. Loaded LoRAs: {lora.paths.keys()}")
            async with self._cond:  # SGLang unloads once the requests using it finished
                await self._cond.wait_for(lambda: lora.applied != name or self.inflight == 0)
                await self.gen.on_model_thread(lora.unload, name)
        except ValueError as exc:
            return self._lora_reply(False, str(exc))
        return self._lora_reply(True, None)

    def _lora_enabled(self) -> _Adapters:
        if self.lora is None:
            raise ValueError("LoRA is not enabled. Please set `--enable-lora` to enable LoRA.")
        return self.lora

    def _lora_reply(self, success: bool, error: str | None) -> web.Response:
        """``LoRAUpdateOutput``, 200 on success, else 400."""
        loaded = dict(self.lora.paths) if self.lora is not None else None
        body = {"success": success, "error_message": error, "loaded_adapters": loaded}
        return web.json_response(body, status=200 if success else 400)

    # ------------------------------------------------------------------ weights
    @contextlib.asynccontextmanager
    async def _model_update(self) -> AsyncIterator[None]:
        """Paused: update at once. Otherwise hold new requests and wait for running ones (SGLang's writer lock)."""
        async with self._cond:
            if self.paused:
                exclusive = False
            else:
                await self._cond.wait_for(lambda: not self.writing)
                self.writing = exclusive = True
                await self._cond.wait_for(lambda: self.inflight == 0)
        try:
            yield
        finally:
            if exclusive:
                async with self._cond:
                    self.writing = False
                    self._cond.notify_all()

    async def _record_version(self, version: str | None) -> None:
        """``record_weight_version_change``: tokens from now on carry ``version``."""
        if version is None or version == self.weight_version:
            return

        def switch() -> None:
            log.info("Weight version changed. old_version=%r new_version=%r", self.weight_version, version)
            self.versions.append(str(version))
            self.gen.version = len(self.versions) - 1

        await self.gen.on_model_thread(switch)

    def _after_update(self, fields: dict[str, Any], success: bool, message: str) -> tuple[bool, str]:
        """``flush_cache_after_weight_update``: a flush refused because requests run fails the call."""
        if success and fields["flush_cache"] and (self.gen.running or self.gen.queued):
            return False, (
                "Weights were updated, but the cache was not flushed because requests are still running or "
                "queued. Retract or finish them, then call /flush_cache."
            )
        return success, message

    async def update_weights_from_disk(self, request: web.Request) -> web.Response:
        fields = await _fields(request, DISK_FIELDS)
        if fields["abort_all_requests"]:
            await self._abort_all()
        async with self._model_update():
            success, message = await self._load_from_disk(str(fields["model_path"]))
            if success:
                self.model_path = str(fields["model_path"])
                await self._record_version(fields["weight_version"])
                success, message = self._after_update(fields, success, message)
        if success and fields["weight_version"] is not None:
            message += f" Weight version updated to {fields['weight_version']}."
        body = {"success": success, "message": message, "num_paused_requests": 0}
        return web.json_response(body, status=200 if success else 400)

    async def _load_from_disk(self, path: str) -> tuple[bool, str]:
        try:
            tensors = await asyncio.to_thread(read_safetensors_dir, Path(path))
        except Exception as exc:  # noqa: BLE001 - reported to the client, as SGLang does
            return False, f"Failed to get weights iterator: {exc}."
        try:
            await self.gen.on_model_thread(lambda: copy_into_model(self.gen.model, tensors, complete=True))
        except Exception as exc:  # noqa: BLE001 - copy_into_model checks before it copies: nothing changed
            return False, f"Failed to update weights: {exc}.\nRolling back to original weights."
        log.info("loaded weights from %s", path)
        return True, "Succeeded to update model weights."

    async def init_weights_update_group(self, request: web.Request) -> web.Response:
        f = await _fields(request, GROUP_FIELDS)
        try:  # SGLang's join, as its model runner calls it (sglang_weight_group says whose code runs)
            group = await asyncio.to_thread(
                sglang_weight_group.join, str(f["master_address"]), int(f["master_port"]), int(f["rank_offset"]),
                int(f["world_size"]), str(f["group_name"]), str(f["backend"]),
            )  # fmt: skip
        except Exception as exc:  # noqa: BLE001 - SGLang answers failures as success=false
            message = f"Failed to initialize custom process group: {exc}."
            return web.json_response({"success": False, "message": message}, status=400)
        self.groups[str(f["group_name"])] = group
        return web.json_response({"success": True, "message": "Succeeded to initialize custom process group."})

    async def destroy_weights_update_group(self, request: web.Request) -> web.Response:
        f = await _fields(request, DESTROY_FIELDS)
        group = self.groups.pop(str(f["group_name"]), None)
        if group is None:
            return web.json_response(
                {"success": False, "message": "The group to be destroyed does not exist."}, status=400
            )
        try:
            await asyncio.to_thread(torch.distributed.destroy_process_group, group)
        except Exception as exc:  # noqa: BLE001
            message = f"Failed to destroy custom process group: {exc}."
            return web.json_response({"success": False, "message": message}, status=400)
        return web.json_response({"success": True, "message": "Succeeded to destroy custom process group."})

    async def begin_weight_update(self, request: web.Request) -> web.Response:
        await _fields(request, SESSION_FIELDS)
        if self.session_open:
            message = "a weight-update session is already open; call end_weight_update() first"
            return web.json_response({"success": False, "message": message}, status=400)
        self.session_open = True
        self.sessions, self.session_buckets = self.sessions + 1, 0
        return web.json_response({"success": True, "message": "Success"})

    async def end_weight_update(self, request: web.Request) -> web.Response:
        await _fields(request, {})
        if not self.session_open:
            message = "no weight-update session is open; call begin_weight_update() first"
            return web.json_response({"success": False, "message": message}, status=400)
        self.session_open = False
        return web.json_response({"success": True, "message": "Success"})

    async def update_weights_from_distributed(self, request: web.Request) -> web.Response:
        f = await _fields(request, DISTRIBUTED_FIELDS)
        if not self.session_open:
            message = "update_weights_from_distributed must run between begin_weight_update() and end_weight_update()"
            return web.json_response({"success": False, "message": message}, status=400)
        if f["abort_all_requests"]:
            await self._abort_all()
        async with self._model_update():
            success, message = await self._receive_and_load(f)
            if success:
                await self._record_version(f["weight_version"])
                success, message = self._after_update(f, success, message)
        if success and f["weight_version"] is not None:
            message += f" Weight version updated to {f['weight_version']}."
        return web.json_response({"success": success, "message": message}, status=200 if success else 400)

    async def _receive_and_load(self, f: dict[str, Any]) -> tuple[bool, str]:
        names, dtypes, shapes = list(f["names"]), [str(d) for d in f["dtypes"]], [list(s) for s in f["shapes"]]
        try:
            group = self.groups.get(str(f["group_name"]))
            if group is None:
                raise AssertionError(
                    f"Group {f['group_name']} not in {list(self.groups)}. Please call `init_weights_update_group` first."
                )
            tensors = await asyncio.to_thread(_receive, group, f["load_format"], names, dtypes, shapes)
        except Exception as exc:  # noqa: BLE001 - as SGLang: the call fails, the server keeps serving
            return False, f"Failed to receive weights: {exc}"
        self.session_buckets += 1
        try:
            if self.session_buckets == 2 and str(self.sessions) in os.environ.get(FAIL_BUCKET_ENV, "").split(","):
                raise RuntimeError(f"{FAIL_BUCKET_ENV}: bucket 2 of session {self.sessions} fails on purpose (test hook)")
            await self.gen.on_model_thread(lambda: copy_into_model(self.gen.model, dict(tensors), complete=False))
        except Exception as exc:  # noqa: BLE001
            return False, (
                f"Failed to update parameter online: {exc}. The full weights of the ModelRunner are partially "
                "updated. Please discard the whole weights."
            )
        log.info("loaded %d tensors from group %r", len(tensors), f["group_name"])
        return True, "Succeeded to update parameter online."

    async def get_weights_by_name(self, request: web.Request) -> web.Response:
        """The parameter ``name`` as float32 values (2-D: rows), its first ``truncate_size`` entries;
        a tied ``lm_head.weight`` is the embedding's. SGLang maps fused parameters (``qkv_proj``);
        the fake serves the transformers model's own names."""
        f = await _fields(request, WEIGHTS_BY_NAME_FIELDS)

        def read() -> Any:
            params = dict(self.gen.model.named_parameters())
            name = str(f["name"])
            if name == "lm_head.weight" and name not in params:
                name = "model.embed_tokens.weight"
            return params[name].detach().cpu().to(torch.float32).numpy().tolist()[: int(f["truncate_size"])]

        try:
            return web.json_response(await self.gen.on_model_thread(read))
        except KeyError:  # SGLang logs the error and answers with the route's generic message
            raise _value_error("Get parameter by name failed") from None

    async def update_weight_version(self, request: web.Request) -> web.Response:
        f = await _fields(request, VERSION_FIELDS)
        if f["abort_all_requests"]:
            await self._abort_all()
        version = str(f["new_version"])
        await self._record_version(version)
        return web.json_response(
            {"success": True, "message": f"Weight version updated to {version}", "new_version": version}
        )


def _receive(
    group: Any, load_format: str | None, names: list[str], dtypes: list[str], shapes: list[list[int]]
) -> list[tuple[str, torch.Tensor]]:
    """``receive_weights_from_distributed``: one flat uint8 broadcast (``flattened_bucket``) or one
    broadcast per tensor (SGLang's default format)."""
    if load_format == "flattened_bucket":
        return sglang_weight_group.receive_flattened_bucket(group, names, dtypes, shapes)
    if load_format is not None:
        raise NotImplementedError(f"Unknown load_format={load_format}")
    weights, handles = [], []
    for name, dtype, shape in zip(names, dtypes, shapes):
        weight = torch.empty(shape, dtype=getattr(torch, dtype))
        handles.append(torch.distributed.broadcast(weight, src=0, group=group, async_op=True))
        weights.append((name, weight))
    for handle in handles:
        handle.wait()
    return weights


class _Adapters:
    """peft adapters on the served model, by name; one applied at a time. Methods run on the model thread."""

    def __init__(self, model: Any, max_rank: int, target_modules: list[str]) -> None:
        self.model = model
        self.max_rank = max_rank
        self.target_modules = set(target_modules)
        self.peft: Any = None  # the PeftModel around ``model`` once an adapter is loaded
        self.paths: dict[str, str] = {}
        self.applied: str | None = None

    def load(self, name: str, path: str) -> None:
        from peft import PeftConfig, PeftModel

        try:
            config = PeftConfig.from_pretrained(path)
        except Exception as exc:  # noqa: BLE001 - SGLang reports a failed load as a ValueError message
            raise ValueError(f"Failed to load LoRA adapter {name} from {path}: {exc}") from None
        targets = set(config.target_modules or ())
        if config.r > self.max_rank or not (targets <= self.target_modules or "all" in self.target_modules):
            raise ValueError(
                f"LoRA adapter {name} with rank {config.r} is incompatible with the current LoRA memory pool "
                "configuration. Please ensure that the LoRA adapter's rank is within the configured "
                "`--max-lora-rank` and that the target modules are included in `--lora-target-modules`."
            )
        if self.peft is None:
            self.peft = PeftModel.from_pretrained(self.model, path, adapter_name=name)
        else:
            self.peft.load_adapter(path, adapter_name=name)
        self.paths[name] = path
        self.apply(self.applied)

    def unload(self, name: str) -> None:
        if self.applied == name:
            self.apply(None)
        self.peft.delete_adapter(name)
        del self.paths[name]

    def apply(self, name: str | None) -> None:
        if self.peft is None:
            return
        if name is None:
            self.peft.base_model.disable_adapter_layers()
        else:
            self.peft.base_model.enable_adapter_layers()
            self.peft.base_model.set_adapter(name)
        self.applied = name


def build_app(args: argparse.Namespace) -> web.Application:
    torch.set_num_threads(int(os.environ.get("OMP_NUM_THREADS", "1")))
    dtype = args.dtype if args.dtype in ("float32", "bfloat16") else "float32"
    model, eos, pad = load_served_model(args.model_path, dtype)
    try:
        from transformers import AutoTokenizer

        tokenizer = AutoTokenizer.from_pretrained(args.model_path)
    except (OSError, ValueError):
        tokenizer = None
    generator = Generator(model, eos_ids=eos, pad_id=pad, max_batch_size=64, seed=args.random_seed or 0)
    server = FakeSGLangServer(generator, tokenizer, args.model_path, args.weight_version)
    if args.enable_lora:
        if args.max_lora_rank is None or not args.lora_target_modules:
            raise SystemExit(
                "When no initial --lora-paths is provided, you need to specify both --max-lora-rank and "
                "--lora-target-modules for LoRA initialization."
            )
        server.lora = _Adapters(model, args.max_lora_rank, args.lora_target_modules)
    app = web.Application(middlewares=[_auth_middleware(args.api_key)], client_max_size=1 << 26)
    server.add_to(app)
    run_generator_with(app, generator)
    return app


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model-path", "--model", dest="model_path", required=True)
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=30000)
    parser.add_argument("--api-key", default=None)
    parser.add_argument("--weight-version", default="default")
    parser.add_argument("--dtype", default="auto")
    parser.add_argument("--random-seed", type=int, default=None)
    parser.add_argument("--enable-lora", action="store_true")
    parser.add_argument("--max-lora-rank", type=int, default=None)
    parser.add_argument("--lora-target-modules", nargs="*", default=None)
    args, ignored = parser.parse_known_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s", stream=sys.stdout)
    log.info(
        "FakeSGLangServer (not SGLang) loading %s on %s:%d; ignoring %s", args.model_path, args.host, args.port, ignored
    )
    log.info("weight group: %s", sglang_weight_group.SOURCE)
    web.run_app(build_app(args), host=args.host, port=args.port, print=None, access_log=None)


if __name__ == "__main__":
    main()
