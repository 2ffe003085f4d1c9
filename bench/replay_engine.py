"""ReplayLatencyEngine: NOT a model. In-process stand-ins for ``rollout.servers`` generation servers.

The client half is the real :class:`~areal_core.api.http_engine.HTTPServerEngine` (router, pause
gate, segments re-submitted after a pause); only the server call is simulated: a request draws
``(latency seconds, output tokens)`` from a sampler on its first segment (given the weight version
it starts on), its tokens arrive evenly over that latency, and ``pause()`` aborts every running
segment with the tokens produced so far, as a real server does; ``pause_keeping()`` freezes them
instead until ``resume()`` (their tokens after it carry the new version), as a server holding
requests through an update does.
An abort loses no decoding: the segment sent after ``resume()`` finishes the token that was in
progress from where it stopped. The hf server does the same, its pause lands between decode steps
and hands back every token computed; vLLM's engine core also pauses between steps, but with async
scheduling a step in flight is dropped for the aborted requests (one decode step each), which
this engine does not charge. What a real server pays beyond that is compute (prefilling prompt +
output again after the abort), and these servers have no compute limit: latency does not depend
on load (the fleet is assumed sized for it). Segments end on one generation clock, which a keep
pause stops, so holding and releasing thousands of requests costs the client's loop one timer, as
a real server holds them in its own process (one timer per request, cancelled and set again, took
40 ms at a pause and 0.1 to 0.8 s at a resume with 15,000 running). Output ids cycle through
2..11; weight loads only change the version tag. Used by ``bench/async_vs_sync.py`` (recorded
latencies) and ``bench/controller_scale.py`` (lognormal latencies).
"""

from __future__ import annotations

import asyncio
import bisect
import contextlib
import heapq
import itertools
import math
import random
from collections.abc import Callable, Sequence
from typing import Any

import attrs

from areal_core.api.engine import GenerationRequest, GenerationResponse
from areal_core.api.http_engine import HTTPServerEngine, Segment, SegmentCall, one_call_each
from areal_core.api.errors import ArealError

#: ``sampler(rng, version) -> (latency seconds, output tokens)`` for one request that starts on
#: weight version ``version``.
Sampler = Callable[[random.Random, int], tuple[float, int]]
_IDS = [2 + i % 10 for i in range(1 << 16)]


def recorded(by_version: dict[int, list[tuple[float, int]]]) -> Sampler:
    """Draw uniformly from the ``(latency, length)`` pairs recorded at the request's weight version
    (the latest recorded one at or below it, else the first): a policy's lengths drift as it
    trains, and draws from the whole run would put the first versions' stragglers in every step."""
    versions = sorted(by_version)

    def draw(rng: random.Random, version: int) -> tuple[float, int]:
        at = versions[max(0, bisect.bisect_right(versions, version) - 1)]
        return rng.choice(by_version[at])

    return draw


@attrs.frozen
class Lognormal:
    """Decode time lognormal around ``median_s`` (real seconds) with shape ``sigma``, replayed
    ``time_factor`` times faster; ``tokens_per_s`` output tokens per real second of decoding."""

    median_s: float = 60.0
    sigma: float = 1.0
    time_factor: float = 10.0
    tokens_per_s: float = 2.0

    def __call__(self, rng: random.Random, version: int = 0) -> tuple[float, int]:
        """One request's draw; the distribution does not drift with ``version``."""
        real = rng.lognormvariate(math.log(self.median_s), self.sigma)
        return real / self.time_factor, max(1, round(real * self.tokens_per_s))

    def mean_s(self) -> float:
        """Expected simulated latency of one request."""
        return self.median_s * math.exp(self.sigma**2 / 2) / self.time_factor


@attrs.define
class _Running:
    """One segment being served, timed on the engine's generation clock (see ``_generation_time``)."""

    future: asyncio.Future
    start: float
    seconds: float
    tokens: int
    carried: float = 0.0  # seconds of its first token an earlier, aborted segment already decoded

    @property
    def end(self) -> float:
        return self.start + self.seconds

    def _progress(self, at: float) -> float:
        """Tokens' worth decoded by generation time ``at``, the token in progress as a fraction."""
        span = self.seconds + self.carried
        return self.tokens if span <= 0 else self.tokens * min(1.0, (at - self.start + self.carried) / span)

    def produced(self, at: float) -> int:
        """Tokens out by generation time ``at`` (a token counts once its whole share of the latency has passed)."""
        return math.floor(self._progress(at))

    def in_progress(self, at: float) -> float:
        """Seconds of the token in progress decoded by ``at``: what a segment sent after an abort carries."""
        progress = self._progress(at)
        return (progress - math.floor(progress)) * (self.seconds + self.carried) / self.tokens if self.tokens else 0.0


class ReplayLatencyEngine(HTTPServerEngine):
    """See the module docstring. ``sampler`` defaults to the class attribute ``default_sampler``."""

    name = "replay-latency"
    server_label = "replay server"
    default_sampler: Sampler = Lognormal()  # a plain attribute: read through the class, never bound

    def __init__(self, config: Any, platform: Any, sampler: Sampler | None = None) -> None:
        super().__init__(config, platform)
        self.sampler = sampler or type(self).default_sampler
        self.rng = random.Random(config.seed)
        self.version = 0
        self.completed = 0  # requests answered in full
        self.aborted_segments = 0  # running segments an abort pause ended
        #: per request of a group no pause interrupted that started at or after ``added_since`` (loop
        #: time): wall time in ``agenerate_group`` minus the group's slowest simulated latency and
        #: minus the time generation was paused meanwhile
        self.added: list[float] = []
        self.added_since = -math.inf
        self._pauses: list[list[float]] = []  # [start, end] in loop time (end inf while in force)
        self.by_seed: dict[int, float] = {}  # sampling seed -> simulated latency, for callers that pass seeds
        self._interrupted: set[str] = set()  # running request ids aborted by a pause at least once
        self._plans: dict[str, tuple[float, int]] = {}  # request id -> (latency, length) while it runs
        self._carried: dict[str, float] = {}  # request id -> its token in progress at an abort (seconds decoded)
        self._loop: asyncio.AbstractEventLoop | None = None
        #: running segments by end (generation time), a serial to break ties; one loop timer, at the first
        self._due: list[tuple[float, int, _Running]] = []
        self._serials = itertools.count()
        self._timer: asyncio.TimerHandle | None = None
        self._held_s = 0.0  # loop seconds keep pauses have held generation, the one in force excluded
        self._frozen_at: float | None = None  # loop time of the keep pause in force
        self._holds: list[tuple[float, int]] = []  # (generation time, version served before it) per keep pause

    # ------------------------------------------------------------------ servers (in-process)
    def launch_servers(self, scheduler: Any) -> list[str]:
        self.attach([f"replay-{i}" for i in range(self.config.rollout.servers)])
        return list(self.addresses)

    def server_spec(self, index: int, port: int | str, run_dir: Any, host: str = "127.0.0.1") -> Any:
        raise ArealError("replay servers run in-process; they have no process to start")

    def server_is_up(self, address: str) -> bool:
        return True

    def _new_session(self) -> Any:
        return contextlib.nullcontext()  # no HTTP: the server call below is simulated

    async def agenerate_group(self, requests: Sequence[GenerationRequest]) -> list[GenerationResponse]:
        start = asyncio.get_running_loop().time()
        try:
            responses = await super().agenerate_group(requests)
        finally:
            plans = [self._plans.pop(r.request_id, None) for r in requests]
            for r in requests:
                self._carried.pop(r.request_id, None)
            interrupted = any(r.request_id in self._interrupted for r in requests)
            self._interrupted.difference_update(r.request_id for r in requests)
        self.completed += len(requests)
        if not interrupted and None not in plans:  # the group returns with its slowest request
            added = self.added_latency(start, max(p[0] for p in plans))
            if added is not None:
                self.added.extend([added] * len(requests))
        return responses

    def added_latency(self, start: float, simulated: float) -> float | None:
        """Seconds from ``start`` (loop time) to now beyond ``simulated`` and beyond the time a pause
        held generation meanwhile; None for a call that started before ``added_since``."""
        if start < self.added_since:
            return None
        end = asyncio.get_running_loop().time()
        return end - start - simulated - self.paused_between(start, end)

    async def _generate_segments(self, session: Any, address: str, *, calls: list[SegmentCall]) -> list[Segment]:
        return await one_call_each(self._generate_segment, session, address, calls)

    async def _generate_segment(
        self, session: Any, address: str, *, request: GenerationRequest, generated: list[int], attempt: int
    ) -> Segment:
        loop = self._loop = asyncio.get_running_loop()
        rid = request.request_id
        plan = self._plans.get(rid)
        if plan is None:
            plan = self._plans[rid] = self.sampler(self.rng, self.version)
            if request.sampling.seed is not None:
                self.by_seed[request.sampling.seed] = plan[0]
        latency, length = plan[0], min(plan[1], request.sampling.max_new_tokens)
        left = max(0, length - len(generated))
        carried = self._carried.pop(rid, 0.0)
        seconds = max(0.0, latency * left / length - carried) if length else latency
        run = _Running(loop.create_future(), self._generation_time(), seconds, left, carried)
        heapq.heappush(self._due, (run.end, next(self._serials), run))
        self._arm()
        tokens, reason, in_progress = await run.future
        if reason == "abort":
            self._interrupted.add(rid)
            self._carried[rid] = in_progress
        return Segment(output_ids=_IDS[:tokens], logprobs=[-2.5] * tokens, versions=self._versions(run, tokens),
                       stop_reason=reason)

    def _generation_time(self) -> float:
        """Loop time less the time keep pauses held generation: segments end on this clock, so a
        pause and a resume move one timer (:meth:`_arm`), not one per request, as a real server holds
        its requests without the client doing anything for each."""
        now = self._frozen_at if self._frozen_at is not None else self._loop.time()
        return now - self._held_s

    def _arm(self) -> None:
        """Have the loop wake when the first running segment ends (not while a keep pause holds)."""
        if self._frozen_at is not None or not self._due:
            return
        end = self._due[0][0]
        when = end + self._held_s
        if self._timer is not None:
            if self._timer.when() <= when:
                return
            self._timer.cancel()
        self._timer = self._loop.call_at(when, self._finish_due, end)

    def _finish_due(self, end: float) -> None:
        """The timer for ``end`` fired: end every segment due by now, then wait for the next."""
        self._timer = None
        now = max(end, self._generation_time())
        while self._due and self._due[0][0] <= now:
            run = heapq.heappop(self._due)[2]
            _finish(run.future, run.tokens, "length")
        self._arm()

    def _versions(self, run: _Running, tokens: int) -> list[int]:
        """The version of each of a segment's first ``tokens`` tokens: for those out before a keep
        pause it ran through, the version served before that pause; after the last, the current one."""
        out: list[int] = []
        for held_at, version in self._holds[bisect.bisect_right(self._holds, (run.start, math.inf)):]:
            out += [version] * (min(tokens, run.produced(held_at)) - len(out))
        return out + [self.version] * (tokens - len(out))

    def _stop_timer(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None

    def _abort_all(self) -> None:
        """What a real server's pause route does: end every running segment with what it has (its
        token in progress goes on in the segment sent after the resume)."""
        self._pause_began()
        now = self._generation_time()
        self._stop_timer()
        for _, _, run in self._due:
            if not run.future.done():  # not cancelled by its client
                self.aborted_segments += 1
            _finish(run.future, run.produced(now), "abort", run.in_progress(now))
        self._due.clear()

    def _freeze_all(self) -> None:
        """What a keep pause does: every running segment stops producing, keeping its progress."""
        self._frozen_at = self._pause_began()
        self._holds.append((self._generation_time(), self.version))
        self._stop_timer()

    def _thaw_all(self) -> None:
        """The pause ends; frozen segments go on from where they stopped, on the version served now."""
        now = self._loop.time()
        if self._pauses and self._pauses[-1][1] == math.inf:
            self._pauses[-1][1] = now
        if self._frozen_at is None:
            return
        self._held_s, self._frozen_at = self._held_s + now - self._frozen_at, None
        self._arm()

    def _pause_began(self) -> float:
        now = self._loop.time()
        self._pauses.append([now, math.inf])
        return now

    def paused_between(self, start: float, end: float) -> float:
        """Seconds of ``[start, end]`` (loop time) during which a pause held generation: the weight
        update's own time, which a request waits out whatever the controller does, so it is not
        added latency."""
        return sum(max(0.0, min(stop, end) - max(begin, start)) for begin, stop in self._pauses if stop > start)

    # ------------------------------------------------------------------ control
    def pause(self) -> None:
        self._gate.close()
        self._on_loop(self._abort_all)

    def pause_keeping(self) -> None:
        self._gate.close()
        self._on_loop(self._freeze_all)

    def resume(self) -> None:
        self._on_loop(self._thaw_all)
        self._gate.open()

    def _on_loop(self, fn: Callable[[], None]) -> None:
        """Run ``fn`` on the loop the segments run on, and wait for it (nothing to do before one ran)."""
        loop = self._loop
        if loop is not None and not loop.is_closed():
            async def call() -> None:
                fn()

            with contextlib.suppress(RuntimeError):  # the loop stopped meanwhile: nothing runs
                asyncio.run_coroutine_threadsafe(call(), loop).result()

    def load_weights_from_disk(self, path: str, version: int) -> None:
        self.version = version

    def set_version(self, version: int) -> None:
        self.version = version


def _finish(future: asyncio.Future, tokens: int, reason: str, in_progress: float = 0.0) -> None:
    if not future.done():
        future.set_result((tokens, reason, in_progress))
