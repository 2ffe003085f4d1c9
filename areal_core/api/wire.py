"""The wire protocol every HTTP engine shares: the JSON bodies (one attrs class each) between an
engine client and its server, their (de)serialisation, and the load-path check of disk updates."""

from __future__ import annotations

from pathlib import Path
from typing import Any, TypeVar

import attrs

#: The server reads its bearer token from this variable; every endpoint but ``/health`` needs it.
TOKEN_ENV = "AREAL_SERVER_TOKEN"

T = TypeVar("T")


@attrs.frozen(kw_only=True)
class GenerateBody:
    """``POST /generate``: decode up to ``max_new_tokens`` after ``input_ids``."""

    rid: str
    input_ids: list[int]
    max_new_tokens: int
    temperature: float = 1.0
    top_p: float = 1.0
    greedy: bool = False
    stop_token_ids: list[int] = attrs.Factory(list)
    seed: int | None = None  # makes sampling a function of (seed, token position) alone


@attrs.frozen(kw_only=True)
class GenerateResult:
    """Reply to ``/generate``; ``stop_reason`` is "stop", "length" or "abort"."""

    output_ids: list[int]
    logprobs: list[float]
    versions: list[int]
    stop_reason: str


@attrs.frozen(kw_only=True)
class LoadWeightsBody:
    """``POST /load_weights``: load HF safetensors from ``path`` and serve them as ``version``."""

    path: str
    version: int


@attrs.frozen(kw_only=True)
class WeightGroupBody:
    """``POST /init_weight_group``: join the trainer's broadcast group as rank ``rank_offset``."""

    master_addr: str
    master_port: int
    rank_offset: int
    world_size: int
    backend: str
    group_name: str
    timeout_s: float | None = None  # deadline of every collective in the group (None: --group-timeout)


@attrs.frozen(kw_only=True)
class ReceiveWeightsBody:
    """``POST /receive_weights``: receive and stage the flat buckets of ``version``, in order, each
    in the in-place wire form (see :mod:`areal_core.api.weight_channel`)."""

    names: list[str]
    dtypes: list[str]
    shapes: list[list[int]]
    version: int = 0  # a bucket of another version than the staged ones drops them first
    bucket_sizes: list[int] | None = None  # how many of the tensors each bucket holds (None: one bucket)
    #: Whether to digest the staged bytes: the commit compares the digests of the servers, so an
    #: update to one server has nothing to compare (at 500 MB the digest cost 0.05-0.1 of the link).
    digest: bool = True

    def buckets(self) -> list[tuple[list[str], list[str], list[list[int]]]]:
        """``(names, dtypes, shapes)`` of each bucket; ValueError if the lists disagree."""
        if not len(self.names) == len(self.dtypes) == len(self.shapes):
            raise ValueError(f"names/dtypes/shapes lengths differ: {len(self.names)}/{len(self.dtypes)}/{len(self.shapes)}")
        sizes = [len(self.names)] if self.bucket_sizes is None else self.bucket_sizes
        if sum(sizes) != len(self.names) or min(sizes, default=1) < 1:
            raise ValueError(f"bucket_sizes {sizes} must be positive and add up to the {len(self.names)} tensors")
        out, start = [], 0
        for size in sizes:
            end = start + size
            out.append((self.names[start:end], self.dtypes[start:end], self.shapes[start:end]))
            start = end
        return out


@attrs.frozen(kw_only=True)
class VersionBody:
    """``POST /set_version``, and ``POST /commit_weights`` (swap every bucket staged for ``version`` in)."""

    version: int


@attrs.frozen(kw_only=True)
class Health:
    """Reply to ``GET /health``."""

    status: str
    version: int
    paused: bool
    running: int
    queued: int
    served: int


def to_json(body: Any) -> dict[str, Any]:
    return attrs.asdict(body)


def from_json(cls: type[T], data: Any) -> T:
    """Build ``cls`` from decoded JSON; a missing/unknown field raises ValueError naming it."""
    if not isinstance(data, dict):
        raise ValueError(f"{cls.__name__} expects a JSON object, got {type(data).__name__}")
    names = {f.name for f in attrs.fields(cls)}
    unknown = sorted(set(data) - names)
    if unknown:
        raise ValueError(f"{cls.__name__}: unknown field(s) {unknown}; expected {sorted(names)}")
    try:
        return cls(**data)
    except TypeError as exc:
        raise ValueError(f"{cls.__name__}: {exc}") from None


def check_load_path(path: str, allowed_root: Path) -> Path:
    """The resolved directory to load, or ValueError if it is outside ``allowed_root``.

    A component starting with "." (a writer's temporary directory) is refused too, so a
    half-written update can never be loaded.
    """
    root = allowed_root.resolve()
    target = Path(path).resolve()
    if not target.is_relative_to(root):
        raise ValueError(f"refusing to load {path!r}: it is outside the server's --allowed-root {str(root)!r}")
    hidden = [part for part in target.relative_to(root).parts if part.startswith(".")]
    if hidden:
        raise ValueError(f"refusing to load {path!r}: component {hidden[0]!r} starts with '.' (a temporary directory)")
    if not target.is_dir():
        raise ValueError(f"refusing to load {path!r}: not a directory")
    return target
