#!/usr/bin/env bash
# A venv on top of the installed environment (--system-site-packages) where SGLang's weight-group
# code imports on a CPU machine: sglang==0.5.23 and triton, both without dependencies (nothing
# installed changes; SGLang's servers still need CUDA). Tests run SGLang's own
# init_custom_process_group with this venv's python: export AREAL_SGLANG_PYTHON=$VENV_DIR/bin/python
# (plugins/engine_sglang/README.md, "What is verified where"). About 1.3 GB, 325 MB downloaded.
# Usage: bash scripts/install_sglang_cpu.sh [VENV_DIR]   (default .venv-sglang)
set -euo pipefail
cd "$(dirname "$0")/.."
venv="${1:-.venv-sglang}"
python scripts/layered_venv.py "$venv"  # sees this environment's packages, from a venv too
"$venv/bin/python" -m pip install --quiet --no-deps sglang==0.5.23 triton==3.9.0
"$venv/bin/python" -c "from sglang.srt.utils.common import init_custom_process_group"
echo "installed sglang (CPU, for its weight-group code) in $venv: export AREAL_SGLANG_PYTHON=$(cd "$venv" && pwd)/bin/python"
