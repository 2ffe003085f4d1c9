#!/usr/bin/env bash
# The reference implementations that tests/test_offpolicy_parity.py compares actor.offpolicy's
# corrections with: verl's rollout correction and policy loss, AReaL's rejection sampling, PPO
# loss and M2PO mask, each read from its PyPI wheel at test time (nothing of theirs is copied
# into this repository). They go, without dependencies, into a directory of their own that only
# the parity test's subprocess puts on its path, with the modules their imports need that
# areal-core does not install (AReaL's trainer package imports datasets, which imports pandas);
# nothing installed changes. About 150 MB, most of it pandas.
# Usage: bash scripts/install_offpolicy_refs.sh [DIR]   (default .offpolicy-refs; the test finds
# it there or at $AREAL_OFFPOLICY_REFS)
set -euo pipefail
cd "$(dirname "$0")/.."
dir="${1:-.offpolicy-refs}"
python -m pip install --quiet --no-deps --target "$dir" --upgrade \
    verl==0.9.1 areal==1.0.4 \
    aiofiles==25.1.0 antlr4-python3-runtime==4.9.3 codetiming==1.4.0 colorlog==6.12.0 gradio_client==2.7.2 \
    hydra-core==1.3.8 omegaconf==2.4.0 pyvers==0.2.3 tabulate==0.10.0 tenacity==9.2.1 tensorboardX==2.6.5 \
    tensordict==0.15.3 torchdata==0.11.0 trackio==0.43.0 \
    datasets==5.2.0 multiprocess==0.70.19 pandas==3.1.1
PYTHONPATH="$dir" python tests/offpolicy_reference.py --check
echo "installed the off-policy reference implementations (verl 0.9.1, AReaL 1.0.4) in $dir"
