"""areal_core.controller_tuning: the controller's interpreter settings hold inside the block only,
and the cyclic GC still collects cycles under them (on its clock: young ones by themselves, old
ones when a weight update asks); a batch handed over with a weight update is freed, in turns."""

from __future__ import annotations

import gc
import sys
import time
import weakref

import pytest
from hypothesis import given, strategies as st

from areal_core.controller_tuning import (
    _GcClock,
    SWITCH_INTERVAL_S,
    YOUNG_GC_MIN_PERIOD_S,
    YOUNG_GC_PAUSE_S,
    YOUNG_GC_PERIOD_S,
    collect_all_soon,
    controller_tuning,
    free_in_turns,
    young_gc_period,
)
from areal_core.testing import wait_for


def test_settings_hold_inside_the_block_and_come_back_after_it() -> None:
    before = (gc.isenabled(), sys.getswitchinterval())
    with controller_tuning():
        assert not gc.isenabled()  # the clock collects instead
        assert sys.getswitchinterval() == pytest.approx(SWITCH_INTERVAL_S)
    assert (gc.isenabled(), sys.getswitchinterval()) == before


def test_settings_come_back_when_the_block_raises() -> None:
    before = (gc.isenabled(), sys.getswitchinterval())
    with pytest.raises(KeyError), controller_tuning():
        raise KeyError("run failed")
    assert (gc.isenabled(), sys.getswitchinterval()) == before


class _Node:
    def __init__(self) -> None:
        self.me = self  # a reference cycle: only the cyclic GC frees it


def test_young_cycles_are_collected_without_an_explicit_collect() -> None:
    with controller_tuning():
        alive = weakref.ref(_Node())
        wait_for(lambda: alive() is None, "the clock's young collection to free a cycle", timeout=30)


def test_old_cycles_are_collected_when_a_weight_update_asks() -> None:
    with controller_tuning():
        node = _Node()
        alive = weakref.ref(node)
        wait_for(lambda: gc.is_tracked(node) and _in_old_generation(node), "the clock to promote the node")
        del node
        time.sleep(3 * YOUNG_GC_PERIOD_S)
        assert alive() is not None  # young collections leave the old generation alone
        collect_all_soon()
        wait_for(lambda: alive() is None, "the full collection to free an old cycle", timeout=30)


@given(st.floats(0.0, 10.0))
def test_a_slow_young_collection_brings_the_next_one_forward(took_s: float) -> None:
    period = young_gc_period(took_s)
    assert YOUNG_GC_MIN_PERIOD_S <= period <= YOUNG_GC_PERIOD_S
    assert young_gc_period(2 * took_s) <= period  # the slower, the sooner
    if took_s <= YOUNG_GC_PAUSE_S:
        assert period == YOUNG_GC_PERIOD_S
    elif period > YOUNG_GC_MIN_PERIOD_S:  # in proportion: about YOUNG_GC_PAUSE_S of GC per period
        assert took_s * period / YOUNG_GC_PERIOD_S == pytest.approx(YOUNG_GC_PAUSE_S)


def _in_old_generation(obj: object) -> bool:
    return any(o is obj for o in gc.get_objects(generation=2))


class _Item:
    pass


def test_free_in_turns_frees_what_only_the_list_held_last_first() -> None:
    items = [_Item() for _ in range(5)]
    kept = items[1]
    freed: list[int] = []
    refs = [weakref.ref(item, lambda _, i=i: freed.append(i)) for i, item in enumerate(items)]
    free_in_turns(items)
    assert items == []
    assert freed == [4, 3, 2, 0]
    assert refs[1]() is kept


def test_a_batch_handed_over_with_a_weight_update_is_freed_on_the_clock() -> None:
    with controller_tuning():
        batch = [_Item() for _ in range(3)]
        refs = [weakref.ref(item) for item in batch]
        collect_all_soon(batch)
        wait_for(lambda: all(ref() is None for ref in refs), "the clock's thread to free the batch", timeout=30)
    assert batch == []


def test_without_the_clock_a_handed_over_batch_is_freed_at_once() -> None:
    batch = [_Item()]
    ref = weakref.ref(batch[0])
    collect_all_soon(batch)
    assert batch == [] and ref() is None


def test_the_event_is_set_once_the_batch_is_freed_and_the_full_collection_if_due_has_run() -> None:
    full: list[int] = []

    def on_gc(phase: str, info: dict) -> None:
        if phase == "stop" and info["generation"] == 2:
            full.append(1)

    gc.callbacks.append(on_gc)
    try:
        with controller_tuning():
            for full_collections in (1, 1):  # the first of a run is due, the next a minute later
                batch = [_Item()]
                ref = weakref.ref(batch[0])
                done = collect_all_soon(batch)
                assert done.wait(timeout=30)
                assert ref() is None and len(full) == full_collections
    finally:
        gc.callbacks.remove(on_gc)


def test_a_stopped_clock_has_nobody_wait() -> None:
    clock = _GcClock(YOUNG_GC_PERIOD_S, full_min_interval_s=0.0)  # every request wants a full collection
    clock.start()
    assert clock.collect_all_soon([]).wait(timeout=30)
    clock.stop()
    assert clock.collect_all_soon([]).is_set()
