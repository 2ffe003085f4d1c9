"""One training rank on the npu platform with the FAKE torch_npu (run by test_npu_platform.py).

Reads RANK/WORLD_SIZE/MASTER_ADDR/MASTER_PORT like a training worker; argv[1] is the weight-update
group's store port. Prints one JSON line with what it observed.
"""

import datetime
import json
import os
import sys

import torch
import torch.distributed as dist
from areal_platform_npu.platform import NpuPlatform

rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
platform = NpuPlatform()
platform.init_process()  # imports torch_npu: torch.npu appears, hccl is registered
import torch_npu

platform.set_device(int(os.environ["LOCAL_RANK"]) % platform.device_count())
dist.init_process_group(backend=platform.dist_backend, init_method="env://")
total = torch.tensor([float(rank + 1)])
dist.all_reduce(total)

from torch.distributed import _dist2

timeout = datetime.timedelta(seconds=120)
store = dist.TCPStore("127.0.0.1", int(sys.argv[1]), world, is_master=rank == 0, timeout=timeout)
group = _dist2._BACKENDS[platform.dist_backend](
    dist.PrefixStore("areal_weights_1", store), rank, world, timeout, torch.device("cpu")
)
flat = torch.arange(4.0) if rank == 0 else torch.zeros(4)
group.broadcast(flat, 0).wait()

platform.synchronize()
platform.empty_cache()
torch.npu.fake_allocate(4096)
torch.npu.fake_allocate(-3072)
print(
    json.dumps(
        {
            "imported": torch_npu.__version__,
            "train_backend": dist.get_backend(),
            "weight_backend": platform.dist_backend,
            "all_reduce": total.item(),
            "broadcast": flat.tolist(),
            "device_count": platform.device_count(),
            "current_device": torch.npu.current_device(),
            "calls": [name for name, _ in torch.npu.calls],
            "memory": platform.memory_stats(),
        }
    )
)
dist.barrier()
dist.destroy_process_group()
