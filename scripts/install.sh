#!/usr/bin/env bash
# Install areal-core and every plugin directory of this checkout (editable), CPU torch first.
# Usage: bash scripts/install.sh            (AREAL_TORCH_SPEC=... picks another torch)
set -euo pipefail
cd "$(dirname "$0")/.."
# A CPU build of torch; a plain "torch" requirement would pull a multi-GB CUDA build.
python -m pip install --quiet "${AREAL_TORCH_SPEC:-torch==2.13.0}"
args=(-e ".[test]")
for dir in plugins/*/; do
  [ -f "$dir/pyproject.toml" ] && args+=(-e "$dir")
done
python -m pip install --quiet "${args[@]}"
echo "installed: areal-core + ${#args[@]} editable distributions ($(printf '%s ' "${args[@]}" | sed 's/-e //g'))"
