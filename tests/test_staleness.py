"""StalenessManager: capacity formula, deadline-aware batch selection, resume."""

from __future__ import annotations

import collections

import pytest
from hypothesis import settings, strategies as st, target
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, precondition, rule

from areal_core.rollout.staleness import StalenessManager

#: Largest version lag of any consumed episode seen by the state machine, per bound (reported).
OBSERVED_MAX_LAG: dict[int, int] = {}


class TrainerAndRollouts(RuleBasedStateMachine):
    """Random interleavings of rollout events, trainer steps (consume a batch, bump the version) and a crash."""

    @initialize(
        batch_size=st.integers(1, 3),
        eta=st.integers(0, 3),
        max_concurrent=st.integers(1, 8),
        version=st.integers(0, 3),
    )
    def setup(self, batch_size, eta, max_concurrent, version):
        self.m = StalenessManager(
            batch_size=batch_size, max_head_offpolicyness=eta, max_concurrent=max_concurrent, version=version
        )
        self.running: list = []
        self.ready: list = []
        self.crashed = False
        self.max_lag_minus_bound = -eta

    def teardown(self):
        target(float(getattr(self, "max_lag_minus_bound", 0)), label="lag minus bound")

    @precondition(lambda self: self.m.capacity() > 0)
    @rule(k=st.integers(1, 4))
    def submit(self, k):
        for _ in range(min(k, self.m.capacity())):
            self.running.append(self.m.submit())

    @precondition(lambda self: self.running)
    @rule(i=st.one_of(st.just(-1), st.integers(0, 100)), accept=st.sampled_from([True, True, False]))
    def finish(self, i, accept):
        """Finishes the newest episode (-1) or any; favouring the newest leaves long-running old ones."""
        ticket = self.running.pop(i % len(self.running))
        (self.m.accept if accept else self.m.reject)(ticket)
        if accept:
            self.ready.append(ticket)

    @precondition(lambda self: self.m.ready >= self.m.batch_size)
    @rule()
    def train_step(self):
        taken = self.m.select(self.m.batch_size)
        chosen = select_by_sorting(self.m, self.ready, self.running, self.m.batch_size)
        assert taken == (None if chosen is None else dict(collections.Counter(t.version for t in chosen)))
        if chosen is None:
            return
        self.m.consume(taken)
        self.ready = [t for t in self.ready if t not in chosen]
        eta = self.m.max_head_offpolicyness
        for ticket in chosen:
            lag = self.m.version - ticket.version
            OBSERVED_MAX_LAG[eta] = max(OBSERVED_MAX_LAG.get(eta, 0), lag)
            self.max_lag_minus_bound = max(self.max_lag_minus_bound, lag - eta)
            assert lag <= eta, f"episode from version {ticket.version} consumed at {self.m.version}"
        self.m.set_version(self.m.version + 1)

    @precondition(lambda self: not self.crashed)
    @rule()
    def crash_and_resume(self):
        self.crashed = True
        state = self.m.state_dict()
        self.m = StalenessManager(
            batch_size=self.m.batch_size,
            max_head_offpolicyness=self.m.max_head_offpolicyness,
            max_concurrent=self.m.max_concurrent,
        )
        self.m.load_state_dict(state)
        self.running, self.ready = [], []

    @invariant()
    def bounded_by_formula(self):
        m = self.m
        assert m.running <= m.max_concurrent
        assert m.accepted + m.running <= (m.max_head_offpolicyness + m.version + 1) * m.batch_size

    @invariant()
    def never_deadlocks(self):
        if self.m.running:
            return
        if self.m.ready >= self.m.batch_size:
            assert self.m.select(self.m.batch_size) is not None
        else:
            assert self.m.capacity() > 0


def select_by_sorting(m: StalenessManager, ready: list, running: list, n: int) -> list | None:
    """The selection rule read literally, one ticket at a time (what select() counts per start
    version): the n earliest deadlines (then serials); None if the k-th earliest deadline left
    over, running ones included, finds fewer than k batch slots up to it while a running episode
    could still help."""
    if len(ready) < n:
        return None
    deadline = lambda t: t.version + m.max_head_offpolicyness  # noqa: E731
    ordered = sorted(ready, key=lambda t: (deadline(t), t.serial))
    running_deadlines = sorted(map(deadline, running))
    for count, d in enumerate(sorted([*map(deadline, ordered[n:]), *running_deadlines]), start=1):
        if count > (d - m.version) * m.batch_size and running_deadlines[0] <= d:
            return None
    return ordered[:n]


TrainerAndRollouts.TestCase.settings = settings(max_examples=150, stateful_step_count=60, deadline=None)
test_staleness_bound_holds = TrainerAndRollouts.TestCase


def test_report_observed_lag():
    """Runs after the state machine: every bound was reached but never exceeded."""
    print(f"largest observed lag per max_head_offpolicyness: {dict(sorted(OBSERVED_MAX_LAG.items()))}")
    assert OBSERVED_MAX_LAG, "the state machine consumed no batch"
    assert all(lag <= eta for eta, lag in OBSERVED_MAX_LAG.items())


def _manager(**kw) -> StalenessManager:
    args = dict(batch_size=1, max_head_offpolicyness=1, max_concurrent=8)
    return StalenessManager(**(args | kw))


def test_capacity_formula():
    m = _manager(batch_size=4, max_head_offpolicyness=2, max_concurrent=100, version=0)
    assert m.capacity() == 12
    tickets = [m.submit() for _ in range(5)]
    assert m.capacity() == 7
    m.accept(tickets[0])
    m.reject(tickets[1])
    assert m.capacity() == 8  # a rejection frees a slot, an acceptance does not
    assert _manager(batch_size=4, max_head_offpolicyness=2, max_concurrent=3).capacity() == 3


def test_long_running_episode_makes_the_batch_wait():
    """An episode that would miss its deadline is waited for instead of passed over."""
    m = _manager(batch_size=1, max_head_offpolicyness=1)
    slow, fast = m.submit(), m.submit()
    m.accept(fast)
    assert m.select(1) == {0: 1}  # version 0: slow may still be consumed at version 1
    m.consume({0: 1})
    m.set_version(1)
    newer = m.submit()
    m.accept(newer)
    assert m.select(1) is None  # taking `newer` would push `slow` past its deadline
    m.accept(slow)
    assert m.select(1) == {slow.version: 1}  # not `newer`, which started at version 1
    assert m.version - slow.version == 1  # the bound is reached, not exceeded


def test_synchronous_when_bound_is_zero():
    m = _manager(batch_size=2, max_head_offpolicyness=0)
    first = [m.submit(), m.submit()]
    assert m.capacity() == 0
    m.accept(first[0])
    assert m.select(2) is None
    m.reject(first[1])  # a rejection lets exactly one replacement start at the same version
    replacement = m.submit()
    m.accept(replacement)
    assert m.select(2) == {0: 2}


def test_resume_recovers_version_and_capacity():
    m = _manager(batch_size=2, max_head_offpolicyness=1)
    tickets = [m.submit() for _ in range(4)]
    for t in tickets:
        m.accept(t)
    m.consume(m.select(2))
    m.set_version(1)
    restored = _manager(batch_size=2, max_head_offpolicyness=1)
    restored.load_state_dict(m.state_dict())
    assert (restored.version, restored.consumed, restored.accepted) == (1, 2, 2)
    assert restored.capacity() == 4  # (1 + 1 + 1) * 2 - 2
    assert _manager(batch_size=2, version=3).capacity() == 4  # constructor default: consumed = version * B


def test_rejects_going_back_in_version():
    with pytest.raises(ValueError, match="went back"):
        _manager(version=2).set_version(1)
