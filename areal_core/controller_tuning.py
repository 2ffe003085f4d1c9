"""Interpreter settings of the controller process while a run drives its planes, restored after.

- **GIL switch interval** 0.5 ms (Python's default: 5 ms). The main thread waits on trainer
  replies and servers while the rollout loop's thread runs Python; after each wait it gets the
  GIL back sooner (bench/vs_trl.py: about 7% shorter steps).
- **The cyclic GC runs on a clock, not on allocation counts.** Python starts a young collection
  when allocations minus deallocations pass a threshold. In the controller most objects die old
  (an episode lives for seconds), and their deallocations hold that count down while the young
  generation grows: at 8,192 episodes in flight a young collection found about 600,000 objects
  and stopped the rollout loop for about 0.5 s, every few seconds (bench/controller_scale.py).
  So the automatic GC is off, and a thread collects the young generations every
  ``YOUNG_GC_PERIOD_S``, sooner after one that took long (:func:`young_gc_period`); what survives
  goes to the old generation. It collects the whole heap when the trainer has paused generation
  for a weight update (:func:`collect_all_soon`), at most every ``FULL_GC_MIN_INTERVAL_S``.
  Reference counting still frees everything not in a cycle at once.
- **A taken batch is freed while a weight update runs, one trajectory at a time.** The trainer
  hands it to :func:`collect_all_soon` with generation paused; the clock's thread frees it
  (:func:`free_in_turns`) before anything else, while the update waits on workers and servers.
  Generation resumes only when the freeing and the full collection are done: run with requests
  going, they shared the core with the rollout loop (the full one holds the GIL throughout, 0.65 s
  at 8,192 episodes) and delayed its requests by up to as long.
"""

from __future__ import annotations

import contextlib
import gc
import sys
import threading
import time
from collections.abc import Iterator
from typing import Any

SWITCH_INTERVAL_S = 0.0005
YOUNG_GC_PERIOD_S = 0.01
YOUNG_GC_PAUSE_S = 0.001  # a young collection that took longer brings the next one forward
YOUNG_GC_MIN_PERIOD_S = 0.001
FULL_GC_MIN_INTERVAL_S = 60.0

_clock: _GcClock | None = None


class _GcClock:
    """A daemon thread: young collections on a period; when asked, the lists handed over freed in
    turns, then a full collection (not more often than ``full_min_interval_s``)."""

    def __init__(self, young_period_s: float, full_min_interval_s: float) -> None:
        self.young_period_s, self.full_min_interval_s = young_period_s, full_min_interval_s
        self._wake, self._stop = threading.Event(), threading.Event()
        self._lock = threading.Lock()  # over the three below
        self._garbage: list[tuple[list[Any], threading.Event]] = []  # lists to free, each with its event
        self._full_due = False
        self._closed = False  # the thread has ended: nothing handed over any more is waited for
        self._last_full = -float("inf")
        self._thread = threading.Thread(target=self._run, name="gc-clock", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        self._wake.set()
        self._thread.join()

    def collect_all_soon(self, garbage: list[Any]) -> threading.Event:
        done = threading.Event()
        with self._lock:
            if self._closed:
                done.set()
            else:
                self._garbage.append((garbage, done))
                self._full_due |= time.monotonic() - self._last_full >= self.full_min_interval_s
        self._wake.set()
        return done

    def _run(self) -> None:
        try:
            period = self.young_period_s
            while not self._stop.is_set():
                self._wake.wait(period)
                self._wake.clear()
                with self._lock:
                    handed, self._garbage = self._garbage, []
                    full, self._full_due = self._full_due, False
                for garbage, _ in handed:  # first: the full collection then has less to walk
                    free_in_turns(garbage)
                if full:
                    self._last_full = time.monotonic()
                    gc.collect()
                else:
                    began = time.perf_counter()
                    gc.collect(1)  # generations 0 and 1: their survivors move to the old generation
                    period = young_gc_period(time.perf_counter() - began, self.young_period_s)
                for _, done in handed:
                    done.set()
        finally:  # stopped (or failed): nobody waits for work that will not be done
            with self._lock:
                self._closed = True
                handed, self._garbage = self._garbage, []
            for _, done in handed:
                done.set()


def young_gc_period(took_s: float, period_s: float = YOUNG_GC_PERIOD_S) -> float:
    """Seconds to the next young collection after one that took ``took_s``: ``period_s``, or
    shorter in proportion where it took longer than ``YOUNG_GC_PAUSE_S`` (down to
    ``YOUNG_GC_MIN_PERIOD_S``), so each stays about that short: right after an abort pause's
    ``resume`` re-sends thousands of requests, 10 ms of new objects took 7 to 13 ms to collect
    (docs/scale-out.md)."""
    return min(period_s, max(YOUNG_GC_MIN_PERIOD_S, period_s * YOUNG_GC_PAUSE_S / max(took_s, 1e-9)))


def collect_all_soon(garbage: list[Any] | None = None) -> threading.Event:
    """A weight update has paused generation: on the clock's thread, empty ``garbage`` (the
    taken batch, no longer used) with :func:`free_in_turns`, then collect the whole heap if the
    last full collection is ``FULL_GC_MIN_INTERVAL_S`` old. Returns an event set once both are
    done: wait for it before generation resumes, so that neither shares the core with running
    requests. Outside :func:`controller_tuning`, Python's own GC runs, ``garbage`` is emptied
    here and the event is set."""
    garbage = [] if garbage is None else garbage
    if _clock is not None:
        return _clock.collect_all_soon(garbage)
    free_in_turns(garbage)
    done = threading.Event()
    done.set()
    return done


def free_in_turns(items: list[Any]) -> None:
    """Empty ``items`` one element at a time, from the end.

    Dropping the last reference to a batch of thousands of trajectories frees every list and
    number in them inside one C call, which holds the GIL throughout (0.23 s at 8,192 episodes
    of 4 x 260 tokens, ``bench/batch_free.py``) while the rollout loop's thread waits for it.
    Freed one by one, the loop gets the GIL between them, within a switch interval. Only what
    ``items`` alone holds is freed here."""
    while items:
        items.pop()


@contextlib.contextmanager
def controller_tuning() -> Iterator[None]:
    """Apply the settings above for the ``with`` block; the previous ones come back after it."""
    global _clock
    switch_interval, gc_enabled = sys.getswitchinterval(), gc.isenabled()
    sys.setswitchinterval(SWITCH_INTERVAL_S)
    gc.disable()
    clock = _clock = _GcClock(YOUNG_GC_PERIOD_S, FULL_GC_MIN_INTERVAL_S)
    clock.start()
    try:
        yield
    finally:
        clock.stop()
        _clock = None
        sys.setswitchinterval(switch_interval)
        if gc_enabled:
            gc.enable()
