"""Prompt loader: an endless, epoch-aware iterator over dataset items, seedable and resumable.

Each epoch visits every item exactly once, in an order fixed by ``(seed, epoch)``; items come
out as copies tagged with their epoch (``"_epoch"``). A loader
restored from :meth:`PromptLoader.state_dict` continues with exactly the items it had not yet
handed out.
"""

from __future__ import annotations

import random
from typing import Any, Iterator

import attrs

#: Added to every item handed out: which pass over the data it belongs to (seeds sampling).
EPOCH_KEY = "_epoch"


@attrs.frozen
class LoaderState:
    epoch: int
    index: int  # items of ``epoch`` already handed out
    seed: int


class PromptLoader(Iterator[dict[str, Any]]):
    def __init__(self, items: list[dict[str, Any]], *, shuffle: bool = True, seed: int = 0) -> None:
        if not items:
            raise ValueError("PromptLoader needs at least one dataset item; check the dataset's name/path/size")
        self.items = items
        self.shuffle = shuffle
        self.seed = seed
        self.epoch = 0
        self.index = 0
        self._order = self._epoch_order(0)

    def __len__(self) -> int:
        return len(self.items)

    def _epoch_order(self, epoch: int) -> list[int]:
        order = list(range(len(self.items)))
        if self.shuffle:
            random.Random(f"{self.seed}:{epoch}").shuffle(order)
        return order

    def __next__(self) -> dict[str, Any]:
        if self.index == len(self.items):
            self.epoch += 1
            self.index = 0
            self._order = self._epoch_order(self.epoch)
        item = self.items[self._order[self.index]]
        self.index += 1
        return {**item, EPOCH_KEY: self.epoch}

    def state_dict(self) -> dict[str, int]:
        return attrs.asdict(LoaderState(self.epoch, self.index, self.seed))

    def load_state_dict(self, state: dict[str, int]) -> None:
        loaded = LoaderState(**state)
        if loaded.index > len(self.items):
            raise ValueError(f"loader state index={loaded.index} exceeds the dataset's {len(self.items)} items")
        self.seed, self.epoch, self.index = loaded.seed, loaded.epoch, loaded.index
        self._order = self._epoch_order(self.epoch)
