#!/usr/bin/env bash
# Install areal-core and every plugin directory of this checkout (editable), CPU torch first.
# Usage: bash scripts/install.sh            (AREAL_TORCH_SPEC=... picks another torch)
set -euo pipefail
cd "$(dirname "$0")/.."
# A CPU build of torch; a plain "torch" requirement would pull a multi-GB CUDA build.
python -m pip install --quiet "${AREAL_TORCH_SPEC:-torch==2.13.0}"
args=(-e ".[test]")
plugins=""
for dir in plugins/*/; do
  if [ -f "$dir/pyproject.toml" ]; then
    args+=(-e "$dir")
    plugins+=" ${dir%/}"
  fi
done
python -m pip install --quiet "${args[@]}"
echo "installed (editable): areal-core${plugins:+ and}${plugins}"
