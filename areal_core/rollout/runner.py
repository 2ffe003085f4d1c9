"""Asynchronous rollout runner: workflows run on an asyncio loop in a background thread.

The trainer's thread calls ``prepare_batch`` each step; it tops up submissions to the staleness
capacity and returns as soon as a batch of accepted episodes may be consumed, leaving the other
episodes in flight for the next step. ``pause``/``set_version``/``resume`` bracket a weight update.

A failed episode (its workflow raised, e.g. a request timed out) runs again up to ``episode_retries``
times, then is dropped and counted; every failed attempt goes to ``failures``, which aborts
``prepare_batch``/``wait`` with one line when too many fail (see :mod:`areal_core.rollout.failures`).
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import itertools
import logging
import operator
import sys
import threading
import time
from typing import Any, Coroutine, Iterator, TypeVar, cast

import attrs

from areal_core.config import Config
from areal_core.api.engine import InferenceEngine, SupportsKeepPause
from areal_core.rollout.dataloader import EPOCH_KEY
from areal_core.rollout.failures import FailureRateError, FailureTracker, short_reason
from areal_core.rollout.ledger import EPISODE_UID, Ledger, episode_uid, json_value
from areal_core.rollout.staleness import StalenessManager, Ticket
from areal_core.api.workflow import Workflow
from areal_core.timeline import Timeline
from areal_core.api.trajectory import Trajectory

logger = logging.getLogger(__name__)
T = TypeVar("T")
_NO_TOKENS_VERSION = sys.maxsize  # the "oldest version" of an episode without generated tokens
# taking a batch maps these over thousands of episodes on the trainer's thread: C calls, not Python ones
_LEDGER_UID = operator.attrgetter("ledger_uid")
_TRAJECTORIES = operator.attrgetter("trajectories")
_TOKEN_VERSIONS = operator.attrgetter("token_versions")


@attrs.define
class RolloutStats:
    """Counts in episodes; the lag fields describe the last batch taken (output tokens only)."""

    submitted: int = 0  # episodes started
    accepted: int = 0
    rejected: int = 0  # the workflow returned None
    failed: int = 0  # dropped: the workflow raised (or returned a non-episode) on every attempt
    retried: int = 0  # failed attempts that were run again
    running: int = 0
    queued: int = 0  # submitted by the caller, waiting for staleness capacity
    consumed: int = 0  # episodes handed to the trainer
    batch_max_lag: int = 0
    batch_mean_lag: float = 0.0


@attrs.define
class _Episode:
    """An accepted episode waiting for a batch. What taking it needs besides the trajectories is
    worked out as it ends, on the loop: a batch takes thousands at once, on the trainer's thread,
    which shares the core with the loop."""

    data: dict[str, Any]
    trajectories: list[Trajectory]
    ledger_uid: str  # its ledger uid, JSON-encoded (:func:`~areal_core.rollout.ledger.json_value`)
    #: its generated tokens: how many, the sum of their producing versions and the oldest version
    #: (``_NO_TOKENS_VERSION`` when none); a batch's lags add these up
    token_versions: tuple[int, int, int]


class RolloutRunner:
    """See the module docstring; with a ``ledger``, every episode's lifecycle is appended to it."""

    def __init__(
        self,
        engine: InferenceEngine,
        staleness: StalenessManager,
        ledger: Ledger | None = None,
        *,
        episode_retries: int = 0,
        failures: FailureTracker | None = None,
        timeline: Timeline | None = None,
        keep_on_pause: bool = False,
    ) -> None:
        self.engine = engine
        self.keep_on_pause = keep_on_pause  # rollout.pause_mode: keep (the engine has SupportsKeepPause)
        self.timeline = timeline
        self.staleness = staleness
        self.ledger = ledger
        self.episode_retries = episode_retries
        self.failures = failures or FailureTracker("episode attempts", "", max_rate=1.0, window=1)
        self._attempts: dict[str, int] = {}  # failed attempts so far, per episode uid being retried
        self._cond = threading.Condition(threading.RLock())
        self._queue: collections.deque[tuple[dict[str, Any], Workflow]] = collections.deque()
        self._running: dict[int, dict[str, Any]] = {}
        #: accepted episodes by start version, each list in the order they finished
        self._ready: dict[int, list[_Episode]] = {}
        self._stats = RolloutStats()
        self._paused = False
        self._aborted = 0  # episodes whose generation a pause interrupted (cumulative)
        self._last_gauge: tuple[int, ...] = ()
        # while prepare_batch waits: where the loop tops the queue up from, and how many ready
        # episodes the waiting call needs before waking it is worth a look (fewer thread switches)
        self._source: tuple[Iterator[dict[str, Any]], Workflow] | None = None
        self._want = 0
        self._source_error: Exception | None = None  # the loader raised: prepare_batch re-raises it
        self._failing = False  # too many failed attempts: stop topping up until prepare_batch reports it
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None
        self._tasks: set[asyncio.Task] = set()

    @classmethod
    def from_config(
        cls,
        engine: InferenceEngine,
        config: Config,
        version: int = 0,
        ledger: Ledger | None = None,
        timeline: Timeline | None = None,
    ) -> RolloutRunner:
        rollout, batch_size = config.rollout, config.train_dataset.batch_size
        staleness = StalenessManager.from_config(rollout, batch_size, version)
        window = rollout.failure_window_steps * batch_size
        failures = FailureTracker(
            "episode attempts", "rollout.max_failure_rate", max_rate=rollout.max_failure_rate, window=window
        )
        return cls(
            engine, staleness, ledger, episode_retries=rollout.episode_retries, failures=failures, timeline=timeline,
            keep_on_pause=rollout.pause_mode == "keep",
        )

    # ------------------------------------------------------------------ lifecycle

    def start(self) -> None:
        if self._thread is not None:
            raise RuntimeError("RolloutRunner.start() called twice")
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, name="rollout-loop", daemon=True)
        self._thread.start()
        self._session = self.engine.client_session()  # one HTTP session for every request on this loop
        self.run(self._session.__aenter__())
        self._schedule_pump()

    def stop(self) -> None:
        """Cancel every running episode and end the loop thread (idempotent)."""
        loop, thread = self._loop, self._thread
        if loop is None or thread is None or not thread.is_alive():
            return
        with self._cond:  # the intake ends first: nothing starts after the record of what is in flight
            self.end_intake()
            self._record("stop", in_flight=[episode_uid(d) for d in self.in_flight()])
        asyncio.run_coroutine_threadsafe(self._cancel_all(), loop).result()
        asyncio.run_coroutine_threadsafe(self._session.__aexit__(None, None, None), loop).result()
        loop.call_soon_threadsafe(loop.stop)
        thread.join()
        loop.close()
        with self._cond:
            self._cond.notify_all()

    def __enter__(self) -> RolloutRunner:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    async def _cancel_all(self) -> None:
        """Cancel every task on the loop: the episodes, and calls other threads put on it (an agent
        proxy's model calls), which would otherwise be left pending when the loop closes."""
        tasks = asyncio.all_tasks() - {asyncio.current_task()}
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)

    def run(self, coro: Coroutine[Any, Any, T]) -> T:
        """Run ``coro`` on the rollout loop (where the engine's async calls live) and wait for it."""
        if self._loop is None or self._thread is None or not self._thread.is_alive():
            raise RuntimeError("the rollout controller is not running; call start() first")
        return asyncio.run_coroutine_threadsafe(coro, self._loop).result()

    # ------------------------------------------------------------------ submission

    def submit(self, data: dict[str, Any], workflow: Workflow) -> None:
        """Queue one episode; it starts as soon as the staleness capacity allows."""
        with self._cond:
            self._queue.append((data, workflow))
        self._schedule_pump()

    def _schedule_pump(self) -> None:
        if self._loop is not None and not self._loop.is_closed():
            self._loop.call_soon_threadsafe(self._pump)

    def _pump(self) -> None:
        """Start queued episodes while there is capacity (runs on the loop thread)."""
        with self._cond:
            while not self._paused and self.staleness.capacity() > 0 and (self._queue or self._pull()):
                data, workflow = self._queue.popleft()
                ticket = self.staleness.submit()
                self._running[ticket.serial] = data
                self._record(
                    "submitted",
                    uid=episode_uid(data),
                    item_id=data.get("id"),
                    epoch=data.get(EPOCH_KEY, 0),
                    version=self.staleness.version,
                )
                task = asyncio.get_running_loop().create_task(self._run_episode(ticket, data, workflow))
                self._tasks.add(task)
                task.add_done_callback(self._tasks.discard)
            self._gauge()

    async def _run_episode(self, ticket: Ticket, data: dict[str, Any], workflow: Workflow) -> None:
        uid = episode_uid(data)
        EPISODE_UID.set(uid)  # this task's own context: engine events name the episode
        reason = None
        try:
            episode = _checked_episode(await workflow(self.engine, data))
            outcome = "accepted" if episode is not None else "rejected"
        except Exception as exc:  # a workflow bug or a failed request must not stop the loop
            logger.debug("workflow %s failed on prompt id=%r", _name(workflow), data.get("id"), exc_info=True)
            episode, outcome, reason = None, "failed", short_reason(exc)
        # worked out here, one episode at a time: a batch of thousands done at once held the GIL for
        # a long stretch, and the loop's requests waited behind it
        token_versions, ledger_uid = _token_versions(episode or []), json_value(uid)
        self.failures.record(reason)
        if reason is not None:
            try:
                self.failures.check()
            except FailureRateError:
                self._failing = True
        with self._cond:
            del self._running[ticket.serial]
            if episode is not None:
                self.staleness.accept(ticket)
                self._ready.setdefault(ticket.version, []).append(_Episode(data, episode, ledger_uid, token_versions))
            else:
                self.staleness.reject(ticket)
            if outcome == "failed" and self._attempts.get(uid, 0) < self.episode_retries:
                self._attempts[uid] = self._attempts.get(uid, 0) + 1
                self._queue.appendleft((data, workflow))  # runs again before new prompts
                outcome = "retried"
            else:
                self._attempts.pop(uid, None)
            setattr(self._stats, outcome, getattr(self._stats, outcome) + 1)
            self._record(outcome, uid=uid)
            self._gauge()
            if reason is not None or self.staleness.ready >= self._want or not self._running:
                self._cond.notify_all()
        self._pump()

    def _pull(self) -> bool:
        """Queue the next item of the last ``prepare_batch``'s loader, if intake from it goes on
        (called under the lock, so the loader is never read by two threads at once)."""
        if self._source is None or self._failing:
            return False
        dataloader, workflow = self._source
        try:
            item = next(dataloader, None)
        except Exception as exc:  # noqa: BLE001 - handed to the waiting prepare_batch
            self._source, self._source_error = None, exc
            self._cond.notify_all()
            return False
        if item is None:
            self._source = None
            return False
        self._queue.append((item, workflow))
        return True

    # ------------------------------------------------------------------ consumption

    def wait(self, n: int, timeout: float | None = None) -> list[Trajectory]:
        """Take ``n`` accepted episodes (flattened, each group contiguous); TimeoutError if late.
        Only submitted episodes start from now: it ends the intake from a ``prepare_batch`` loader."""
        return self._take(n, timeout, source=None)

    def end_intake(self) -> None:
        """Start no more episodes from the last ``prepare_batch``'s loader (after a run's last batch)."""
        with self._cond:
            self._source = None

    @contextlib.contextmanager
    def intake_held(self) -> Iterator[None]:
        """No item is taken from the loader meanwhile, so its position and :meth:`in_flight` agree
        (a recover point keeps both)."""
        with self._cond:
            yield

    def prepare_batch(
        self,
        dataloader: Iterator[dict[str, Any]],
        workflow: Workflow,
        batch_size: int | None = None,
        timeout: float | None = None,
        trainer_version: int | None = None,
    ) -> list[Trajectory]:
        """Keep the pipe full from ``dataloader`` and return one batch of ``batch_size`` episodes.
        The pipe stays full from it after the return too (episodes start as capacity opens while
        the caller trains), until :meth:`end_intake`, :meth:`wait` or another ``prepare_batch``.
        ``trainer_version``: the version the batch trains, when the servers may not serve it yet
        (its load still running, or aborted); the batch's lags count from it."""
        n = self.staleness.batch_size if batch_size is None else batch_size
        if n != self.staleness.batch_size:
            raise ValueError(
                f"prepare_batch(batch_size={n}) differs from the staleness manager's batch_size="
                f"{self.staleness.batch_size}; build the controller with the train batch size"
            )
        return self._take(n, timeout, source=(dataloader, workflow), trainer_version=trainer_version)

    def _take(
        self,
        n: int,
        timeout: float | None,
        source: tuple[Iterator[dict[str, Any]], Workflow] | None,
        trainer_version: int | None = None,
    ) -> list[Trajectory]:
        """Wait for ``n`` episodes; with a ``source``, the loop keeps the pipe full from it meanwhile
        and wakes this thread only when ``n`` are ready (or an episode failed, or none runs)."""
        deadline = None if timeout is None else time.monotonic() + timeout
        with self._cond:
            if n > self.staleness.window():
                raise ValueError(
                    f"waiting for {n} episodes at version {self.version}, but the staleness window admits only "
                    f"{self.staleness.window()}; consume batches of rollout batch_size and bump the version"
                )
            self._source, self._want, self._failing = source, n, False
            if source is not None:  # top up now; while waiting, the loop does it as capacity opens
                for _ in range(self.staleness.capacity() - len(self._queue)):
                    if not self._pull():
                        break
                self._schedule_pump()
            try:
                while True:
                    if self._source_error is not None:
                        error, self._source_error = self._source_error, None
                        raise error
                    taken = self.staleness.select(n)
                    if taken is not None:
                        break
                    if self._thread is None or not self._thread.is_alive():
                        raise RuntimeError("the rollout controller is not running; call start() first")
                    self.failures.check()
                    remaining = None if deadline is None else deadline - time.monotonic()
                    if remaining is not None and remaining <= 0:
                        raise TimeoutError(
                            f"{self.staleness.ready} of {n} episodes ready after {timeout}s "
                            f"({self.staleness.running} running); raise the timeout or check the engine"
                        )
                    self._cond.wait(remaining)
            finally:
                self._want = 0
            parts = [self._take_ready(start_version, count) for start_version, count in taken.items()]
            version = self.staleness.version if trainer_version is None else trainer_version
            self.staleness.consume(taken)
            self._stats.consumed += n
            self._gauge()
        # the rest holds no lock: at thousands of episodes it takes a while, and the loop goes on
        episodes = list(itertools.chain.from_iterable(parts))
        if self.ledger is not None:
            self.ledger.record_each("consumed", "uid", map(_LEDGER_UID, episodes), version=version)
        batch = list(itertools.chain.from_iterable(map(_TRAJECTORIES, episodes)))
        max_lag, mean_lag = _lags(list(map(_TOKEN_VERSIONS, episodes)), version)
        with self._cond:
            self._stats.batch_max_lag, self._stats.batch_mean_lag = max_lag, mean_lag
        return batch

    def _take_ready(self, start_version: int, count: int) -> list[_Episode]:
        """The first ``count`` ready episodes that started at ``start_version``. Called under the
        lock, which the loop waits on: list slices, not a step per episode."""
        group = self._ready[start_version]
        if count == len(group):
            return self._ready.pop(start_version)
        taken = group[:count]
        del group[:count]
        return taken

    # ------------------------------------------------------------------ weight updates

    def pause(self) -> None:
        """Stop starting episodes and interrupt in-flight generation (before a weight update), or
        with ``keep_on_pause`` have the servers hold it, to decode on the new weights after ``resume``."""
        with self._cond:
            self._paused = True
            if not self.keep_on_pause:
                self._aborted += len(self._running)
            self._gauge()
        if self.keep_on_pause:
            cast(SupportsKeepPause, self.engine).pause_keeping()
        else:
            self.engine.pause()

    def resume(self) -> None:
        self.engine.resume()
        with self._cond:
            self._paused = False
            self._gauge()
        self._schedule_pump()

    def set_version(self, version: int) -> None:
        """The trainer's new version: tags new tokens and opens the staleness window."""
        self.engine.set_version(version)
        with self._cond:
            self.staleness.set_version(version)
            self._gauge()
            self._cond.notify_all()
        self._schedule_pump()

    # ------------------------------------------------------------------ introspection

    @property
    def version(self) -> int:
        return self.staleness.version

    @property
    def stats(self) -> RolloutStats:
        """A snapshot of the counters."""
        with self._cond:
            return attrs.evolve(
                self._stats, submitted=self.staleness.submitted, running=len(self._running), queued=len(self._queue)
            )

    def in_flight(self) -> list[dict[str, Any]]:
        """Dataset items taken but not yet consumed (queued, running or ready): a checkpoint keeps them."""
        with self._cond:
            ready = [e.data for group in self._ready.values() for e in group]
            return [d for d, _ in self._queue] + list(self._running.values()) + ready

    def _gauge(self) -> None:
        """Record the concurrency on the timeline when it changed (call under the lock).

        ``blocked_staleness``: episode slots ``max_concurrent_rollouts`` leaves free that the
        staleness bound refuses; ``blocked_concurrency``: the reverse; ``aborted``: episodes whose
        generation a pause interrupted, cumulative."""
        if self.timeline is None or not self.timeline.enabled:
            return
        s = self.staleness
        running = s.running
        free_concurrency = s.max_concurrent - running
        free_window = s.window() - s.ready - running
        gauge = (
            running,
            s.ready,
            s.accepted,
            max(0, free_concurrency - max(free_window, 0)),
            max(0, free_window - max(free_concurrency, 0)),
            int(self._paused),
            self._aborted,
        )
        if gauge != self._last_gauge:
            self._last_gauge = gauge
            self.timeline.rollout(gauge)

    def _record(self, event: str, **fields: Any) -> None:
        if self.ledger is not None:
            self.ledger.record(event, **fields)


def _token_versions(episode: list[Trajectory]) -> tuple[int, int, int]:
    """``episode``'s generated tokens (prompt tokens, version -1, left out): how many, the sum of
    the weight versions that produced them, and the oldest of those (``_NO_TOKENS_VERSION`` if none)."""
    counts: collections.Counter[int] = collections.Counter()
    for traj in episode:
        counts.update(traj.versions)
    del counts[-1]
    total = sum(produced_by * tokens for produced_by, tokens in counts.items())
    return counts.total(), total, min(counts, default=_NO_TOKENS_VERSION)


def _lags(episodes: list[tuple[int, int, int]], version: int) -> tuple[int, float]:
    """Max and mean lag (``version`` minus the version that produced it) over the generated tokens
    of a batch, from each episode's :func:`_token_versions` (a batch can hold millions of tokens)."""
    counts, totals, oldest = zip(*episodes) if episodes else ((), (), ())
    count = sum(counts)
    return (version - min(oldest), version - sum(totals) / count) if count else (0, 0.0)


def _checked_episode(result: Any) -> list[Trajectory] | None:
    """The workflow's result, or TypeError/ValueError if it is not one episode."""
    if result is None:
        return None
    if not isinstance(result, list) or not result or not all(isinstance(t, Trajectory) for t in result):
        raise TypeError(f"a workflow must return a non-empty list[Trajectory] or None, got {type(result).__name__}")
    if len({t.prompt_id for t in result}) != 1:
        prompt_ids = sorted({t.prompt_id for t in result})
        raise ValueError(f"an episode's trajectories must share one prompt_id, got {prompt_ids}")
    uids = [t.uid for t in result]
    if not all(uids) or len(set(uids)) != len(uids):
        raise ValueError(f"every trajectory needs its own non-empty uid, got {uids}")
    return result


def _name(workflow: Workflow) -> str:
    return getattr(workflow, "__name__", type(workflow).__name__)
