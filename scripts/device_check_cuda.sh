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
OUT="${AREAL_CHECK_DIR:-/tmp/areal-device-check}"
mkdir -p "$OUT"
declare -a SUMMARY=()
FAILED=0

step() {  # step NAME TIMEOUT_S CMD...: run, log, record PASS/FAIL with wall time
  local name="$1" limit="$2"; shift 2
  local log="$OUT/${name}.log" start rc
  start=$(date +%s)
  echo "== ${name}: $*"
  timeout --kill-after=10 "$limit" "$@" >"$log" 2>&1
  rc=$?
  local took=$(( $(date +%s) - start ))
  if [ "$rc" -eq 0 ]; then SUMMARY+=("PASS  ${name}  (${took}s)")
  else SUMMARY+=("FAIL  ${name}  (rc ${rc}, ${took}s; see ${log})"); FAILED=1; tail -n 15 "$log"; fi
}

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
step logprob_memory_gpu 120 python - <<'PY'
# Peak GPU memory of naive vs chunked per-token log-probs (forward + backward), read from the platform.
import torch
from areal_platform_cuda.platform import CudaPlatform
from areal_core.train.logprobs import token_logprobs
p = CudaPlatform(); p.set_device(0); dev = p.device(0)
def peak(impl, n, v, h=1024):
    g = torch.Generator(device=dev).manual_seed(0)
    hid = (torch.randn(n, h, device=dev, generator=g) / h**0.5).requires_grad_()
    w = torch.randn(v, h, device=dev, generator=g).requires_grad_()
    y = torch.randint(0, v, (n,), device=dev, generator=g)
    p.synchronize(); p.empty_cache(); torch.cuda.reset_peak_memory_stats(); base = p.memory_stats()["allocated_bytes"]
    if impl == "naive":
        lp = (hid @ w.T).float().log_softmax(-1).gather(-1, y[:, None]).squeeze(-1)
    else:
        lp, _ = token_logprobs(hid, w, y, chunk_size=1024)
    lp.sum().backward(); p.synchronize()
    return (p.memory_stats()["peak_bytes"] - base) / 2**20
for n, v in [(8192, 32768), (16384, 151936)]:
    a, b = peak("naive", n, v), peak("chunked", n, v)
    print(f"tokens {n} vocab {v}: naive {a:.0f} MiB  chunked {b:.0f} MiB  ratio {a / b:.1f}x")
PY

echo
echo "================ device check (cuda) summary ================"
printf '%s\n' "${SUMMARY[@]}"
grep -h "XCCL_CHECK" "$OUT/xccl_nccl_vllm_greedy.log" 2>/dev/null
grep -h "ratio" "$OUT/logprob_memory_gpu.log" 2>/dev/null
exit "$FAILED"
