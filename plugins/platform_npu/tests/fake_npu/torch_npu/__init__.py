"""FAKE torch_npu for CPU tests: what ``import torch_npu`` does that areal's npu platform relies on.

NOT Ascend's torch_npu. Tests put ``tests/fake_npu`` on ``PYTHONPATH`` (or ``sys.path``) to stand in
for it. Importing it makes the same registration calls as torch_npu 2.9-2.13 (read from the
``torch-npu`` wheels: ``torch_npu/__init__.py`` in 2.9, ``torch_npu/_init/registry/`` in 2.13):

- ``torch.utils.rename_privateuse1_backend("npu")``, then
  ``torch._register_device_module("npu", torch_npu.npu)`` and PrivateUse1 hooks (torch_npu's are
  C++; the FAKE's go through ``torch._C._acc.register_python_privateuseone_hook``, so the FAKE
  needs torch >= 2.10: without hooks ``dist.barrier()`` fails once PrivateUse1 is renamed), then
  ``torch.utils.generate_methods_for_privateuse1_backend(for_tensor=True, for_module=True,
  for_storage=True, unsupported_dtype=...)``: ``torch.device("npu", i)``, ``torch.npu``,
  ``torch.get_device_module("npu")`` and ``Tensor.is_npu`` exist as on Ascend. ``torch_npu.npu``
  is :class:`FakeTorchNpu` (device_count, current_device, set_device, synchronize, empty_cache,
  memory_allocated, max_memory_allocated, memory_reserved, is_available, manual_seed_all);
- ``torch.distributed.Backend.register_backend("hccl", creator, extended_api=True, devices=...)``
  with torch_npu's creator signature ``(dist_backend_opts, pg_options)``: torch builds the
  ``_DistributedBackendOptions`` (store, group rank/size, timeout, group id, global ranks), the
  branch a real Ascend host takes.

Differences from the real one (all because this machine has no NPU):

- the creator builds a **gloo** backend (``ProcessGroupGloo(opts.store, rank, size, timeout)``),
  not ``ProcessGroupHCCL``, so the groups really communicate, on host tensors;
- ``devices=["npu", "cpu"]`` instead of ``["npu"]``: no tensor can live on the fake ``npu`` device
  (it has no kernels), so collectives run on CPU tensors and need ``hccl`` to serve ``cpu`` too.
  ``Backend.default_device_backend_map["cpu"]`` stays ``gloo`` (torch keeps the first claim), as on
  Ascend; only a group created with ``backend="hccl"`` routes CPU tensors to the fake creator;
- no PrivateUse1 kernels, allocator or device guard: ``tensor.npu()`` and allocations on
  ``torch.device("npu")`` fail, so models train on CPU tensors (an FSDP2 mesh of device type
  ``cpu`` over the ``hccl`` group, where Ascend's mesh is ``npu``).

FAKE-only (no torch_npu counterpart): ``CREATED`` lists what each creator call received, so a
test can check the extended-API path ran; ``FAKE_TORCH_NPU_IMPORT_MARKER=<file>`` makes the import
touch that file, so a test can tell whether some process imported torch_npu.
``FAKE_TORCH_NPU_DEVICES`` is the node's device count (default 8); ``ASCEND_RT_VISIBLE_DEVICES``
narrows it, as on a real host.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist

__version__ = "0.0.0+fake"
FAKE = True
#: FAKE-only: one entry per hccl backend built, what torch passed to the creator.
CREATED: list[dict[str, Any]] = []


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

    def set_device(self, device: int | torch.device) -> None:
        index = device.index if isinstance(device, torch.device) else int(device)
        if index is None or not 0 <= index < len(self.visible_ids):
            raise RuntimeError(f"Invalid device id {device} (FAKE torch.npu: {len(self.visible_ids)} visible)")
        self._current = index
        self.calls.append(("set_device", (index,)))

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

    def manual_seed_all(self, seed: int) -> None:
        self.calls.append(("manual_seed_all", (seed,)))

    def _is_in_bad_fork(self) -> bool:
        return False

    def fake_allocate(self, nbytes: int) -> None:
        """FAKE-only helper (no torch_npu counterpart): account ``nbytes`` on the current device."""
        self._allocated[self._current] += nbytes
        self._peak[self._current] = max(self._peak[self._current], self._allocated[self._current])


class _NpuHooks(torch._C._acc.PrivateUse1Hooks):
    """torch_npu registers its NPU hooks from C++; the FAKE registers these through torch's
    Python hook so ``torch._C._get_accelerator()`` (``dist.barrier``, FSDP2 defaults) sees ``npu``."""

    def is_available(self) -> bool:
        return npu.is_available()

    def has_primary_context(self, device_index: int) -> bool:
        return True

    def is_built(self) -> bool:
        return True


def _new_process_group_hccl_helper(dist_backend_opts: Any, pg_options: Any) -> Any:
    """The creator torch calls for an ``hccl`` group (extended API), as torch_npu's is; builds gloo."""
    CREATED.append(
        {
            "options": type(dist_backend_opts).__name__,
            "group_rank": dist_backend_opts.group_rank,
            "group_size": dist_backend_opts.group_size,
            "group_id": dist_backend_opts.group_id,
            "global_ranks_in_group": list(dist_backend_opts.global_ranks_in_group),
        }
    )
    return dist.ProcessGroupGloo(
        dist_backend_opts.store, dist_backend_opts.group_rank, dist_backend_opts.group_size, dist_backend_opts.timeout
    )


#: torch_npu's unsupported dtypes, passed to generate_methods_for_privateuse1_backend as it does.
UNSUPPORTED_DTYPE = [torch.quint8, torch.quint4x2, torch.quint2x4, torch.qint32, torch.qint8]

npu = FakeTorchNpu(int(os.environ.get("FAKE_TORCH_NPU_DEVICES", "8")), os.environ.get("ASCEND_RT_VISIBLE_DEVICES"))


def _install() -> None:
    marker = os.environ.get("FAKE_TORCH_NPU_IMPORT_MARKER")
    if marker:
        Path(marker).write_text(f"imported by pid {os.getpid()}\n")
    # the device first, then the distributed backend: torch_npu's order
    torch.utils.rename_privateuse1_backend("npu")
    torch._register_device_module("npu", npu)
    torch._C._acc.register_python_privateuseone_hook(_NpuHooks())
    torch.utils.generate_methods_for_privateuse1_backend(
        for_tensor=True, for_module=True, for_storage=True, unsupported_dtype=UNSUPPORTED_DTYPE
    )
    dist.Backend.register_backend("hccl", _new_process_group_hccl_helper, extended_api=True, devices=["npu", "cpu"])


_install()
