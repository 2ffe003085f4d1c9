"""WeightUpdater: the trainer-side half of a weight path (disk, xccl, ...)."""

from __future__ import annotations

import abc
from typing import TYPE_CHECKING, ClassVar

import attrs

if TYPE_CHECKING:
    from areal_core.config import Config
    from areal_core.engine import InferenceEngine
    from areal_core.platform import Platform
    from areal_core.train.controller import TrainController


@attrs.frozen(kw_only=True)
class WeightUpdateMeta:
    """What the receiving side needs to know about one update (or one bucket of it)."""

    version: int
    path: str | None = None  # disk: the directory to load
    group_name: str = "areal_weights"
    master_addr: str = "127.0.0.1"
    master_port: int = 0
    world_size: int = 0
    backend: str = "gloo"
    names: tuple[str, ...] = ()
    dtypes: tuple[str, ...] = ()
    shapes: tuple[tuple[int, ...], ...] = ()


class WeightUpdater(abc.ABC):
    """Moves the trainer's current parameters to every inference server, then bumps versions."""

    name: ClassVar[str] = ""

    def __init__(self, config: Config, platform: Platform) -> None:
        self.config = config
        self.platform = platform

    @abc.abstractmethod
    def connect(self, trainer: TrainController, engine: InferenceEngine) -> None:
        """Set up the path once, before the first update (groups, directories)."""

    @abc.abstractmethod
    def update(self, version: int) -> None:
        """Publish the trainer's weights as ``version``; return once every server serves them."""

    def close(self) -> None:
        """Tear down groups or temporary files."""
