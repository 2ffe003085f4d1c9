#!/usr/bin/env bash
# Device check on an Ascend host (<= 8 minutes; written for one, not yet run on hardware). Run from
# the repository root inside the Ascend container of docs/ascend.md (CANN sourced; torch_npu,
# vLLM 0.32 and the matching vllm-ascend installed; areal-core and the plugins installed). Steps,
# one PASS/FAIL/SKIP line each in the summary:
#   npu_platform_on_hardware      platform npu picked by auto; torch_npu's real hccl registration is
#                                 what the FAKE torch_npu of the CPU tests mirrors (extended API,
#                                 device npu); devices, memory stats; an hccl training group and subgroup;
#   vllm_ascend_hccl_registered   vLLM's general plugins register vllm-ascend's hccl backend in both
#                                 of vLLM's weight-transfer factories (worker and trainer);
#   vllm_ascend_hccl_weight_transfer  vLLM-Ascend server (NPU 0) + FSDP2 trainer (NPU 1): one update
#                                 through vllm-ascend's hccl weight transfer, then greedy == transformers;
#   logprob_memory_npu            naive vs chunked log-prob peak memory on the NPU.
# The transfer step needs 2 NPUs (server and trainer are two ranks of one HCCL group, one device
# each); on a 1-NPU host it is SKIPped with that reason. Steps start only while the budget lasts.
# Usage: bash scripts/device_check_npu.sh [--dry-run | --help]. Exits non-zero when a step failed.
# Logs: $AREAL_CHECK_DIR (default /tmp/areal-device-check); budget: $AREAL_CHECK_BUDGET_S (480).
set -uo pipefail
cd "$(dirname "$0")/.."
source scripts/device_check_lib.sh

npus=$(python -c "import torch, torch_npu; print(torch.npu.device_count())" 2>/dev/null || echo 0)

if [ "$DRY_RUN" -eq 0 ]; then
  echo "== environment"
  { npu-smi info 2>&1 | head -n 20; ls /dev/davinci[0-9]* 2>&1; echo "ASCEND_HOME_PATH=${ASCEND_HOME_PATH:-unset}"; } | tee "$OUT/env.log"
  python - <<'PY' 2>&1 | tee -a "$OUT/env.log"
import importlib
for name in ("torch", "torch_npu", "vllm", "vllm_ascend"):
    try:
        print(name, importlib.import_module(name).__version__)
    except Exception as exc:  # noqa: BLE001 - reported, the steps say what it costs
        print(name, "missing:", exc)
PY
fi

step npu_platform_on_hardware 180 python - <<'PY'
import os
import torch, torch.distributed as dist
from areal_core.active_platform import activate_platform, resolve_platform
from areal_core.plugins import load_plugins
from areal_core.api.scheduler import free_port
plugins = load_plugins()
assert resolve_platform("auto", plugins).name == "npu", "auto did not pick npu"
p = activate_platform(resolve_platform("npu", plugins))  # imports torch_npu
plugin = dist.Backend._plugins["HCCL"]  # the FAKE torch_npu registers hccl the same way: check it still does
assert plugin.extended_api and "npu" in dist.Backend.backend_capability["hccl"], (plugin, dist.Backend.backend_capability)
assert torch.device("npu", 0).type == "npu" and torch.get_device_module("npu") is torch.npu
print("devices", p.device_count()); p.set_device(0); dev = p.device(0)
before = p.memory_stats()["allocated_bytes"]
x = torch.empty(64 * 2**20, dtype=torch.uint8, device=dev); p.synchronize()
assert p.memory_stats()["allocated_bytes"] - before >= 64 * 2**20, p.memory_stats()
del x; p.empty_cache()
os.environ.update(RANK="0", WORLD_SIZE="1", MASTER_ADDR="127.0.0.1", MASTER_PORT=str(free_port()))
dist.init_process_group(backend=p.dist_backend, init_method="env://")
t = torch.ones(4, device=dev); dist.all_reduce(t); assert dist.get_backend() == "hccl" and t.tolist() == [1.0] * 4
group = dist.new_group([0], backend=p.dist_backend)
flat = torch.arange(8.0, device=dev); dist.broadcast(flat, 0, group=group)
assert flat.cpu().tolist() == list(map(float, range(8)))
dist.destroy_process_group()
print("NPU_PLATFORM OK", p.memory_stats())
PY
step vllm_ascend_hccl_registered 120 python - <<'PY'
from vllm.plugins import load_general_plugins
from vllm.distributed.weight_transfer.factory import WeightTransferEngineFactory, WeightTransferTrainerFactory
load_general_plugins()  # vllm-ascend registers its weight-transfer engines from a general plugin
worker, trainer = sorted(WeightTransferEngineFactory._registry), sorted(WeightTransferTrainerFactory._registry)
print("HCCL_FACTORIES worker:", worker, "trainer:", trainer)
assert "hccl" in worker and "hccl" in trainer, "this vllm-ascend does not register hccl in both factories (docs/ascend.md)"
PY
if [ "$npus" -ge 2 ]; then
  step vllm_ascend_hccl_weight_transfer 300 python scripts/device_check_xccl.py --platform npu --engine vllm \
    --expect-backend hccl --workdir "$OUT/xccl_vllm_ascend"
else
  skip vllm_ascend_hccl_weight_transfer "needs 2 NPUs (server and trainer are two HCCL ranks, one device each); found $npus"
fi
step logprob_memory_npu 120 python scripts/device_logprob_memory.py npu

summary npu "XCCL_CHECK\|NPU_PLATFORM\|HCCL_FACTORIES\|ratio"
exit "$FAILED"
