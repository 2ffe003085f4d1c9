"""Continuous batching for the hf server: concurrent requests share one KV cache.

A scheduler coroutine takes up to ``max_batch_size`` queued requests, left-pads them into one
batch (attention mask + position ids + a transformers ``DynamicCache``) and decodes them step by
step; finished rows leave the batch, and columns that only pad are dropped. Once a quarter of the
batch is free (or every queued request fits), the queued requests are prefilled on their own and
join the running batch: both caches are left-padded to the longer one, so no running row is
prefilled again. A cache that padding cannot join exactly (a sliding-window or static one) falls
back to waves: once the wave is down to half of ``max_batch_size`` or fewer and at least as many
requests wait as still run, its unfinished requests go back to the head of the queue, to be
prefilled again (prompt + output so far) together with the new ones.
Model work runs on one executor thread, so weight swaps queued on it land between decode steps.
``pause`` stops the running batch at the next step (its requests end with stop reason "abort")
and holds the queue; ``pause(keep=True)`` holds the batch there instead, KV cache and all, and it
decodes on (on whatever weights are loaded by then) after ``resume``.
"""

from __future__ import annotations

import asyncio
import collections
import inspect
import logging
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any, TypeVar

import attrs
import torch

from areal_core.api.wire import GenerateBody, GenerateResult

log = logging.getLogger(__name__)
T = TypeVar("T")


@attrs.define
class _Seq:
    body: GenerateBody
    future: asyncio.Future
    stop_ids: frozenset[int]
    output_ids: list[int] = attrs.Factory(list)
    logprobs: list[float] = attrs.Factory(list)
    versions: list[int] = attrs.Factory(list)

    def context(self) -> list[int]:
        return self.body.input_ids + self.output_ids

    def finish(self, stop_reason: str) -> None:
        if not self.future.done():
            result = GenerateResult(
                output_ids=self.output_ids, logprobs=self.logprobs, versions=self.versions, stop_reason=stop_reason
            )
            self.future.set_result(result)


def sample(
    logits: torch.Tensor, temperature: torch.Tensor, top_p: torch.Tensor, greedy: torch.Tensor, uniforms: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """Per-row sampling by inverse CDF with one uniform draw per row; returns tokens and their
    log-probs under log_softmax(logits / temperature).

    The log-prob is of the full temperature-scaled distribution (what the trainer recomputes),
    not of the top-p-truncated one. Each row's token depends on its own logits, parameters and
    uniform alone: greedy rows take the argmax (nothing else is computed for them), rows with
    ``top_p < 1`` draw over the probabilities sorted in descending order (the nucleus needs the
    order), rows with ``top_p >= 1`` over the probabilities in vocabulary order (the same
    distribution, without an O(V log V) sort per row and step).
    """
    scaled = logits.float()
    logp = torch.log_softmax(scaled / temperature[:, None], dim=-1)
    tokens = scaled.argmax(-1)  # bf16 -> fp32 is exact, so the same argmax, found faster
    drawn = (~greedy).nonzero().squeeze(-1)
    if len(drawn):
        nucleus = top_p[drawn] < 1
        for rows, draw in ((drawn[nucleus], _draw_in_nucleus), (drawn[~nucleus], _draw_in_full)):
            if len(rows):
                tokens[rows] = draw(logp[rows].exp(), top_p[rows], uniforms[rows])
    return tokens, logp.gather(-1, tokens[:, None]).squeeze(-1)


def _draw_in_nucleus(probs: torch.Tensor, top_p: torch.Tensor, uniforms: torch.Tensor) -> torch.Tensor:
    """Inverse CDF over the smallest most-likely set of mass >= ``top_p`` (probabilities sorted)."""
    sorted_p, order = probs.sort(dim=-1, descending=True)
    outside = (sorted_p.cumsum(-1) - sorted_p) >= top_p[:, None]  # mass before it already >= top_p
    cdf = sorted_p.masked_fill(outside, 0.0).cumsum(-1)
    return order.gather(-1, _inverse_cdf(cdf, uniforms)).squeeze(-1)


def _draw_in_full(probs: torch.Tensor, top_p: torch.Tensor, uniforms: torch.Tensor) -> torch.Tensor:
    """Inverse CDF over the whole vocabulary, in vocabulary order."""
    return _inverse_cdf(probs.cumsum(-1), uniforms).squeeze(-1)


def _inverse_cdf(cdf: torch.Tensor, uniforms: torch.Tensor) -> torch.Tensor:
    """Per row, the first index whose ``cdf`` exceeds ``uniform * total`` (one column)."""
    target = (uniforms * cdf[:, -1])[:, None].contiguous()
    return torch.searchsorted(cdf, target, right=True).clamp(max=cdf.shape[-1] - 1)


_GOLDEN = 0x9E3779B97F4A7C15  # spreads (seed, position) pairs over the generator's seed space


def row_uniforms(seqs: list[_Seq], gen: torch.Generator) -> torch.Tensor:
    """One uniform per row: a request with a seed draws from (seed, token position) alone, so its
    samples do not depend on batching, interruptions or other requests; others use ``gen``.
    Greedy rows draw nothing from a seed (their uniform is never used)."""
    draws = torch.rand(len(seqs), generator=gen)
    row_gen: torch.Generator | None = None  # one generator, re-seeded per row
    for row, seq in enumerate(seqs):
        if seq.body.seed is not None and not seq.body.greedy:
            position = len(seq.body.input_ids) + len(seq.output_ids)
            row_gen = row_gen or torch.Generator()
            row_gen.manual_seed((seq.body.seed + position * _GOLDEN) % 2**63)
            draws[row] = torch.rand(1, generator=row_gen)[0]
    return draws


def cache_kwarg(model: Any) -> str:
    """transformers 5 renamed ``past_key_values`` to ``cache``."""
    return "cache" if "cache" in inspect.signature(model.forward).parameters else "past_key_values"


class _Batch:
    """One left-padded batch and its KV cache; every method runs on the model thread."""

    def __init__(self, model: Any, seqs: list[_Seq], pad_id: int, gen: torch.Generator) -> None:
        from transformers import DynamicCache

        self.model = model
        self.gen = gen
        self.seqs = list(seqs)
        self.temperature = torch.tensor([seq.body.temperature for seq in seqs], dtype=torch.float32)
        self.top_p = torch.tensor([seq.body.top_p for seq in seqs], dtype=torch.float32)
        self.greedy = torch.tensor([seq.body.greedy for seq in seqs], dtype=torch.bool)
        contexts = [seq.context() for seq in seqs]
        width = max(map(len, contexts))
        self.input_ids = torch.full((len(seqs), width), pad_id, dtype=torch.long)
        self.mask = torch.zeros((len(seqs), width), dtype=torch.long)
        for row, ids in enumerate(contexts):
            self.input_ids[row, width - len(ids) :] = torch.tensor(ids)
            self.mask[row, width - len(ids) :] = 1
        self.positions = (self.mask.cumsum(-1) - 1).clamp(min=0)
        self.cache = DynamicCache(config=model.config)
        self.cache_kwarg = cache_kwarg(model)  # once per batch, not per forward
        self.can_join = False  # whether other batches' rows can join it (:meth:`join`), known after the prefill

    @torch.inference_mode()
    def prefill(self) -> tuple[torch.Tensor, torch.Tensor]:
        out = self._forward(self.input_ids, self.positions)
        self.can_join = _plain_growing(self.cache)
        return out

    @torch.inference_mode()
    def step(self, tokens: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        self.mask = torch.cat([self.mask, torch.ones_like(self.mask[:, :1])], dim=1)
        self.positions = self.positions[:, -1:] + 1
        return self._forward(tokens[:, None], self.positions)

    def keep(self, rows: list[int]) -> None:
        index = torch.tensor(rows, dtype=torch.long)
        self.cache.batch_select_indices(index)
        for name in ("temperature", "top_p", "greedy", "mask", "positions"):
            setattr(self, name, getattr(self, name)[index])
        self.seqs = [self.seqs[row] for row in rows]
        if self.can_join and rows:  # drop the columns that are padding in every row left
            start = int(self.mask.any(0).long().argmax())
            if start:
                self.mask = self.mask[:, start:]
                for layer in self.cache.layers:
                    layer.keys, layer.values = layer.keys[:, :, start:], layer.values[:, :, start:]

    def join(self, other: _Batch) -> None:
        """Append the rows of ``other`` (prefilled, same model; both ``can_join``): caches and masks
        are left-padded to the longer one, so every row keeps its own positions."""
        width = max(self.mask.shape[1], other.mask.shape[1])
        for mine, theirs in zip(self.cache.layers, other.cache.layers, strict=True):
            mine.keys = torch.cat([_left_pad(mine.keys, width, 2), _left_pad(theirs.keys, width, 2)])
            mine.values = torch.cat([_left_pad(mine.values, width, 2), _left_pad(theirs.values, width, 2)])
        self.mask = torch.cat([_left_pad(self.mask, width, 1), _left_pad(other.mask, width, 1)])
        self.positions = torch.cat([self.positions[:, -1:], other.positions[:, -1:]])
        for name in ("temperature", "top_p", "greedy"):
            setattr(self, name, torch.cat([getattr(self, name), getattr(other, name)]))
        self.seqs += other.seqs

    def _forward(self, input_ids: torch.Tensor, positions: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        out = self.model(
            input_ids=input_ids,
            attention_mask=self.mask,
            position_ids=positions,
            **{self.cache_kwarg: self.cache},
            use_cache=True,
            logits_to_keep=1,
        )
        return sample(out.logits[:, -1, :], self.temperature, self.top_p, self.greedy, row_uniforms(self.seqs, self.gen))


def _plain_growing(cache: Any) -> bool:
    """Whether every layer of ``cache`` is a plain growing one, which left-padding to a common
    length keeps exact (not a sliding window, not a static or quantized cache)."""
    from transformers.cache_utils import DynamicLayer

    layers = getattr(cache, "layers", None)
    return bool(layers) and all(type(layer) is DynamicLayer and layer.is_initialized for layer in layers)


def _left_pad(tensor: torch.Tensor, width: int, dim: int) -> torch.Tensor:
    """``tensor`` with zeros before it along ``dim`` up to ``width``."""
    missing = width - tensor.shape[dim]
    if not missing:
        return tensor
    shape = list(tensor.shape)
    shape[dim] = missing
    return torch.cat([tensor.new_zeros(shape), tensor], dim=dim)


class Generator:
    """Owns the model thread and the request queue; ``serve_forever`` is its scheduler loop."""

    def __init__(self, model: Any, *, eos_ids: frozenset[int], pad_id: int, max_batch_size: int, seed: int) -> None:
        self.model = model
        self.eos_ids = eos_ids
        self.pad_id = pad_id
        self.max_batch_size = max_batch_size
        self.version = 0
        self.running = 0
        self.served = 0  # requests answered since start (any stop reason)
        self._gen = torch.Generator().manual_seed(seed)
        self._queue: collections.deque[_Seq] = collections.deque()
        self._executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="model")
        self._work = asyncio.Event()
        self._unpaused = asyncio.Event()
        self._unpaused.set()
        self._idle = asyncio.Event()  # no model call runs for a wave: none runs, or it is held
        self._idle.set()
        self._keep = False  # the pause in force holds the running wave instead of aborting it
        self._held: list[_Seq] = []  # the wave a keep pause holds

    @property
    def paused(self) -> bool:
        return not self._unpaused.is_set()

    @property
    def queued(self) -> int:
        return len(self._queue)

    async def generate(self, body: GenerateBody) -> GenerateResult:
        (result,) = await self.generate_many([body])
        return result

    async def generate_many(self, bodies: list[GenerateBody]) -> list[GenerateResult]:
        """Queue every body (all are checked first: one bad body queues none); results in order.
        Each request decodes, is aborted and is counted exactly as if it came alone."""
        for body in bodies:
            self._check(body)
        loop = asyncio.get_running_loop()
        seqs = [_Seq(body, loop.create_future(), self.eos_ids | frozenset(body.stop_token_ids)) for body in bodies]
        self._queue.extend(seqs)
        self._work.set()
        results = await asyncio.gather(*(seq.future for seq in seqs))
        self.served += len(seqs)
        return list(results)

    async def pause(self, *, keep: bool = False) -> int:
        """Hold new work; abort every started request at its next step, or with ``keep`` hold them
        there to decode on after ``resume``; returns how many were aborted (or are held)."""
        self._keep = keep
        aborted = self.running
        self._unpaused.clear()
        await self._idle.wait()
        if keep:
            return len(self._held)
        for seq in self._held:  # held by an earlier keep pause
            seq.finish("abort")
        started = [seq for seq in self._queue if seq.output_ids]  # wave ended to rejoin: abort too
        for seq in started:
            self._queue.remove(seq)
            seq.finish("abort")
        return aborted + len(started)

    def abort_queued(self) -> int:
        """End every queued request with stop reason "abort" (those that never ran: no tokens)."""
        queued, self._queue = list(self._queue), collections.deque()
        for seq in queued:
            seq.finish("abort")
        return len(queued)

    def resume(self) -> None:
        self._unpaused.set()

    async def on_model_thread(self, fn: Callable[..., T], *args: Any) -> T:
        """Run ``fn`` between decode steps (weight swaps go through here)."""
        return await asyncio.get_running_loop().run_in_executor(self._executor, fn, *args)

    async def serve_forever(self) -> None:
        while True:
            await self._unpaused.wait()
            if not self._queue:
                self._work.clear()
                await self._work.wait()
                continue
            wave = [self._queue.popleft() for _ in range(min(self.max_batch_size, len(self._queue)))]
            wave = [seq for seq in wave if not seq.future.done()]  # the client went away
            if not wave:
                continue
            self._idle.clear()
            self.running = len(wave)
            try:
                await self._run_wave(wave)
            except Exception as exc:  # noqa: BLE001 - fail this wave's requests, keep serving
                log.exception("decode failed for %d requests", len(wave))
                for seq in wave:
                    if not seq.future.done():
                        seq.future.set_exception(exc)
            finally:
                self.running = 0
                self._idle.set()

    async def _run_wave(self, wave: list[_Seq]) -> None:
        """Decode ``wave`` until no row is left. Newcomers that join are added to ``wave``, so that a
        failure fails every row in flight (:meth:`serve_forever`; rows already ended are skipped)."""
        batch = _Batch(self.model, wave, self.pad_id, self._gen)
        tokens = await self._decode(batch, batch.prefill)
        while batch.seqs:
            self.running = len(batch.seqs)
            if self.paused:
                if not self._keep:
                    for seq in batch.seqs:
                        seq.finish("abort")
                    return
                await self._hold(batch.seqs)
                if all(seq.future.done() for seq in batch.seqs):  # aborted while held
                    return
            if self._queue and not batch.can_join:
                if len(self._queue) >= len(batch.seqs) and 2 * len(batch.seqs) <= self.max_batch_size:
                    self._queue.extendleft(reversed(batch.seqs))  # rejoin with the newcomers
                    return
            elif newcomers := self._newcomers(self.max_batch_size - len(batch.seqs)):
                wave[:] = [*batch.seqs, *newcomers]
                self.running = len(wave)
                joining = _Batch(self.model, newcomers, self.pad_id, self._gen)
                joined_tokens = await self._decode(joining, joining.prefill)
                if joining.seqs:
                    await self.on_model_thread(batch.join, joining)
                    tokens = torch.cat([tokens, joined_tokens])
                continue
            tokens = await self._decode(batch, batch.step, tokens)

    def _newcomers(self, room: int) -> list[_Seq]:
        """Queued requests to join a running wave: none until a quarter of the batch is free or all
        of them fit (a prefill costs several decode steps), then as many as fit."""
        if not self._queue or room < min(len(self._queue), max(1, self.max_batch_size // 4)):
            return []
        taken = [self._queue.popleft() for _ in range(min(room, len(self._queue)))]
        return [seq for seq in taken if not seq.future.done()]  # the client went away

    async def _decode(self, batch: _Batch, *call: Any) -> torch.Tensor:
        """Run one model call of ``batch``, give each row its token and drop the rows that ended;
        returns the tokens of the rows left (the next step's input)."""
        tokens, logprobs, version = await self.on_model_thread(self._tagged, *call)
        keep = []
        for row, (seq, token, logprob) in enumerate(zip(batch.seqs, tokens.tolist(), logprobs.tolist())):
            seq.output_ids.append(token)
            seq.logprobs.append(logprob)
            seq.versions.append(version)
            if token in seq.stop_ids:
                seq.finish("stop")
            elif len(seq.output_ids) >= seq.body.max_new_tokens:
                seq.finish("length")
            elif not seq.future.done():  # else the client went away
                keep.append(row)
        if len(keep) < len(batch.seqs):
            await self.on_model_thread(batch.keep, keep)
        return tokens[keep]

    async def _hold(self, wave: list[_Seq]) -> None:
        """Park ``wave`` between decode steps until ``resume`` (weight swaps land meanwhile)."""
        self._held = wave
        self._idle.set()
        try:
            await self._unpaused.wait()
        finally:
            self._held = []
            self._idle.clear()

    def _tagged(self, fn: Callable[..., tuple[torch.Tensor, torch.Tensor]], *args: Any) -> tuple[Any, ...]:
        """Run a model call (on the model thread); append the weight version it ran with."""
        version = self.version
        return (*fn(*args), version)

    def _check(self, body: GenerateBody) -> None:
        vocab = self.model.config.vocab_size
        if not body.input_ids:
            raise ValueError("input_ids is empty; send at least one prompt token")
        if min(body.input_ids) < 0 or max(body.input_ids) >= vocab:
            raise ValueError(f"input_ids must lie in [0, {vocab}) for this model")
        if body.max_new_tokens < 1:
            raise ValueError(f"max_new_tokens must be >= 1, got {body.max_new_tokens}")
        if body.temperature <= 0:
            raise ValueError(f"temperature must be > 0, got {body.temperature} (use greedy=true for argmax)")
        if not 0 < body.top_p <= 1:
            raise ValueError(f"top_p must be in (0, 1], got {body.top_p}")
