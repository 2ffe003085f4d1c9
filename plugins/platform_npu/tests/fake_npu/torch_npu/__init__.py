"""FAKE torch_npu for CPU tests: what ``import torch_npu`` does that areal's npu platform relies on.

NOT Ascend's torch_npu. Tests put ``tests/fake_npu`` on ``PYTHONPATH`` (or ``sys.path``) to stand in
for it. Importing it, like the real one:

- attaches ``torch.npu`` with the API names of torch_npu's documented ``torch.npu`` module
  (:class:`FakeTorchNpu`: device_count, current_device, set_device, synchronize, empty_cache,
  memory_allocated, max_memory_allocated, memory_reserved, is_available);
- registers the ``hccl`` c10d backend through ``torch.distributed.Backend.register_backend``
  (plain API ``creator(store, rank, size, timeout)``). The fake's creator builds a **gloo** backend,
  so groups really communicate, on CPU tensors.

``FAKE_TORCH_NPU_IMPORT_MARKER=<file>`` makes the import touch that file, so a test can tell
whether some process imported torch_npu. ``FAKE_TORCH_NPU_DEVICES`` is the node's device count
(default 8); ``ASCEND_RT_VISIBLE_DEVICES`` narrows it, as on a real host.
"""

from __future__ import annotations

import os
from pathlib import Path

import torch
import torch.distributed as dist

__version__ = "0.0.0+fake"
FAKE = True


class FakeTorchNpu:
    """FAKE ``torch.npu``: device bookkeeping on the host, same function names as torch_npu's."""

    def __init__(self, node_devices: int, visible: str | None) -> None:
        ids = list(range(node_devices))
        if visible:
            ids = [int(i) for i in visible.split(",") if i.strip()]
        self.visible_ids = ids  # physical ids behind logical indices 0..n-1
        self._current = 0
        self._allocated = [0] * len(ids)
        self._peak = [0] * len(ids)
        self.calls: list[tuple[str, tuple]] = []

    def is_available(self) -> bool:
        return bool(self.visible_ids)

    def device_count(self) -> int:
        return len(self.visible_ids)

    def current_device(self) -> int:
        return self._current

    def set_device(self, device: int) -> None:
        if not 0 <= int(device) < len(self.visible_ids):
            raise RuntimeError(f"Invalid device id {device} (FAKE torch.npu: {len(self.visible_ids)} visible)")
        self._current = int(device)
        self.calls.append(("set_device", (int(device),)))

    def synchronize(self, device: int | None = None) -> None:
        self.calls.append(("synchronize", (device,)))

    def empty_cache(self) -> None:
        self.calls.append(("empty_cache", ()))

    def memory_allocated(self, device: int | None = None) -> int:
        return self._allocated[self._current if device is None else device]

    def max_memory_allocated(self, device: int | None = None) -> int:
        return self._peak[self._current if device is None else device]

    def memory_reserved(self, device: int | None = None) -> int:
        return self._peak[self._current if device is None else device]

    def fake_allocate(self, nbytes: int) -> None:
        """FAKE-only helper (no torch_npu counterpart): account ``nbytes`` on the current device."""
        self._allocated[self._current] += nbytes
        self._peak[self._current] = max(self._peak[self._current], self._allocated[self._current])


def _fake_hccl_creator(store, rank, size, timeout):
    return dist.ProcessGroupGloo(store, rank, size, timeout)


def _install() -> None:
    marker = os.environ.get("FAKE_TORCH_NPU_IMPORT_MARKER")
    if marker:
        Path(marker).write_text(f"imported by pid {os.getpid()}\n")
    torch.npu = FakeTorchNpu(int(os.environ.get("FAKE_TORCH_NPU_DEVICES", "8")), os.environ.get("ASCEND_RT_VISIBLE_DEVICES"))
    if "HCCL" not in dist.Backend._plugins:
        dist.Backend.register_backend("hccl", _fake_hccl_creator, devices=["cpu"])


_install()
