"""Staleness control: how many episodes may start now, and which finished ones a batch may take.

Counted in episodes (one prompt group). With trainer version ``v``, batch size ``B`` and bound
``eta = max_head_offpolicyness``, new episodes may start while
``accepted + running < (eta + v + 1) * B`` (``accepted`` is cumulative, consumed ones included)
and ``running < max_concurrent``. An episode started at version ``s`` must be consumed by a batch
taken at version ``<= s + eta`` (its *deadline*). :meth:`StalenessManager.select` takes finished
episodes earliest-deadline first and waits (returns ``None``) while a still-running episode could
otherwise miss its deadline, so with one batch per version no consumed episode lags by more than
``eta`` (``eta = 0`` is synchronous training). Episodes that started at the same version share a
deadline, so a selection is a count per start version; which of them a batch takes is the
caller's choice (the rollout runner takes them in the order they finished).
"""

from __future__ import annotations

import collections

import attrs

from areal_core.config import RolloutConfig


@attrs.frozen
class Ticket:
    """One started episode: ``serial`` is unique per manager, ``version`` the trainer's at start."""

    serial: int
    version: int


class StalenessManager:
    """Single-threaded bookkeeping; the rollout runner serialises calls under its lock.

    Ready episodes are kept as counts per start version: :meth:`select` and :meth:`consume` cost
    one step per version, not per episode, under the runner's lock, which the rollout loop waits
    on (a batch takes thousands of episodes).
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
        return self.accepted - self.consumed

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
        del self._running[ticket.serial]
        _decrement(self._running_by_version, ticket.version)
        self._ready_by_version[ticket.version] += 1
        self.accepted += 1

    def reject(self, ticket: Ticket) -> None:
        """A rejected or failed episode: it frees its slot and is never consumed."""
        del self._running[ticket.serial]
        _decrement(self._running_by_version, ticket.version)
        self.rejected += 1

    def select(self, n: int) -> dict[int, int] | None:
        """How many ready episodes of each start version (oldest first) a batch of ``n`` at the
        current version should take, or None to wait.

        Takes earliest deadlines first, then checks that the episodes left over (running ones
        included, as they may still be accepted) fit the ``B`` slots of each later version up to
        their deadlines; a deadline that no running episode shares cannot improve by waiting.
        """
        if self.ready < n:
            return None
        taken: dict[int, int] = {}
        left, to_take = self._ready_by_version.copy(), n
        for version in sorted(left):
            if not to_take:
                break
            taken[version] = min(to_take, left[version])
            left[version] -= taken[version]
            to_take -= taken[version]
        if self._running_by_version and not self._leftovers_fit(left):
            return None
        return taken

    def _leftovers_fit(self, left: collections.Counter[int]) -> bool:
        """Whether the ready episodes ``left`` over by a batch, and the running ones, fit the ``B``
        slots of each later version up to their deadlines, where waiting could help: counted per
        start version, the k-th earliest deadline needs k slots."""
        earliest_running = min(self._running_by_version)
        waiting, count = left + self._running_by_version, 0
        for version in sorted(waiting):
            count += waiting[version]
            slots = (version + self.max_head_offpolicyness - self.version) * self.batch_size
            if count > slots and earliest_running <= version:
                return False
        return True

    def consume(self, taken: dict[int, int]) -> None:
        """A batch took ``taken`` (a :meth:`select` result): that many ready episodes per start version."""
        self._ready_by_version -= collections.Counter(taken)  # drops the versions at 0
        self.consumed += sum(taken.values())

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
        self._running_by_version.clear()
        self._ready_by_version.clear()


def _decrement(counts: collections.Counter[int], key: int) -> None:
    counts[key] -= 1
    if not counts[key]:
        del counts[key]
