"""The trainer half of SGLang's weight protocol (areal_engine_sglang.channel) against SGLang's own code.

The receivers are separate processes running ``sglang_weight_group.py``: SGLang 0.5.23's
``init_custom_process_group`` and ``FlattenedTensorBucket`` where ``sglang`` imports in
``$AREAL_SGLANG_PYTHON`` (default: this Python). ``pip install --no-deps sglang==0.5.23
triton==3.9.0`` into a venv made with ``--system-site-packages`` is enough for that import on CPU.
"""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from areal_core.api.scheduler import free_port
from areal_core.api.weight_channel import Bucket, flatten_bucket
from areal_engine_sglang.channel import _check_aligned, join_group, leave_group

SGLANG_PYTHON = os.environ.get("AREAL_SGLANG_PYTHON") or sys.executable
RECEIVER = Path(__file__).resolve().parent / "sglang_weight_group.py"


def _digest(tensor: torch.Tensor) -> str:
    return hashlib.sha256(tensor.contiguous().view(-1).view(torch.uint8).numpy().tobytes()).hexdigest()


@pytest.mark.slow
def test_trainer_join_meets_sglangs_init_custom_process_group_and_broadcasts_flat_buckets() -> None:
    torch.manual_seed(0)
    buckets = [
        # byte offsets 0, 120, 128: each a multiple of its dtype's size, as SGLang requires
        {"embed.weight": torch.randn(6, 5), "step": torch.tensor([3]), "norm.weight": torch.randn(5).bfloat16()},
        {"head.weight": torch.randn(3, 4).bfloat16()},
    ]
    described = [
        [list(b), [str(t.dtype).removeprefix("torch.") for t in b.values()], [list(t.shape) for t in b.values()]]
        for b in buckets
    ]
    port, world_size, group_name = free_port(), 3, "areal_weights_1"
    receivers = [
        subprocess.Popen(
            [SGLANG_PYTHON, str(RECEIVER), str(port), str(rank), str(world_size), group_name, json.dumps(described)],
            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        )  # fmt: skip
        for rank in (1, 2)
    ]
    try:
        sources = [r.stdout.readline().strip() for r in receivers]  # printed before they join
        if not all(s.startswith("SOURCE sglang") for s in sources):
            pytest.skip(
                f"sglang's init_custom_process_group does not import in {SGLANG_PYTHON} ({sources[0] or 'no output'}); "
                "set AREAL_SGLANG_PYTHON to a Python with `pip install --no-deps sglang==0.5.23 triton==3.9.0`"
            )
        group = join_group(
            backend="gloo", master_addr="127.0.0.1", master_port=port, group_name=group_name,
            rank=0, world_size=world_size, timeout_s=120,
        )  # fmt: skip
        try:
            for bucket in buckets:
                group.broadcast(flatten_bucket(list(bucket.values())), 0).wait()
        finally:
            leave_group(group)
        outputs = [r.communicate(timeout=120) for r in receivers]
    finally:
        for r in receivers:
            r.kill()
    expected = [{name: _digest(t) for name, t in b.items()} for b in buckets]
    for (out, err), r in zip(outputs, receivers):
        assert r.returncode == 0, err[-2000:]
        assert [json.loads(line) for line in out.splitlines()] == expected


def test_unaligned_flat_buckets_are_refused_before_anything_is_sent() -> None:
    aligned = Bucket(names=["a", "b"], dtypes=["float32", "bfloat16"], shapes=[[3], [2]])
    _check_aligned([aligned])  # 12 bytes, then bf16 at 12
    unaligned = Bucket(names=["a", "b"], dtypes=["bfloat16", "float32"], shapes=[[3], [2]])
    with pytest.raises(ValueError, match=r"'b' \(float32\) would start at byte 6 of its bucket, not a multiple of 4"):
        _check_aligned([unaligned])
