"""WeightUpdater: the trainer-side half of a weight path (disk, xccl, ...), and the trainer
handle an updater is given."""

from __future__ import annotations

import abc
from typing import TYPE_CHECKING, ClassVar, Protocol, runtime_checkable

from areal_core.api.errors import ArealError

if TYPE_CHECKING:
    from areal_core.config import Config
    from areal_core.api.engine import InferenceEngine
    from areal_core.api.platform import Platform
    from areal_core.api.weight_channel import ChannelSpec


class WeightUpdateError(ArealError):
    """A weight update was aborted before every server served it; the servers still serve the
    previous weights and version (the trainer loop goes on and publishes the next version)."""


class TrainerHandle(Protocol):
    """What a weight updater may ask of the training workers (all ranks act together)."""

    #: The address of trainer rank 0's node, where the weight channel's rendezvous is hosted.
    rendezvous_host: str

    def save_hf(self, path: str) -> None:
        """Write a Hugging Face model directory (weights, config, tokenizer) at ``path``."""
        ...

    def open_weight_channel(self, spec: ChannelSpec) -> None:
        """Open an engine's weight channel on every rank; rank 0 joins the servers' group."""
        ...

    def send_weights(self, version: int) -> None:
        """Send the current weights through the open channel as ``version``."""
        ...

    def close_weight_channel(self) -> None:
        """Leave the weight channel (peers blocked in it fail now)."""
        ...


class WeightUpdater(abc.ABC):
    """Moves the trainer's current parameters to every inference server, then bumps versions."""

    name: ClassVar[str] = ""

    def __init__(self, config: Config, platform: Platform) -> None:
        self.config = config
        self.platform = platform

    @abc.abstractmethod
    def connect(self, trainer: TrainerHandle, engine: InferenceEngine) -> None:
        """Set up the path once, before the first update (groups, directories)."""

    @abc.abstractmethod
    def update(self, version: int) -> None:
        """Publish the trainer's weights as ``version``; return once every server serves them."""

    def close(self) -> None:
        """Tear down groups or temporary files."""


@runtime_checkable
class SupportsStaging(Protocol):
    """A weight updater that can do the part of an update the servers take no part in before
    generation pauses (``disk``: write and flush the files), so the pause covers only the rest."""

    def stage(self, version: int) -> None:
        """Prepare ``version`` while the servers go on generating; the next ``update(version)``
        uses it. Another ``update`` first (a re-publish, a retry) prepares its version itself."""
        ...
