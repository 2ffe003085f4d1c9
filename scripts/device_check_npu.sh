#!/usr/bin/env bash
# Device check on an Ascend host (written for one; not yet run on hardware). Run from the
# repository root inside the Ascend container of docs/ascend.md (CANN sourced, torch_npu and
# vllm-ascend installed, areal-core + plugins installed). Needs 2 NPUs (1 server + 1 trainer).
#   1. platform tests (plugins/platform_npu, plugins/platform_cuda) and real NPU calls:
#      probe, torch_npu import, devices, memory stats, HCCL training group, stateless HCCL group;
#   2. xccl over HCCL: vLLM-Ascend server + FSDP2 trainer, one update, greedy == transformers;
#   3. the GSM8K example's NPU config through the launcher, tiny model, a few steps;
#   4. naive vs chunked log-prob peak memory on the NPU.
# Prints a summary; exits non-zero when a step failed. Logs: $AREAL_CHECK_DIR (default /tmp/areal-device-check).
set -uo pipefail
cd "$(dirname "$0")/.."
source scripts/device_check_lib.sh

echo "== environment"
{ npu-smi info 2>&1 | head -n 20; ls /dev/davinci[0-9]* 2>&1; echo "ASCEND_HOME_PATH=${ASCEND_HOME_PATH:-unset}"; } | tee "$OUT/env.log"

step platform_tests 240 python -m pytest -q -x plugins/platform_npu/tests plugins/platform_cuda/tests -p no:cacheprovider
step npu_platform_on_hardware 240 python - <<'PY'
import datetime, os
import torch, torch.distributed as dist
from torch.distributed import _dist2
from areal_core.platform import activate_platform, resolve_platform
from areal_core.plugins import load_plugins
from areal_core.scheduler.base import free_port
plugins = load_plugins()
assert resolve_platform("auto", plugins).name == "npu", "auto did not pick npu"
p = activate_platform(resolve_platform("npu", plugins))  # imports torch_npu, registers stateless hccl
print("devices", p.device_count()); p.set_device(0); dev = p.device(0)
before = p.memory_stats()["allocated_bytes"]
x = torch.empty(64 * 2**20, dtype=torch.uint8, device=dev); p.synchronize()
assert p.memory_stats()["allocated_bytes"] - before >= 64 * 2**20, p.memory_stats()
del x; p.empty_cache()
os.environ.update(RANK="0", WORLD_SIZE="1", MASTER_ADDR="127.0.0.1", MASTER_PORT=str(free_port()))
dist.init_process_group(backend=p.dist_backend, init_method="env://")
t = torch.ones(4, device=dev); dist.all_reduce(t); assert dist.get_backend() == "hccl" and t.tolist() == [1.0] * 4
timeout = datetime.timedelta(seconds=120)
store = dist.TCPStore("127.0.0.1", free_port(), 1, is_master=True, timeout=timeout)
g = _dist2._BACKENDS["hccl"](dist.PrefixStore("w", store), 0, 1, timeout, dev)
flat = torch.arange(8.0, device=dev); g.broadcast(flat, 0).wait(); assert flat.cpu().tolist() == list(map(float, range(8)))
dist.destroy_process_group()
print("NPU_PLATFORM OK", p.memory_stats())
PY
step xccl_hccl_vllm_greedy 420 python scripts/device_check_xccl.py --platform npu --engine vllm --workdir "$OUT/xccl"
step gsm8k_npu_config_tiny 420 python -m areal_core.launcher.local examples/math/gsm8k_rl.py \
  --config examples/math/gsm8k_grpo_npu.yaml "fileroot=$OUT/gsm8k" model.path= model.dtype=float32 \
  model.gradient_checkpointing=false "model.tiny={max_position_embeddings: 1536}" total_train_steps=3 \
  gconfig.n_samples=4 gconfig.max_new_tokens=32 train_dataset.batch_size=4 train_dataset.size=32 \
  valid_dataset.size=8 stats.eval_every=3 stats.progress=false recover.mode=off \
  "rollout.engine_args={gpu-memory-utilization: 0.3}"
step logprob_memory_npu 120 python scripts/device_logprob_memory.py npu

summary npu "XCCL_CHECK\|NPU_PLATFORM\|ratio"
exit "$FAILED"
