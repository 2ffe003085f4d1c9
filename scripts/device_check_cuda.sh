#!/usr/bin/env bash
# Device check on an NVIDIA GPU host (<= 8 minutes). Run from the repository root where areal-core
# and the plugins are installed with a CUDA build of torch, vLLM 0.32 and (for the SGLang steps)
# SGLang 0.5.23: bash scripts/install.sh on a networked GPU host, plus pip install -e
# 'plugins/engine_sglang[cuda]'. Steps, one PASS/FAIL/SKIP line each in the summary:
#   platform_tests             plugins/platform_cuda/tests on the GPU (devices, memory, NCCL group);
#   vllm_nccl_weight_transfer  vLLM server (GPU 0) + FSDP2 trainer (GPU 1): one update through vLLM's
#                              own nccl weight transfer (WeightTransferTrainerFactory.trainer_init on
#                              the trainer, the nccl worker engine in vLLM), then greedy == transformers;
#   sglang_nccl_weight_group   the same with an SGLang server: the trainer joins with SGLang's
#                              init_custom_process_group handshake over NCCL;
#   sglang_engine_tests        the SGLang engine tests against a real server (AREAL_TEST_REAL_SGLANG=1):
#                              tests/test_engine_matrix.py -k sglang and plugins/engine_sglang/tests;
#   logprob_memory_gpu         naive vs chunked log-prob peak memory on the GPU (scripts/device_logprob_memory.py).
# NCCL will not put two ranks of one group on one GPU, so the two weight-transfer steps need 2 GPUs;
# on a 1-GPU host they are SKIPped with that reason (the SGLang tests choose their own group
# backend for one GPU). Steps start only while the budget lasts; one not started is a FAIL.
# Usage: bash scripts/device_check_cuda.sh [--dry-run | --help]. Exits non-zero when a step failed.
# Logs: $AREAL_CHECK_DIR (default /tmp/areal-device-check); budget: $AREAL_CHECK_BUDGET_S (480).
set -uo pipefail
cd "$(dirname "$0")/.."
source scripts/device_check_lib.sh

gpus=$(python -c "import torch; print(torch.cuda.device_count())" 2>/dev/null || echo 0)
has_sglang=$(python -c "import importlib.util as u; print(int(u.find_spec('sglang') is not None))" 2>/dev/null || echo 0)

if [ "$DRY_RUN" -eq 0 ]; then
  echo "== environment"
  nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader 2>&1 | tee "$OUT/env.log"
  python - <<'PY' 2>&1 | tee -a "$OUT/env.log"
import importlib
import torch
print("torch", torch.__version__, "cuda build", torch.version.cuda, "GPUs", torch.cuda.device_count())
for name in ("vllm", "sglang"):
    try:
        print(name, importlib.import_module(name).__version__)
    except Exception as exc:  # noqa: BLE001 - reported, the steps say what it costs
        print(name, "missing:", exc)
PY
fi

step platform_tests 120 python -m pytest -q -x -p no:cacheprovider plugins/platform_cuda/tests
if [ "$gpus" -ge 2 ]; then
  step vllm_nccl_weight_transfer 200 python scripts/device_check_xccl.py --platform cuda --engine vllm \
    --expect-backend nccl --workdir "$OUT/xccl_vllm"
else
  skip vllm_nccl_weight_transfer "needs 2 GPUs (server and trainer are two NCCL ranks; NCCL refuses two on one GPU); found $gpus"
fi
if [ "$has_sglang" -eq 0 ]; then
  skip sglang_nccl_weight_group "sglang is not installed: pip install -e 'plugins/engine_sglang[cuda]'"
  skip sglang_engine_tests "sglang is not installed: pip install -e 'plugins/engine_sglang[cuda]'"
else
  if [ "$gpus" -ge 2 ]; then
    step sglang_nccl_weight_group 200 python scripts/device_check_xccl.py --platform cuda --engine sglang \
      --expect-backend nccl --workdir "$OUT/xccl_sglang"
  else
    skip sglang_nccl_weight_group "needs 2 GPUs (server and trainer are two NCCL ranks; NCCL refuses two on one GPU); found $gpus"
  fi
  step sglang_engine_tests 300 env AREAL_TEST_REAL_SGLANG=1 python -m pytest -q -x -p no:cacheprovider \
    -k sglang tests/test_engine_matrix.py plugins/engine_sglang/tests
fi

step logprob_memory_gpu 120 python scripts/device_logprob_memory.py cuda

summary cuda "XCCL_CHECK\|ratio"
exit "$FAILED"
