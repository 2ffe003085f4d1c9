"""One training rank on the npu platform with the FAKE torch_npu (run by test_npu_platform.py).

Reads RANK/WORLD_SIZE/MASTER_ADDR/MASTER_PORT like a training worker. Joins the training group on
the platform's backend, all-reduces, broadcasts over a subgroup, takes one FSDP2 step over the
``hccl`` group (mesh device type ``cpu``: the FAKE's tensors live on the host) and prints one
JSON line with what it observed.
"""

import json
import os

import torch
import torch.distributed as dist
from areal_platform_npu.platform import NpuPlatform
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.fsdp import fully_shard

rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
platform = NpuPlatform()
platform.init_process()  # imports torch_npu: the npu device, torch.npu and the hccl backend appear
import torch_npu

platform.set_device(int(os.environ["LOCAL_RANK"]) % platform.device_count())
dist.init_process_group(backend=platform.dist_backend, init_method="env://")
total = torch.tensor([float(rank + 1)])
dist.all_reduce(total)

subgroup = dist.new_group(list(range(world)), backend=platform.dist_backend)
flat = torch.arange(4.0) if rank == 0 else torch.zeros(4)
dist.broadcast(flat, 0, group=subgroup)

# One FSDP2 step: each rank's batch differs; the sharded update must equal the plain one on the
# concatenated batch (FSDP averages gradients over ranks).
torch.manual_seed(0)
reference = torch.nn.Linear(4, 3, bias=False)
model = torch.nn.Linear(4, 3, bias=False)
model.load_state_dict(reference.state_dict())
mesh = init_device_mesh("cpu", (world,))
fully_shard(model, mesh=mesh)
batches = [torch.arange(8.0).reshape(2, 4) + 10 * r for r in range(world)]
optim = torch.optim.SGD(model.parameters(), lr=0.01)
model(batches[rank]).pow(2).sum().backward()
optim.step()
ref_optim = torch.optim.SGD(reference.parameters(), lr=0.01)
(sum(reference(b).pow(2).sum() for b in batches) / world).backward()
ref_optim.step()
fsdp_error = (model.weight.full_tensor() - reference.weight).abs().max().item()

platform.synchronize()
platform.empty_cache()
torch.npu.fake_allocate(4096)
torch.npu.fake_allocate(-3072)
print(
    json.dumps(
        {
            "imported": torch_npu.__version__,
            "device": str(torch.device("npu", 1)),
            "device_module": torch.get_device_module("npu") is torch.npu,
            "train_backend": dist.get_backend(),
            "subgroup_backend": dist.get_backend(subgroup),
            "mesh_backend": dist.get_backend(mesh.get_group()),
            "created": torch_npu.CREATED,
            "all_reduce": total.item(),
            "broadcast": flat.tolist(),
            "fsdp_error": fsdp_error,
            "device_count": platform.device_count(),
            "current_device": torch.npu.current_device(),
            "calls": [name for name, _ in torch.npu.calls],
            "memory": platform.memory_stats(),
        }
    )
)
dist.barrier()
dist.destroy_process_group()
