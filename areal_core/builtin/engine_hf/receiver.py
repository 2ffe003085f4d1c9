"""The server's receiving half of weight updates: HF safetensors from disk, or collective buckets.

Collective buckets are staged (:class:`StagedWeights`) and swapped in together by a commit, so a
failure mid-transfer leaves the old weights serving. Everything that touches parameters runs on
the generator's model thread, between decode steps.
"""

from __future__ import annotations

import logging
import os
from pathlib import Path
from typing import Any

import torch

from areal_core.api.wire import ReceiveWeightsBody, WeightGroupBody
from areal_core.api.scheduler import NODE_HOST_ENV
from areal_core.api.lora import adapter_parameters, has_adapter
from areal_core.api.weight_channel import StagedDigest, bucket_nbytes, receive_bucket, tensor_digest, unflatten_bucket

log = logging.getLogger(__name__)


def read_safetensors_dir(directory: Path) -> dict[str, torch.Tensor]:
    from safetensors.torch import load_file

    files = sorted(directory.glob("*.safetensors"))
    if not files:
        raise ValueError(f"no *.safetensors files in {str(directory)!r}; save the model with save_pretrained")
    state: dict[str, torch.Tensor] = {}
    for file in files:
        state.update(load_file(file))
    return state


def _targets(model: Any) -> dict[str, torch.Tensor]:
    """Every parameter (tied ones under each of their names) and buffer, by name; of a LoRA
    (peft) model, the adapter's tensors alone, by the names peft saves them under."""
    if has_adapter(model):
        return dict(adapter_parameters(model))
    targets = dict(model.named_parameters(remove_duplicate=False))
    targets.update(model.named_buffers())
    return targets


def check_names_and_shapes(model: Any, shapes: dict[str, tuple[int, ...]]) -> None:
    """ValueError unless every name is a parameter/buffer of ``model`` with that shape."""
    targets = _targets(model)
    unknown = sorted(set(shapes) - set(targets))
    if unknown:
        raise ValueError(f"{len(unknown)} tensor(s) are not parameters of this model, e.g. {unknown[:3]}")
    for name, shape in shapes.items():
        if tuple(shape) != tuple(targets[name].shape):
            raise ValueError(f"{name}: shape {tuple(shape)} does not match the model's {tuple(targets[name].shape)}")


def copy_into_model(model: Any, tensors: dict[str, torch.Tensor], *, complete: bool) -> None:
    """Copy named tensors into the model's parameters (and buffers), casting dtypes.

    ``complete`` requires every parameter (of a peft model: adapter tensor) to be present; names that are
    not the model's are an error either way. Tied parameters need to appear under one name.
    """
    check_names_and_shapes(model, {name: tuple(t.shape) for name, t in tensors.items()})
    targets = _targets(model)
    if complete:
        loaded = {id(targets[name]) for name in tensors}
        missing = [name for name, p in targets.items() if isinstance(p, torch.nn.Parameter) and id(p) not in loaded]
        if missing:
            raise ValueError(f"{len(missing)} parameter(s) missing from the checkpoint, e.g. {missing[:3]}")
    with torch.no_grad():
        for name, tensor in tensors.items():
            targets[name].copy_(tensor)


def swap_into_model(model: Any, tensors: dict[str, torch.Tensor]) -> None:
    """Point the named parameters/buffers at ``tensors`` (no copy; a cast copy if dtypes differ)."""
    check_names_and_shapes(model, {name: tuple(t.shape) for name, t in tensors.items()})
    targets = _targets(model)
    for name, tensor in tensors.items():
        target = targets[name]
        target.data = tensor if tensor.dtype == target.dtype else tensor.to(target.dtype)


def model_digest(model: Any) -> dict[str, str]:
    """:func:`tensor_digest` of every parameter (tied ones once) and every saved buffer."""
    saved = model.state_dict().keys()
    named = [*model.named_parameters(), *((n, b) for n, b in model.named_buffers() if n in saved)]
    return {name: tensor_digest(value) for name, value in named}


class StagedWeights:
    """Buckets received for one version, held aside until a commit swaps them in.

    The flat receive buffers are recycled, so their memory is touched once and a server holds at
    most two sets: the served one, and the one an update is received into. That second set is the
    copy a rollback of the last commit serves again until the next update starts (the controller
    rolls a commit back before it sends anything else, so the last commit is final by then).
    """

    def __init__(self) -> None:
        self.version: int | None = None
        self.tensors: dict[str, torch.Tensor] = {}
        self.digest = StagedDigest()  # of every staged bucket's bytes, in order (fed by the receive)
        self._flats: list[torch.Tensor] = []  # backing the staged tensors
        self._served: list[torch.Tensor] = []  # backing (some of) the served parameters
        self._kept: list[torch.Tensor] = []  # backing only what the last commit replaced
        self._spare: list[torch.Tensor] = []  # free for the next buckets
        self._previous: dict[str, torch.Tensor] = {}  # what the last commit replaced (for a rollback)

    def buffer(self, version: int, nbytes: int) -> torch.Tensor:
        """A uint8 buffer of ``nbytes`` to receive a bucket of ``version`` into."""
        if version != self.version:  # a new update: leftovers of a failed one are dropped, never committed
            self.clear()
            self.forget_rollback()
            self.version = version
        for i, flat in enumerate(self._spare):
            if flat.numel() == nbytes:
                return self._spare.pop(i)
        return torch.empty(nbytes, dtype=torch.uint8)

    def add(self, version: int, tensors: dict[str, torch.Tensor], flat: torch.Tensor) -> None:
        """Stage ``tensors`` (views of ``flat``, from :meth:`buffer` for ``version``, its bytes
        already in :attr:`digest`)."""
        if version != self.version:
            raise ValueError(f"a bucket of version {version} arrived while version {self.version} is staged")
        self.tensors.update(tensors)
        self._flats.append(flat)

    def commit(self, model: Any, version: int) -> tuple[int, str]:
        """Swap every tensor staged for ``version`` into ``model`` (call on the model thread);
        returns how many, and the digest of the bytes received for them (equal on every server
        that received the same update). The replaced tensors are kept for :meth:`rollback`."""
        if self.version != version or not self.tensors:
            staged = "nothing" if not self.tensors else f"version {self.version}"
            raise ValueError(f"cannot commit version {version}: {staged} is staged; receive its buckets first")
        targets = _targets(model)
        self._previous = {name: targets[name].data for name in self.tensors}
        swap_into_model(model, self.tensors)
        served = _storages(_targets(model).values())
        kept = _storages(self._previous.values()) - served
        old = self._served + self._kept + self._flats
        self._served = [f for f in old if _storage(f) in served]
        self._kept = [f for f in old if _storage(f) in kept]
        self._spare = [f for f in old if _storage(f) not in served | kept]  # spares this update left: not needed
        count, digest = len(self.tensors), self.digest.hexdigest()
        self.version, self.tensors, self._flats, self.digest = None, {}, [], StagedDigest()
        return count, digest

    def rollback(self, model: Any) -> int:
        """Serve again what the last commit replaced; returns how many tensors."""
        if not self._previous:
            raise ValueError("nothing to roll back: no commit since the last rollback")
        previous, self._previous = self._previous, {}
        swap_into_model(model, previous)
        served = _storages(_targets(model).values())
        old = self._served + self._kept
        self._served = [f for f in old if _storage(f) in served]
        self._spare += [f for f in old if _storage(f) not in served]
        self._kept = []
        return len(previous)

    def forget_rollback(self) -> None:
        """The last commit is final (a new update started, or a disk load changed the served
        weights): what it replaced is released, its buffers recycled."""
        self._previous = {}
        self._spare += self._kept
        self._kept = []

    def clear(self) -> None:
        """Drop what is staged (never committed); its buffers are recycled."""
        self._spare += self._flats
        self.version, self.tensors, self._flats, self.digest = None, {}, [], StagedDigest()


def _storage(tensor: torch.Tensor) -> int:
    return tensor.untyped_storage().data_ptr()


def _storages(tensors: Any) -> set[int]:
    return {_storage(t) for t in tensors}


class WeightGroup:
    """This server's membership in the trainer's broadcast group (trainer rank 0 sends).

    The group is gloo, built with torch's public ``ProcessGroupGloo`` over a ``PrefixStore`` of the
    trainer's TCPStore (hosted by trainer rank 0): the hf engine's channel
    (:mod:`areal_core.builtin.engine_hf.channel`) builds the other end the same way.
    """

    def __init__(self, body: WeightGroupBody, timeout_s: float) -> None:
        if body.backend != "gloo":
            raise ValueError(f"backend {body.backend!r} is not supported by the hf server (it runs on CPU); use 'gloo'")
        if not 0 < body.rank_offset < body.world_size:
            raise ValueError(f"rank_offset {body.rank_offset} must be in [1, world_size={body.world_size})")
        self.rank = body.rank_offset
        self.group, self.store = join_gloo_group(  # the group keeps using the store
            body.master_addr, body.master_port, body.group_name, self.rank, body.world_size, timeout_s
        )
        log.info("joined weight group %r as rank %d/%d", body.group_name, self.rank, body.world_size)

    def receive(self, body: ReceiveWeightsBody, staged: StagedWeights) -> None:
        """Receive every bucket of ``body`` broadcast from rank 0, in order, into ``staged``'s
        buffers, and stage it as named tensors (views of the buffers where aligned)."""
        for names, dtypes, shapes in body.buckets():
            flat = staged.buffer(body.version, bucket_nbytes(dtypes, shapes))
            receive_bucket(self.group, flat, dtypes, shapes, staged.digest if body.digest else None)
            staged.add(body.version, dict(zip(names, unflatten_bucket(flat, dtypes, shapes))), flat)

    def close(self) -> None:
        """Leave the group now: peers blocked in a collective with us fail instead of waiting."""
        try:
            self.group.abort()
        except RuntimeError as exc:
            log.warning("aborting weight group: %s", exc)


def join_gloo_group(
    master_addr: str, master_port: int, group_name: str, rank: int, world_size: int, timeout_s: float
) -> tuple[Any, Any]:
    """Join gloo group ``group_name`` as ``rank`` at the TCPStore rank 0 hosts; ``(group, store)``.

    Gloo listens on this node's address (``AREAL_NODE_HOST``, set by the scheduler), else on the
    address the host name resolves to."""
    import datetime

    import torch.distributed as dist

    timeout = datetime.timedelta(seconds=timeout_s)
    store = dist.TCPStore(master_addr, master_port, world_size, is_master=rank == 0, timeout=timeout)
    options = dist.ProcessGroupGloo._Options()
    options._timeout = timeout
    node_host = os.environ.get(NODE_HOST_ENV)
    device = dist.ProcessGroupGloo.create_device(hostname=node_host) if node_host else None
    options._devices = [device or dist.ProcessGroupGloo.create_default_device()]
    return dist.ProcessGroupGloo(dist.PrefixStore(group_name, store), rank, world_size, options), store
