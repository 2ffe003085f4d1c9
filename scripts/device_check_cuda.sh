#!/usr/bin/env bash
# Device check on one NVIDIA GPU (< 8 minutes). Run from the repository root on a machine where
# areal-core and the plugins are installed with a CUDA build of torch and vLLM
# (bash scripts/install.sh on a networked GPU host does that). Steps:
#   1. platform tests on the GPU (plugins/platform_cuda: devices, memory stats, NCCL groups);
#   2. xccl over NCCL: vLLM server + FSDP2 trainer on the GPU, one update, greedy == transformers;
#   3. the quickstart through the launcher with vLLM on CUDA and xccl (a few steps);
#   4. bench/logprob_memory.py, plus naive vs chunked log-prob peak memory on the GPU.
# Prints a summary; exits non-zero when a step failed. Logs: $AREAL_CHECK_DIR (default /tmp/areal-device-check).
set -uo pipefail
cd "$(dirname "$0")/.."
source scripts/device_check_lib.sh

echo "== environment"
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader 2>&1 | tee "$OUT/env.log"
python - <<'PY' 2>&1 | tee -a "$OUT/env.log"
import torch
print("torch", torch.__version__, "cuda build", torch.version.cuda, "available", torch.cuda.is_available())
from areal_core.platform import resolve_platform
from areal_core.plugins import load_plugins
print("platform auto ->", resolve_platform("auto", load_plugins()).name)
try:
    import vllm
    print("vllm", vllm.__version__)
except Exception as exc:
    print("vllm missing:", exc)
PY

step platform_tests 240 python -m pytest -q -x plugins/platform_cuda/tests plugins/platform_npu/tests -p no:cacheprovider
step xccl_nccl_vllm_greedy 300 python scripts/device_check_xccl.py --platform cuda --engine vllm --workdir "$OUT/xccl"
step quickstart_vllm_xccl_cuda 300 python -m areal_core.launcher.local examples/quickstart/train.py \
  --config examples/quickstart/config.yaml "fileroot=$OUT/quickstart" platform=cuda rollout.engine=vllm \
  actor.weight_update=xccl total_train_steps=5 stats.eval_every=5 stats.progress=false valid_dataset.size=8
step logprob_memory_bench 240 python bench/logprob_memory.py
step logprob_memory_gpu 120 python scripts/device_logprob_memory.py cuda

summary cuda "XCCL_CHECK\|ratio"
exit "$FAILED"
