"""Failure accounting shared by episodes and reward calls.

A :class:`FailureTracker` counts outcomes three ways: since the last :meth:`~FailureTracker.report`
(one aggregated log line per step instead of one per failure), over the run (the summary), and
over a sliding window of the last ``window`` outcomes, which aborts the run with one line
(:class:`FailureRateError`) once it is full and its failure share exceeds ``max_rate``.
"""

from __future__ import annotations

import collections
import threading

import attrs

from areal_core.api.errors import ArealError

_REASON_CHARS = 160
_REASONS_SHOWN = 3


class FailureRateError(ArealError):
    """Too many episodes or reward calls failed in a row: a bug or a config value, not bad luck."""


@attrs.frozen
class FailureCounts:
    failed: int = 0
    total: int = 0

    @property
    def rate(self) -> float:
        return self.failed / self.total if self.total else 0.0


def short_reason(exc: BaseException) -> str:
    """``Type: first line of the message`` (the type alone when the message is empty)."""
    lines = str(exc).strip().splitlines()
    return f"{type(exc).__name__}: {lines[0]}" if lines else type(exc).__name__


class FailureTracker:
    """Thread-safe; ``what`` names the outcomes ("episodes"), ``key`` the config key of ``max_rate``."""

    def __init__(self, what: str, key: str, *, max_rate: float, window: int) -> None:
        if window < 1 or not 0.0 <= max_rate <= 1.0:
            raise ValueError(f"need window >= 1 and 0 <= max_rate <= 1, got {window}, {max_rate}")
        self.what, self.key, self.max_rate = what, key, max_rate
        self._window: collections.deque[bool] = collections.deque(maxlen=window)
        self._reasons: collections.Counter[str] = collections.Counter()  # since the last report
        self._step = FailureCounts()
        self._run = FailureCounts()
        self._last_reason: str | None = None
        self._lock = threading.Lock()

    def record(self, reason: str | None) -> None:
        """One outcome: ``None`` for a success, else why it failed (see :func:`short_reason`)."""
        failed = reason is not None
        if failed:
            reason = (reason.strip().splitlines() or ["no reason given"])[0][:_REASON_CHARS]
        with self._lock:
            self._window.append(failed)
            self._step = FailureCounts(self._step.failed + failed, self._step.total + 1)
            self._run = FailureCounts(self._run.failed + failed, self._run.total + 1)
            if failed:
                self._reasons[reason] += 1
                self._last_reason = reason

    @property
    def run(self) -> FailureCounts:
        """Counts since the tracker was made."""
        with self._lock:
            return self._run

    def check(self) -> None:
        """Raise :class:`FailureRateError` when the full window fails more often than ``max_rate``."""
        with self._lock:
            window = self._window
            failed = sum(window)
            if len(window) < window.maxlen or failed <= self.max_rate * len(window):
                return
            last = self._last_reason
        raise FailureRateError(
            f"{self.key}: {failed} of the last {len(window)} {self.what} failed, above the limit of "
            f"{self.max_rate:.0%} (last: {last}); fix the cause or raise {self.key}"
        )

    def report(self) -> tuple[FailureCounts, str | None]:
        """Counts since the last report, and one line describing its failures (None if none); resets both."""
        with self._lock:
            counts, reasons = self._step, self._reasons.most_common()
            self._step, self._reasons = FailureCounts(), collections.Counter()
        if not counts.failed:
            return counts, None
        shown = "; ".join(f"{reason} (x{n})" for reason, n in reasons[:_REASONS_SHOWN])
        more = f"; {len(reasons) - _REASONS_SHOWN} more kinds" if len(reasons) > _REASONS_SHOWN else ""
        return counts, f"{counts.failed} of {counts.total} {self.what} failed: {shown}{more}"
