"""The pieces of a collective weight update that need no server: the in-place wire form of a
flat bucket over a real gloo pair (large tensors alone, runs of small ones together), the
staged-bytes digest, the hf server's staging with its recycled receive buffers, and the in-place
safetensors writer of the disk path."""

from __future__ import annotations

import datetime
import os
import threading
from pathlib import Path

import pytest
import torch
import torch.distributed as dist
from hypothesis import given, settings
from hypothesis import strategies as st
from safetensors import safe_open
from safetensors.torch import load_file

from areal_core.api.scheduler import free_port
from areal_core.api.weight_channel import (
    SMALL_TENSOR_BYTES,
    BucketBroadcast,
    StagedDigest,
    bucket_nbytes,
    flatten_bucket,
    plan_buckets,
    receive_bucket,
    unflatten_bucket,
    wire_runs,
)
from areal_core.builtin.engine_hf.receiver import StagedWeights
from areal_core.train.safetensors_file import write_safetensors

# odd sizes and mixed dtypes: some tensors start at byte offsets their dtype is not aligned to
MIXED = {
    "a": torch.arange(5, dtype=torch.bfloat16),
    "b": torch.randn(3, 7),
    "empty": torch.zeros(0, 4),
    "c": torch.arange(3, dtype=torch.int64) - 1,
    "d": torch.tensor([True, False, True]),
    "e": torch.randn(2, 2, dtype=torch.float16),
}
DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16, "int64": torch.int64}


def _gloo_pair() -> tuple[dist.ProcessGroupGloo, dist.ProcessGroupGloo]:
    port, timeout = free_port(), datetime.timedelta(seconds=30)
    stores = [dist.TCPStore("127.0.0.1", port, 2, is_master=rank == 0, timeout=timeout, wait_for_workers=False) for rank in (0, 1)]
    groups: list = [None, None]

    def join(rank: int) -> None:
        groups[rank] = dist.ProcessGroupGloo(stores[rank], rank, 2, timeout)

    threads = [threading.Thread(target=join, args=(rank,)) for rank in (0, 1)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return groups[0], groups[1]


def test_a_bucket_sent_in_place_lands_in_the_flat_layout_and_digests_as_one() -> None:
    sender, receiver = _gloo_pair()
    specs = [(name, str(t.dtype).removeprefix("torch."), tuple(t.shape)) for name, t in MIXED.items()]
    buckets = plan_buckets(specs, max_bytes=64)  # several buckets, one tensor larger than a bucket
    assert len(buckets) > 2
    thread = threading.Thread(target=BucketBroadcast(torch.device("cpu"), packed=False).run, args=(sender, iter(MIXED.items()), buckets))
    thread.start()
    digest, received = StagedDigest(), {}
    for bucket in buckets:
        flat = torch.full((bucket_nbytes(bucket.dtypes, bucket.shapes),), 255, dtype=torch.uint8)
        receive_bucket(receiver, flat, bucket.dtypes, bucket.shapes, digest)
        assert torch.equal(flat, flatten_bucket([MIXED[n] for n in bucket.names]))
        received.update(zip(bucket.names, unflatten_bucket(flat, bucket.dtypes, bucket.shapes)))
    thread.join(timeout=30)
    assert not thread.is_alive()
    assert all(received[n].dtype == t.dtype and torch.equal(received[n], t) for n, t in MIXED.items())
    whole = StagedDigest()
    whole.update(flatten_bucket(list(MIXED.values())))
    assert digest.hexdigest() == whole.hexdigest()  # tensor by tensor == the same bytes at once


class _CountingGroup:
    """A process group that counts its broadcasts."""

    def __init__(self, group: dist.ProcessGroupGloo) -> None:
        self.group, self.broadcasts = group, 0

    def broadcast(self, tensor: torch.Tensor, root: int):
        self.broadcasts += 1
        return self.group.broadcast(tensor, root)


def test_small_tensors_travel_in_runs_and_large_ones_alone() -> None:
    large = SMALL_TENSOR_BYTES // 4  # float32 elements of a tensor at the threshold
    tensors = {
        "norm1": torch.randn(3), "q": torch.randn(7, 5), "big1": torch.randn(large), "empty": torch.zeros(0),
        "norm2": torch.arange(4, dtype=torch.bfloat16), "big2": torch.randn(large + 1), "k": torch.randn(2, 3),
    }
    sender, receiver = _gloo_pair()
    specs = [(name, str(t.dtype).removeprefix("torch."), tuple(t.shape)) for name, t in tensors.items()]
    (bucket,) = plan_buckets(specs, max_bytes=4 * SMALL_TENSOR_BYTES)
    counting = _CountingGroup(sender)
    thread = threading.Thread(target=BucketBroadcast(torch.device("cpu"), packed=False).run, args=(counting, iter(tensors.items()), [bucket]))
    thread.start()
    flat = torch.full((bucket_nbytes(bucket.dtypes, bucket.shapes),), 255, dtype=torch.uint8)
    receiving = _CountingGroup(receiver)
    receive_bucket(receiving, flat, bucket.dtypes, bucket.shapes, StagedDigest())
    thread.join(timeout=30)
    assert not thread.is_alive()
    assert torch.equal(flat, flatten_bucket(list(tensors.values())))
    # [norm1 q] [big1] [empty norm2] [big2] [k]: five broadcasts on each side, not seven
    assert counting.broadcasts == receiving.broadcasts == 5


@settings(max_examples=200, deadline=None)
@given(st.lists(st.sampled_from([0, 4, 1000, SMALL_TENSOR_BYTES - 1, SMALL_TENSOR_BYTES, 3 * SMALL_TENSOR_BYTES]), max_size=20))
def test_wire_runs_cover_every_tensor_once_large_ones_alone(sizes: list[int]) -> None:
    runs = wire_runs(sizes)
    assert [i for start, stop in runs for i in range(start, stop)] == list(range(len(sizes)))
    for (start, stop), (next_start, next_stop) in zip(runs, runs[1:]):
        both_small = all(n < SMALL_TENSOR_BYTES for n in sizes[start:next_stop])
        assert not both_small  # two neighbouring runs of small tensors would have been one
    for start, stop in runs:
        if stop - start > 1:
            assert all(n < SMALL_TENSOR_BYTES for n in sizes[start:stop])


def test_the_digest_tells_different_bytes_apart() -> None:
    one, other = StagedDigest(), StagedDigest()
    data = torch.randn(1000)
    one.update(data)
    flipped = data.clone()
    flipped.view(torch.uint8)[1234] ^= 1
    other.update(flipped)
    assert one.hexdigest() != other.hexdigest()


class _Model(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.up = torch.nn.Linear(8, 16)
        self.down = torch.nn.Linear(16, 8, bias=False)


def _stage(staged: StagedWeights, version: int, values: dict[str, torch.Tensor]) -> list[int]:
    """Stage ``values`` as ``version`` in two buckets, as a receive would; the buffers' addresses."""
    names = list(values)
    addresses = []
    for part in (names[:1], names[1:]):
        dtypes = [str(values[n].dtype).removeprefix("torch.") for n in part]
        shapes = [list(values[n].shape) for n in part]
        flat = staged.buffer(version, bucket_nbytes(dtypes, shapes))
        flat.copy_(flatten_bucket([values[n] for n in part]))
        staged.digest.update(flat)
        staged.add(version, dict(zip(part, unflatten_bucket(flat, dtypes, shapes))), flat)
        addresses.append(flat.untyped_storage().data_ptr())
    return addresses


def test_staging_recycles_two_buffer_sets_and_keeps_the_last_commit_for_a_rollback() -> None:
    model, staged = _Model(), StagedWeights()
    updates = [{n: torch.randn_like(p) for n, p in model.named_parameters()} for _ in range(5)]
    addresses = []
    for version, values in enumerate(updates[:4], start=1):
        addresses.append(_stage(staged, version, values))
        count, digest = staged.commit(model, version)
        assert count == 3 and len(digest) == 32
        assert all(torch.equal(p, values[n]) for n, p in model.named_parameters())
    assert addresses[2] == addresses[0] and addresses[3] == addresses[1]  # from the third update on
    assert addresses[1] != addresses[0]  # two sets: the served one and the one received into

    assert staged.rollback(model) == 3  # the commit of version 4 undone: version 3 serves again
    assert all(torch.equal(p, updates[2][n]) for n, p in model.named_parameters())
    with pytest.raises(ValueError, match="nothing to roll back"):
        staged.rollback(model)
    after_rollback = _stage(staged, 5, updates[4])
    assert after_rollback == addresses[3]  # the rolled-back set is free again; version 3's still serves
    staged.commit(model, 5)
    assert all(torch.equal(p, updates[4][n]) for n, p in model.named_parameters())


def test_a_new_update_makes_the_last_commit_final() -> None:
    model, staged = _Model(), StagedWeights()
    values = {n: torch.randn_like(p) for n, p in model.named_parameters()}
    _stage(staged, 1, values)
    staged.commit(model, 1)
    staged.buffer(2, 4)  # the next update starts: version 1 cannot be rolled back any more
    with pytest.raises(ValueError, match="nothing to roll back"):
        staged.rollback(model)
    with pytest.raises(ValueError, match="arrived while version 2 is staged"):
        staged.add(3, {}, torch.empty(0, dtype=torch.uint8))


@settings(max_examples=25, deadline=None)
@given(
    parts=st.lists(
        st.tuples(st.sampled_from(sorted(DTYPES)), st.lists(st.integers(0, 5), max_size=3)), min_size=1, max_size=6
    )
)
def test_write_safetensors_reads_back_with_safetensors(tmp_path_factory: pytest.TempPathFactory, parts: list) -> None:
    tensors = {f"t{i}": (torch.randn(shape) * 100).to(DTYPES[dtype]) for i, (dtype, shape) in enumerate(parts)}
    path = tmp_path_factory.mktemp("st") / "model.safetensors"
    write_safetensors(tensors, path, metadata={"format": "pt"})
    back = load_file(path)
    assert back.keys() == tensors.keys()
    assert all(back[n].dtype == t.dtype and torch.equal(back[n], t) for n, t in tensors.items())
    with safe_open(path, "pt") as f:
        assert f.metadata() == {"format": "pt"}


def test_write_safetensors_rewrites_the_same_file_and_shrinks_it(tmp_path: Path) -> None:
    path = tmp_path / "model.safetensors"
    write_safetensors({"w": torch.randn(1000), "b": torch.randn(10)}, path)
    inode = os.stat(path).st_ino
    smaller = {"w": torch.randn(10)}
    write_safetensors(smaller, path)
    assert os.stat(path).st_ino == inode  # rewritten in place, not replaced
    back = load_file(path)
    assert back.keys() == {"w"} and torch.equal(back["w"], smaller["w"])


def test_write_safetensors_refuses_what_the_format_cannot_hold(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match=r"z: dtype torch.complex64 has no safetensors code"):
        write_safetensors({"z": torch.zeros(2, dtype=torch.complex64)}, tmp_path / "x.safetensors")


@pytest.mark.parametrize("servers, digested", [(1, False), (2, True)])
def test_the_hf_channel_asks_for_a_digest_only_where_the_commit_compares_servers(servers: int, digested: bool) -> None:
    from areal_core.api.weight_channel import ChannelSpec
    from areal_core.builtin.engine_hf.channel import HFWeightChannel

    spec = ChannelSpec(
        channel="areal_core.builtin.engine_hf.channel:HFWeightChannel", servers=tuple(f"http://127.0.0.1:{9000 + i}" for i in range(servers)),
        token="t", backend="gloo", master_addr="127.0.0.1", master_port=1, group_name="g", bucket_bytes=64, timeout_s=1.0,
    )  # fmt: skip
    channel = HFWeightChannel(spec, rank=0, device=torch.device("cpu"))
    posted: list[tuple[str, list[dict]]] = []
    channel._post = lambda route, bodies: posted.append((route, bodies))  # type: ignore[method-assign]
    specs = [(name, str(t.dtype).removeprefix("torch."), tuple(t.shape)) for name, t in MIXED.items()]
    channel._receive(plan_buckets(specs, max_bytes=64), version=3)
    ((route, bodies),) = posted
    assert route == "/receive_weights" and len(bodies) == servers
    assert all(body["digest"] is digested and body["version"] == 3 for body in bodies)


def test_a_bucket_received_without_a_digest_still_lands() -> None:
    sender, receiver = _gloo_pair()
    specs = [(name, str(t.dtype).removeprefix("torch."), tuple(t.shape)) for name, t in MIXED.items()]
    (bucket,) = plan_buckets(specs, max_bytes=1 << 20)
    thread = threading.Thread(target=BucketBroadcast(torch.device("cpu"), packed=False).run, args=(sender, iter(MIXED.items()), [bucket]))
    thread.start()
    flat = torch.full((bucket_nbytes(bucket.dtypes, bucket.shapes),), 255, dtype=torch.uint8)
    receive_bucket(receiver, flat, bucket.dtypes, bucket.shapes, None)
    thread.join(timeout=30)
    assert torch.equal(flat, flatten_bucket(list(MIXED.values())))
