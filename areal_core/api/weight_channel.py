"""The weight channel: how the trainer's full tensors reach the inference servers, in each
engine's own protocol (``actor.weight_update: xccl``).

An engine that supports collective updates implements
:class:`~areal_core.api.engine.SupportsWeightChannel`: in the controller it describes its channel as
a :class:`ChannelSpec`; every training rank builds the :class:`WeightChannel` named there (the
trainer half of the engine's protocol: vLLM's weight-transfer engines, SGLang's group handshake,
the hf engine's own) and rank 0 joins the servers' group and sends. The controller then commits
(``engine.commit_weights``). Pause, commit, versions and retries are the weight updater's.

Also here, for the channels that send flat buckets (hf, SGLang, vLLM's ``areal_gloo``): the bucket
plan, the flat layout (tensors' raw bytes back to back, so one bucket mixes dtypes), the send loop
and a parallel POST to every server. A bucket goes on the wire in one of two forms: packed, one
broadcast of the whole flat bucket (SGLang's ``flattened_bucket``), or in place (our own
protocols; :func:`receive_bucket` is the receiving end): each tensor of at least
:data:`SMALL_TENSOR_BYTES` is broadcast straight from the trainer's memory into its place in the
server's flat buffer, and each run of consecutive smaller ones is copied into a send buffer and
broadcast as one (:func:`wire_runs`): a broadcast's fixed cost is more than copying a small tensor.
"""

from __future__ import annotations

import abc
import hashlib
import importlib
import itertools
import math
from collections.abc import Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Any, Protocol

import attrs
import torch

#: ``(name, dtype, shape)`` of one tensor a channel sends; dtype is a torch name ("bfloat16").
TensorSpec = tuple[str, str, tuple[int, ...]]


@attrs.frozen(kw_only=True)
class ChannelSpec:
    """Everything a training rank needs to open an engine's channel (built by the engine)."""

    channel: str  # "module:Class" of the engine's WeightChannel
    servers: tuple[str, ...]  # server addresses; server i holds ranks 1 + i * ranks_per_server ...
    token: str  # bearer token of the servers' routes
    backend: str  # the collective backend the channel uses (gloo, nccl, hccl, ...)
    master_addr: str  # the rendezvous, hosted by trainer rank 0
    master_port: int
    group_name: str
    bucket_bytes: int
    timeout_s: float
    ranks_per_server: int = 1
    #: Whether the servers load each bucket into the served model as it arrives (SGLang's group
    #: protocol, vLLM's ``nccl``/``hccl``) instead of staging the update until the commit. Such a
    #: server keeps no copy to roll back to: when an update fails once any bucket may have been
    #: loaded, the updater sends the same version again at once on a fresh channel, and if that
    #: fails too, every server of the channel leaves the fleet as lost (and is replaced).
    loads_on_arrival: bool = False
    #: Whether generation holds requests through updates (``rollout.pause_mode: keep``): their KV
    #: cache must stay, so servers that flush caches after loading weights must not.
    holds_requests: bool = False

    @property
    def compares_digests(self) -> bool:
        """Whether the commit compares the servers' digests of what they staged (it needs two):
        where it does not, a server need not digest what it receives."""
        return len(self.servers) > 1

    @property
    def world_size(self) -> int:
        return 1 + len(self.servers) * self.ranks_per_server

    def first_rank(self, server: int) -> int:
        """The group rank of server ``server``'s first worker."""
        return 1 + server * self.ranks_per_server


class TensorSource(Protocol):
    """The trainer's weights: declared up front, then iterated (a collective over trainer ranks)."""

    def specs(self) -> list[TensorSpec]: ...

    def __iter__(self) -> Iterator[tuple[str, torch.Tensor]]: ...


class WeightChannel(abc.ABC):
    """The trainer half of an engine's weight protocol; one instance per training rank.

    Rank 0 is the sender. Every rank calls every method: the others only take part in the
    trainer-side gathers (they iterate the source).
    """

    def __init__(self, spec: ChannelSpec, *, rank: int, device: torch.device) -> None:
        self.spec = spec
        self.rank = rank
        self.device = device

    @property
    def is_sender(self) -> bool:
        return self.rank == 0

    @abc.abstractmethod
    def join(self) -> None:
        """Rank 0 forms the group with every server, driving their join through the engine's
        protocol; returns once all joined (or raises after ``spec.timeout_s``)."""

    @abc.abstractmethod
    def send(self, source: TensorSource, version: int) -> None:
        """Send every tensor of ``source`` as weight ``version``; returns once every server holds
        them (staged, where the engine can stage: the served weights change at the commit)."""

    @abc.abstractmethod
    def leave(self) -> None:
        """Abort the group: peers blocked in it fail now instead of at their timeout."""


def open_channel(spec: ChannelSpec, *, rank: int, device: torch.device) -> WeightChannel:
    """The channel ``spec.channel`` names, built for ``rank`` (not joined yet)."""
    module, _, name = spec.channel.partition(":")
    cls = getattr(importlib.import_module(module), name)
    return cls(spec, rank=rank, device=device)


# --------------------------------------------------------------------------- flat buckets


@attrs.frozen(kw_only=True)
class Bucket:
    """The tensors of one flat broadcast, in order."""

    names: list[str]
    dtypes: list[str]
    shapes: list[list[int]]


def parse_dtype(name: str) -> torch.dtype:
    """``"bfloat16"`` or ``"torch.bfloat16"`` -> ``torch.bfloat16``."""
    dtype = getattr(torch, name.removeprefix("torch."), None)
    if not isinstance(dtype, torch.dtype):
        raise ValueError(f"unknown dtype {name!r}; use a torch dtype name such as 'float32' or 'bfloat16'")
    return dtype


def bucket_nbytes(dtypes: Sequence[str], shapes: Sequence[Sequence[int]]) -> int:
    return sum(math.prod(shape) * parse_dtype(d).itemsize for d, shape in zip(dtypes, shapes))


def plan_buckets(specs: Sequence[TensorSpec], max_bytes: int) -> list[Bucket]:
    """Contiguous runs of ``specs`` of at most ``max_bytes`` bytes each; a tensor larger than
    ``max_bytes`` gets a bucket of its own."""
    if max_bytes < 1:
        raise ValueError(f"max_bytes={max_bytes} must be >= 1")
    runs: list[list[TensorSpec]] = []
    size = 0
    for spec in specs:
        n = bucket_nbytes([spec[1]], [spec[2]])
        if not runs or (runs[-1] and size + n > max_bytes):
            runs.append([])
            size = 0
        runs[-1].append(spec)
        size += n
    return [Bucket(names=[s[0] for s in r], dtypes=[s[1] for s in r], shapes=[list(s[2]) for s in r]) for r in runs]


def flatten_bucket(tensors: Sequence[torch.Tensor]) -> torch.Tensor:
    """One contiguous uint8 tensor holding every tensor's bytes, in order."""
    return torch.cat([as_bytes(t) for t in tensors])


def unflatten_bucket(flat: torch.Tensor, dtypes: Sequence[str], shapes: Sequence[Sequence[int]]) -> list[torch.Tensor]:
    """Tensors read from ``flat`` (the inverse of :func:`flatten_bucket`); aligned ones are views."""
    expected = bucket_nbytes(dtypes, shapes)
    if flat.numel() != expected:
        raise ValueError(f"bucket holds {flat.numel()} bytes but names/dtypes/shapes describe {expected}")
    out, offset = [], 0
    for name, shape in zip(dtypes, shapes):
        dtype = parse_dtype(name)
        n = math.prod(shape) * dtype.itemsize
        part = flat[offset : offset + n]
        if offset % dtype.itemsize:  # ``view`` needs the byte offset aligned to the dtype: copy
            part = part.clone()
        out.append(part.view(dtype).view(tuple(shape)))
        offset += n
    return out


#: In the in-place wire form, tensors smaller than this travel in runs of consecutive ones, one
#: broadcast per run (bench/weight_sync.py, 50 MB: one broadcast per tensor took 0.67-0.73 of the
#: raw broadcast's throughput, one per bucket 0.87-0.98; at 500 MB copying the large ones cost more).
SMALL_TENSOR_BYTES = 2 * 2**20


def wire_runs(sizes: Sequence[int]) -> list[tuple[int, int]]:
    """``[start, stop)`` index ranges of a bucket's tensors (their byte ``sizes``, in order) as the
    in-place wire form sends them: a tensor of :data:`SMALL_TENSOR_BYTES` or more alone, each run of
    consecutive smaller ones together. A range's bytes are contiguous in the flat layout."""
    runs: list[tuple[int, int]] = []
    start = 0
    for small, group in itertools.groupby(sizes, key=lambda size: size < SMALL_TENSOR_BYTES):
        stop = start + len(list(group))
        runs += [(start, stop)] if small else [(i, i + 1) for i in range(start, stop)]
        start = stop
    return runs


def as_bytes(tensor: torch.Tensor) -> torch.Tensor:
    """``tensor``'s bytes as a flat uint8 view (a copy only if it is not contiguous)."""
    return tensor.detach().contiguous().view(-1).view(torch.uint8)


class StagedDigest:
    """The digest of an update's staged bytes, in order (a stream: fed bucket by bucket or tensor
    by tensor, the same bytes give the same digest); servers that received the same update report
    equal digests at the commit. xxh3-128: the check is against transfer faults, not an
    adversary, and it runs at memory speed (sha256 took longer than the wire)."""

    def __init__(self) -> None:
        import xxhash

        self._hash = xxhash.xxh3_128()

    def update(self, received: torch.Tensor) -> None:
        """Add the next received bytes (a bucket, or a tensor of one)."""
        self._hash.update(as_bytes(received.cpu()).numpy())

    def hexdigest(self) -> str:
        return self._hash.hexdigest()


def receive_bucket(
    group: Any, flat: torch.Tensor, dtypes: Sequence[str], shapes: Sequence[Sequence[int]], digest: StagedDigest | None
) -> None:
    """Receive into ``flat`` (uint8, :func:`bucket_nbytes` long) a bucket sent in place from rank 0
    (:class:`BucketBroadcast`, not packed), one broadcast per :func:`wire_runs` range: each lands at
    its place in the flat layout, and goes into ``digest`` (unless None) while the next ones are on
    the wire."""
    sizes = [math.prod(shape) * parse_dtype(dtype).itemsize for dtype, shape in zip(dtypes, shapes)]
    if flat.numel() != sum(sizes):
        raise ValueError(f"receive buffer has {flat.numel()} bytes, the bucket {sum(sizes)}")
    offsets = list(itertools.accumulate(sizes, initial=0))
    received = []
    for start, stop in wire_runs(sizes):
        if offsets[stop] > offsets[start]:
            part = flat[offsets[start] : offsets[stop]]
            received.append((group.broadcast(part, 0), part))
    try:
        for work, part in received:
            work.wait()
            if digest is not None:
                digest.update(part)  # the hash lets go of the GIL: it runs beside the receive
    except BaseException:
        received = work = group = None  # the traceback keeps this frame: let the group go
        raise


class SendBuffers:
    """Two send buffers, used alternately: one is filled while the other is on the wire. They are
    kept across updates, so their memory is touched once (fresh pages cost more than the copy)."""

    def __init__(self, device: torch.device) -> None:
        self.device = device
        self._buffers: list[torch.Tensor] = []

    def pack(self, tensors: Sequence[torch.Tensor], slot: int) -> torch.Tensor:
        """The tensors' bytes, back to back (:func:`flatten_bucket`'s layout), in buffer ``slot``."""
        nbytes = sum(t.numel() * t.element_size() for t in tensors)
        while len(self._buffers) <= slot:
            self._buffers.append(torch.empty(0, dtype=torch.uint8, device=self.device))
        if self._buffers[slot].numel() < nbytes:
            self._buffers[slot] = torch.empty(nbytes, dtype=torch.uint8, device=self.device)
        flat, offset = self._buffers[slot][:nbytes], 0
        for t in tensors:
            n = t.numel() * t.element_size()
            flat[offset : offset + n].copy_(as_bytes(t))
            offset += n
        return flat


class BucketBroadcast:
    """Rank 0's send loop of a flat-bucket broadcast: each bucket's tensors are read from the
    source (checked against what the servers were told) and broadcast while the previous bucket is
    on the wire: ``packed``, copied into a send buffer and sent in one broadcast; otherwise in
    place (:func:`wire_runs`: large tensors from their own memory, runs of small ones through the
    send buffer). ``sending`` tells a failure's cause apart: while a
    bucket is on the wire, a server's refusal (which aborted it) is the cause; while the source is
    read, the source."""

    def __init__(self, device: torch.device, *, packed: bool) -> None:
        self.buffers = SendBuffers(device)
        self.packed = packed
        self.sending = False

    def run(self, group: Any, tensors: Iterator[tuple[str, torch.Tensor]], buckets: Sequence[Bucket]) -> None:
        pending: list[Any] | None = None  # the works of the bucket on the wire
        works: list[Any] | None = None
        sent: list[torch.Tensor] | None = None
        try:
            for index, bucket in enumerate(buckets):
                self.sending = False
                parts = [next(tensors) for _ in bucket.names]
                got = [(name, str(t.dtype).removeprefix("torch."), list(t.shape)) for name, t in parts]
                declared = list(zip(bucket.names, bucket.dtypes, map(list, bucket.shapes)))
                if got != declared:
                    raise ValueError(f"bucket {index}: the source yielded {got[:2]}..., not its declared {declared[:2]}...")
                self.sending = True
                # a send buffer is the one bucket ``index - 2`` used (waited for already)
                if self.packed:
                    sent = [self.buffers.pack([t for _, t in parts], index % 2)]
                else:
                    sent = self._in_place([t for _, t in parts], index % 2)
                works = [group.broadcast(t, 0) for t in sent]
                for work in pending or ():
                    work.wait()
                pending = works
            for work in pending or ():
                work.wait()
        except BaseException:
            # gloo: peers fail once nothing references the group; a Work does, and the traceback keeps this frame
            pending = works = sent = work = group = None
            raise
        self.sending = False
        extra = next(tensors, None)
        if extra is not None:
            raise ValueError(f"the source yielded {extra[0]!r} beyond the tensors it declared")

    def _in_place(self, tensors: list[torch.Tensor], slot: int) -> list[torch.Tensor]:
        """A bucket's in-place wire form: one byte view per :func:`wire_runs` range, a lone tensor's
        own memory, a run of small ones packed into send buffer ``slot``; empty ones left out."""
        sizes = [t.numel() * t.element_size() for t in tensors]
        runs = wire_runs(sizes)
        packed = self.buffers.pack([t for start, stop in runs if stop - start > 1 for t in tensors[start:stop]], slot)
        out, offset = [], 0
        for start, stop in runs:
            if stop - start == 1:
                out.append(as_bytes(tensors[start]))
            else:
                nbytes = sum(sizes[start:stop])
                out.append(packed[offset : offset + nbytes])
                offset += nbytes
        return [t for t in out if t.numel()]


class FlatBucketChannel(WeightChannel):
    """A channel that broadcasts flat uint8 buckets from rank 0 over a process group while asking
    every server to receive each one. Subclasses form the group (``join``) and say how a server
    receives a bucket (``_receive``); the send loop, double buffering and failure handling are here.
    """

    #: The wire form of a bucket (:class:`BucketBroadcast`): the engine's protocol decides.
    packed: bool = True

    def __init__(self, spec: ChannelSpec, *, rank: int, device: torch.device) -> None:
        super().__init__(spec, rank=rank, device=device)
        self.group: Any = None  # a torch ProcessGroup (or backend) with broadcast(tensor, root)
        self._broadcast = BucketBroadcast(self.device, packed=self.packed)

    @abc.abstractmethod
    def _receive(self, buckets: list[Bucket], version: int) -> None:
        """Ask every server to receive ``buckets``, in order (blocks until all hold them)."""

    def send(self, source: TensorSource, version: int) -> None:
        if not self.is_sender:
            for _ in source:  # take part in the gathers
                pass
            return
        if self.group is None:
            raise RuntimeError("send() before join(): the channel has no group")
        buckets = plan_buckets(source.specs(), self.spec.bucket_bytes)
        tensors = iter(source)
        with ThreadPoolExecutor(max_workers=1, thread_name_prefix="weights-receive") as pool:
            receiving = pool.submit(self._receive_all, buckets, version)
            try:
                self._broadcast.run(self.group, tensors, buckets)
            except BaseException as exc:
                self.leave()  # the servers fail now instead of waiting for the rest
                for _ in tensors:  # finish the gathers with the other ranks
                    pass
                server_error = receiving.exception() if self._broadcast.sending else None
                raise (server_error or exc) from None
            receiving.result()

    def _receive_all(self, buckets: list[Bucket], version: int) -> None:
        try:
            self._receive(buckets, version)
        except BaseException:
            self.leave()  # the sender's broadcast fails now too
            raise

    def leave(self) -> None:
        group, self.group = self.group, None
        if group is not None:
            try:
                group.abort()
            except RuntimeError:  # already broken; nothing to release
                pass


def post_all(
    servers: Sequence[str], route: str, bodies: Sequence[dict[str, Any]], token: str, timeout: float, label: str
) -> list[dict[str, Any]]:
    """POST ``bodies[i]`` to ``servers[i]`` in parallel with the bearer token; every reply, or the
    first failure as an ArealError."""
    from areal_core.api.http_json import post_json

    headers = {"Authorization": f"Bearer {token}"}
    if len(servers) == 1:  # no thread to start
        return [post_json(servers[0], route, bodies[0], headers, timeout, label)]
    with ThreadPoolExecutor(max_workers=max(1, len(servers)), thread_name_prefix="weights-post") as pool:
        futures = [pool.submit(post_json, a, route, b, headers, timeout, label) for a, b in zip(servers, bodies)]
        return [f.result() for f in futures]


def tensor_digest(tensor: torch.Tensor) -> str:
    """sha256 of a tensor's dtype, shape and raw bytes: equal digests mean bit-for-bit equal."""
    t = tensor.detach().cpu().contiguous()
    digest = hashlib.sha256(f"{t.dtype}{tuple(t.shape)}".encode())
    digest.update(t.view(-1).view(torch.uint8).numpy().tobytes())
    return digest.hexdigest()
