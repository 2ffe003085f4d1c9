"""Run a reward function in worker processes, with a per-call timeout.

A reward that raises, returns a non-finite value, kills its worker or runs past ``timeout``
scores 0.0; the failure is counted (in ``stats`` and, with a ``failures`` tracker, in its per-step
report line and abort window) and never reaches the caller. A worker that runs past the timeout
is killed and replaced, so later calls never wait on it. Workers come from the ``forkserver``
(else ``spawn``) start method: the caller has threads and an event loop, which ``fork`` would copy
half-way. The forkserver preloads this module and the reward's, so a worker that the reward
killed (``os._exit``) is replaced in tens of milliseconds, not the half second a fresh import takes.
``score_many`` sends a batch (e.g. a group's completions) to a worker in one message; the worker
answers item by item, so each item keeps its own timeout, and the items after one that kills or
hangs its worker go to a fresh one.
"""

from __future__ import annotations

import asyncio
import logging
import math
import multiprocessing as mp
import pickle
import signal
import threading
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from multiprocessing.connection import Connection
from typing import Any

import attrs

from areal_core.api.reward import RewardFn, call_reward
from areal_core.rollout.failures import FailureTracker

logger = logging.getLogger(__name__)

#: One reward call's arguments: ``(prompt, completion, data)``.
Job = tuple[str, str, dict[str, Any]]
#: Seconds a new worker may take to start and import the reward's module.
STARTUP_TIMEOUT = 120.0


@attrs.frozen
class RewardStats:
    """Counters since the runner started: every call, and the failures that scored 0."""

    calls: int = 0
    errors: int = 0
    timeouts: int = 0


def _worker_main(conn: Connection, fn_bytes: bytes) -> None:
    """Worker loop: unpickle the reward, report ready, then answer each message (a list of jobs) job by job."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C is the parent's to handle
    try:
        fn = pickle.loads(fn_bytes)
    except BaseException as exc:  # noqa: BLE001 - reported to the parent, then exit
        conn.send((False, f"{type(exc).__name__}: {exc}"))
        return
    conn.send((True, None))
    while True:
        try:
            jobs = conn.recv()
        except EOFError:  # the parent is gone
            return
        if jobs is None:
            return
        for prompt, completion, data in jobs:  # one reply per job, as each is done
            try:
                value = call_reward(fn, prompt, completion, data)
                reply = (True, value) if math.isfinite(value) else (False, f"returned {value}")
            except BaseException as exc:  # noqa: BLE001 - any failure scores 0 in the parent
                reply = (False, f"{type(exc).__name__}: {exc}")
            conn.send(reply)


def _pickled_prefix(jobs: list[Job]) -> tuple[bytes | str, int]:
    """``(pickle of the longest prefix of jobs that pickles, its length)``; for an empty prefix,
    ``(why the first job cannot be pickled, 0)``."""
    try:
        return pickle.dumps(jobs), len(jobs)
    except (pickle.PicklingError, TypeError, AttributeError):
        pass
    for n, job in enumerate(jobs):
        try:
            pickle.dumps(job)
        except (pickle.PicklingError, TypeError, AttributeError) as exc:
            return (pickle.dumps(jobs[:n]), n) if n else (str(exc), 0)
    return pickle.dumps(jobs[:1]), 1  # each pickles alone, not together: one at a time


class _Worker:
    """One worker process and the parent's end of its pipe."""

    def __init__(self, ctx: Any, fn_bytes: bytes, name: str) -> None:
        self.conn, child = ctx.Pipe()
        self.process = ctx.Process(target=_worker_main, args=(child, fn_bytes), daemon=True, name=name)
        self.process.start()
        child.close()
        try:
            ready, reason = self.conn.recv() if self.conn.poll(STARTUP_TIMEOUT) else (False, "no answer")
        except EOFError:
            ready, reason = False, f"exit code {self._exit_code()}"
        if not ready:
            self.kill()
            raise RuntimeError(f"reward worker {name} failed to start ({reason}); check the reward's module imports")

    def _exit_code(self) -> int | None:
        self.process.join(timeout=5)
        return self.process.exitcode

    def died(self) -> str:
        return f"worker process died (exit code {self._exit_code()})"

    def kill(self) -> None:
        self.process.kill()
        self.process.join()
        self.conn.close()

    def stop(self) -> None:
        """Ask an idle worker to exit; kill it if it does not."""
        try:
            self.conn.send(None)
        except OSError:
            pass
        self.process.join(timeout=5)
        self.kill()


class RewardRunner:
    """Scores completions with ``fn`` in up to ``workers`` processes, ``timeout`` seconds per call;
    every call's outcome goes to ``failures`` when given."""

    def __init__(
        self, fn: RewardFn, *, workers: int, timeout: float, failures: FailureTracker | None = None
    ) -> None:
        if workers < 1:
            raise ValueError(f"workers must be >= 1, got {workers}")
        if timeout <= 0:
            raise ValueError(f"timeout must be > 0, got {timeout}")
        self.name = getattr(fn, "__qualname__", repr(fn))
        try:
            self._fn_bytes = pickle.dumps(fn)
        except Exception as exc:  # noqa: BLE001 - lambdas, closures, bound methods of odd objects
            raise ValueError(
                f"reward {self.name} cannot be sent to worker processes ({exc}); use a module-level function"
            ) from None
        self.workers = workers
        self.timeout = timeout
        self.failures = failures
        methods = mp.get_all_start_methods()
        self._ctx = mp.get_context("forkserver" if "forkserver" in methods else "spawn")
        if "forkserver" in methods:  # takes effect if the forkserver has not started yet
            self._ctx.set_forkserver_preload(["__main__", __name__, getattr(fn, "__module__", None) or __name__])
        self._threads = ThreadPoolExecutor(max_workers=workers, thread_name_prefix="areal-reward")
        self._lock = threading.Lock()
        self._idle: list[_Worker] = []
        self._busy: set[_Worker] = set()
        self._stats = RewardStats()
        self._closed = False

    @property
    def stats(self) -> RewardStats:
        with self._lock:
            return self._stats

    def start(self) -> None:
        """Start every worker before scoring, so a reward whose module fails to import fails here, not mid-run."""
        with self._lock:
            missing = self.workers - len(self._idle) - len(self._busy)
        for _ in range(missing):  # each one idle as soon as it is up, so close() stops it if a later one fails
            worker = self._new_worker()
            with self._lock:
                self._idle.append(worker)

    async def score(self, prompt: str, completion: str, data: dict[str, Any]) -> float:
        """The reward for one completion; 0.0 (counted and logged) when the reward fails."""
        (value,) = await self.score_many([(prompt, completion, data)])
        return value

    async def score_many(self, jobs: Sequence[Job]) -> list[float]:
        """``score`` for each ``(prompt, completion, data)``, in order, in one message per worker
        (up to ``workers`` of them): each item still has its own timeout and failure accounting."""
        if self._closed:
            raise RuntimeError("RewardRunner is closed")
        if not jobs:
            return []
        loop = asyncio.get_running_loop()
        size = -(-len(jobs) // min(self.workers, len(jobs)))
        chunks = [list(jobs[i : i + size]) for i in range(0, len(jobs), size)]
        scored = await asyncio.gather(*(loop.run_in_executor(self._threads, self._score_blocking, c) for c in chunks))
        return [value for chunk in scored for value in chunk]

    def _score_blocking(self, jobs: list[Job]) -> list[float]:
        values: list[float] = []
        self._count("calls", len(jobs))
        while len(values) < len(jobs):
            values += self._score_on_one_worker(jobs[len(values) :])
        return values

    def _score_on_one_worker(self, jobs: list[Job]) -> list[float]:
        """Scores of a non-empty prefix of ``jobs``: all of them, or up to the first one that
        cannot be pickled, kills the worker or times out (it scores 0, the worker is replaced)."""
        payload, sendable = _pickled_prefix(jobs)
        if not sendable:
            return [self._failed("errors", f"arguments cannot be pickled: {payload}")]
        worker = self._acquire()
        healthy = False
        values: list[float] = []
        try:
            try:
                worker.conn.send_bytes(payload)
            except OSError:
                return [self._failed("errors", worker.died())]
            for _ in range(sendable):
                if not worker.conn.poll(self.timeout):
                    return values + [self._failed("timeouts", f"no result within {self.timeout:g}s; worker replaced")]
                try:
                    ok, value = worker.conn.recv()
                except (EOFError, OSError):
                    return values + [self._failed("errors", worker.died())]
                if not ok:
                    values.append(self._failed("errors", value))
                    continue
                if self.failures is not None:
                    self.failures.record(None)
                values.append(float(value))
            healthy = True
            return values
        finally:
            self._release(worker, healthy)

    def _acquire(self) -> _Worker:
        # At most `workers` threads run this, so idle + busy never exceeds `workers`.
        with self._lock:
            worker = self._idle.pop() if self._idle else None
        if worker is not None and not worker.process.is_alive():  # died while idle (e.g. OOM-killed)
            worker.kill()
            worker = None
        if worker is None:
            worker = self._new_worker()
        with self._lock:
            self._busy.add(worker)
        return worker

    def _new_worker(self) -> _Worker:
        return _Worker(self._ctx, self._fn_bytes, f"areal-reward-{self.name}")

    def _release(self, worker: _Worker, healthy: bool) -> None:
        with self._lock:
            self._busy.discard(worker)
            keep = healthy and not self._closed
            if keep:
                self._idle.append(worker)
        if not keep:
            worker.kill()

    def _count(self, counter: str, n: int = 1) -> None:
        with self._lock:
            self._stats = attrs.evolve(self._stats, **{counter: getattr(self._stats, counter) + n})

    def _failed(self, counter: str, reason: str) -> float:
        self._count(counter)
        logger.debug("reward %s scored 0: %s", self.name, reason)
        if self.failures is not None:
            self.failures.record(reason)
        return 0.0

    def close(self) -> None:
        """Wait for running calls, cancel queued ones, and stop every worker process."""
        self._closed = True
        self._threads.shutdown(wait=True, cancel_futures=True)
        with self._lock:
            idle, self._idle = self._idle, []
        for worker in idle:
            worker.stop()

    def __enter__(self) -> RewardRunner:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
