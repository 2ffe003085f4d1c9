"""areal_core.controller_tuning: the controller's interpreter settings hold inside the block only,
and the cyclic GC still collects cycles under them (fewer passes, not none)."""

from __future__ import annotations

import gc
import sys
import weakref

import pytest

from areal_core.controller_tuning import GC_THRESHOLDS, SWITCH_INTERVAL_S, controller_tuning


def test_settings_hold_inside_the_block_and_come_back_after_it() -> None:
    before = (gc.get_threshold(), sys.getswitchinterval())
    with controller_tuning():
        assert gc.get_threshold() == GC_THRESHOLDS
        assert sys.getswitchinterval() == pytest.approx(SWITCH_INTERVAL_S)
    assert (gc.get_threshold(), sys.getswitchinterval()) == before


def test_settings_come_back_when_the_block_raises() -> None:
    before = (gc.get_threshold(), sys.getswitchinterval())
    with pytest.raises(KeyError), controller_tuning():
        raise KeyError("run failed")
    assert (gc.get_threshold(), sys.getswitchinterval()) == before


class _Node:
    def __init__(self) -> None:
        self.me = self  # a reference cycle: only the cyclic GC frees it


def test_cycles_are_still_collected_without_an_explicit_collect() -> None:
    with controller_tuning():
        gc.collect()  # start from an empty young generation
        first = _Node()
        alive = weakref.ref(first)
        del first
        for _ in range(3 * GC_THRESHOLDS[0]):  # enough allocations for several young collections
            _Node()
        assert alive() is None
