"""Staleness control: how many episodes may start now, and which finished ones a batch may take.

Counted in episodes (one prompt group). With trainer version ``v``, batch size ``B`` and bound
``eta = max_head_offpolicyness``, new episodes may start while
``accepted + running < (eta + v + 1) * B`` (``accepted`` is cumulative, consumed ones included)
and ``running < max_concurrent``. An episode started at version ``s`` must be consumed by a batch
taken at version ``<= s + eta`` (its *deadline*). :meth:`StalenessManager.select` takes finished
episodes earliest-deadline first and waits (returns ``None``) while a still-running episode could
otherwise miss its deadline, so with one batch per version no consumed episode lags by more than
``eta`` (``eta = 0`` is synchronous training).
"""

from __future__ import annotations

import collections
import operator

import attrs

from areal_core.config import RolloutConfig


_VERSION = operator.attrgetter("version")


@attrs.frozen
class Ticket:
    """One started episode: ``serial`` is unique per manager, ``version`` the trainer's at start."""

    serial: int
    version: int


class StalenessManager:
    """Single-threaded bookkeeping; the rollout runner serialises calls under its lock.

    Tickets are numbered in start order and the version never goes back, so serial order is
    deadline order, and :meth:`select` decides from counts of episodes per start version (kept as
    they change) instead of sorting thousands of tickets under the runner's lock at every wake-up.
    """

    def __init__(
        self,
        *,
        batch_size: int,
        max_head_offpolicyness: int,
        max_concurrent: int,
        version: int = 0,
        consumed: int | None = None,
    ) -> None:
        if batch_size < 1 or max_concurrent < 1 or max_head_offpolicyness < 0 or version < 0:
            raise ValueError(
                f"need batch_size>=1, max_concurrent>=1, max_head_offpolicyness>=0, version>=0; got "
                f"{batch_size}, {max_concurrent}, {max_head_offpolicyness}, {version}"
            )
        self.batch_size = batch_size
        self.max_head_offpolicyness = max_head_offpolicyness
        self.max_concurrent = max_concurrent
        self.version = version
        self.consumed = version * batch_size if consumed is None else consumed
        self.accepted = self.consumed  # cumulative: consumed + ready
        self.submitted = 0
        self.rejected = 0
        self._serial = 0
        self._running: dict[int, Ticket] = {}
        self._ready: dict[int, Ticket] = {}
        self._running_by_version: collections.Counter[int] = collections.Counter()
        self._ready_by_version: collections.Counter[int] = collections.Counter()

    @classmethod
    def from_config(cls, rollout: RolloutConfig, batch_size: int, version: int = 0) -> StalenessManager:
        return cls(
            batch_size=batch_size,
            max_head_offpolicyness=rollout.max_head_offpolicyness,
            max_concurrent=rollout.max_concurrent_rollouts,
            version=version,
        )

    @property
    def running(self) -> int:
        return len(self._running)

    @property
    def ready(self) -> int:
        """Accepted episodes not yet consumed by a batch."""
        return len(self._ready)

    def window(self) -> int:
        """Episodes not yet consumed that the current version admits (ready and running included)."""
        return (self.max_head_offpolicyness + self.version + 1) * self.batch_size - self.consumed

    def capacity(self) -> int:
        """How many more episodes may start now."""
        return min(self.max_concurrent - self.running, self.window() - (self.ready + self.running))

    def submit(self) -> Ticket:
        if self.capacity() <= 0:
            raise RuntimeError(f"no rollout capacity at version {self.version}; check capacity() before submit()")
        ticket = Ticket(self._serial, self.version)
        self._serial += 1
        self.submitted += 1
        self._running[ticket.serial] = ticket
        self._running_by_version[ticket.version] += 1
        return ticket

    def accept(self, ticket: Ticket) -> None:
        self._ready[ticket.serial] = self._running.pop(ticket.serial)
        _decrement(self._running_by_version, ticket.version)
        self._ready_by_version[ticket.version] += 1
        self.accepted += 1

    def reject(self, ticket: Ticket) -> None:
        """A rejected or failed episode: it frees its slot and is never consumed."""
        del self._running[ticket.serial]
        _decrement(self._running_by_version, ticket.version)
        self.rejected += 1

    def select(self, n: int) -> list[Ticket] | None:
        """The ``n`` ready episodes a batch at the current version should take, or None to wait.

        Takes earliest deadlines first, then checks that the episodes left over (running ones
        included, as they may still be accepted) fit the ``B`` slots of each later version up to
        their deadlines; a deadline that no running episode shares cannot improve by waiting.
        """
        if len(self._ready) < n:
            return None
        if self._running_by_version and not self._leftovers_fit(n):
            return None
        return [self._ready[serial] for serial in sorted(self._ready)[:n]]

    def _leftovers_fit(self, n: int) -> bool:
        """Whether the episodes a batch of the ``n`` earliest leaves over (running ones included)
        fit the ``B`` slots of each later version up to their deadlines, where waiting could help:
        counted per start version, the k-th earliest deadline needs k slots."""
        left, to_take = self._ready_by_version.copy(), n
        for version in sorted(left):
            taken = min(to_take, left[version])
            left[version] -= taken
            to_take -= taken
        earliest_running = min(self._running_by_version)
        waiting, count = left + self._running_by_version, 0
        for version in sorted(waiting):
            count += waiting[version]
            slots = (version + self.max_head_offpolicyness - self.version) * self.batch_size
            if count > slots and earliest_running <= version:
                return False
        return True

    def consume(self, tickets: list[Ticket]) -> None:
        for ticket in tickets:
            del self._ready[ticket.serial]
        # counted per version at once: thousands of tickets, on the trainer's thread, under the runner's lock
        self._ready_by_version -= collections.Counter(map(_VERSION, tickets))  # drops the versions at 0
        self.consumed += len(tickets)

    def set_version(self, version: int) -> None:
        if version < self.version:
            raise ValueError(f"trainer version went back from {self.version} to {version}")
        self.version = version

    def state_dict(self) -> dict[str, int]:
        """What a checkpoint keeps: in-flight and unconsumed episodes are lost on restart."""
        return {"version": self.version, "consumed": self.consumed}

    def load_state_dict(self, state: dict[str, int]) -> None:
        self.version = int(state["version"])
        self.consumed = self.accepted = int(state["consumed"])
        self._running.clear()
        self._ready.clear()
        self._running_by_version.clear()
        self._ready_by_version.clear()


def _decrement(counts: collections.Counter[int], key: int) -> None:
    counts[key] -= 1
    if not counts[key]:
        del counts[key]
