#!/usr/bin/env bash
# Device check of plugins/engine_sglang on an NVIDIA GPU host with SGLang installed (< 8 minutes).
#
# A real `python -m sglang.launch_server` on the tiny model runs the engine matrix's sglang tests
# (tests/test_engine_matrix.py; AREAL_TEST_REAL_SGLANG=1 swaps the fake for the real server):
# greedy generation and sampled log-probs against transformers, a disk update, an xccl update (NCCL
# with >= 2 GPUs, the trainer on the last one; gloo on one GPU, where NCCL refuses two ranks) and
# pause -> update -> resume, each followed by greedy-equality checks. Prints a summary at the end.
#
# Needs: pip install -e plugins/engine_sglang[cuda] -e plugins/platform_cuda (scripts/install.sh
# installs every plugin). Usage: bash scripts/device_check_sglang.sh [extra pytest args]
# Env: AREAL_DEVICE_CHECK_OUT (default /tmp/device_check_sglang), AREAL_TEST_SGLANG_ARGS (JSON
# rollout.engine_args for the server, default {"mem_fraction_static": 0.3}).
set -euo pipefail
cd "$(dirname "$0")/.."

command -v nvidia-smi >/dev/null 2>&1 || { echo "device_check_sglang: no nvidia-smi; this check needs an NVIDIA GPU" >&2; exit 2; }
python -c "import sglang" 2>/dev/null || {
  echo "device_check_sglang: sglang is not installed: pip install -e 'plugins/engine_sglang[cuda]'" >&2; exit 2; }

out="${AREAL_DEVICE_CHECK_OUT:-/tmp/device_check_sglang}"
rm -rf "$out" && mkdir -p "$out"
gpus=$(nvidia-smi -L | wc -l)
backend=$([ "$gpus" -ge 2 ] && echo nccl || echo "gloo (1 GPU)")
start=$(date +%s)

set +e
AREAL_TEST_REAL_SGLANG=1 timeout 450 python -m pytest -q -p no:cacheprovider -rA \
  --basetemp="$out/tmp" --junitxml="$out/junit.xml" -k sglang tests/test_engine_matrix.py "$@" 2>&1 | tee "$out/pytest.log"
rc=${PIPESTATUS[0]}
set -e

python - "$out" "$rc" "$(( $(date +%s) - start ))" "$backend" <<'EOF'
import glob, os, sys, xml.etree.ElementTree as ET
out, rc, seconds, backend = sys.argv[1], int(sys.argv[2]), sys.argv[3], sys.argv[4]
try:
    import sglang
    version = sglang.__version__
except Exception as exc:  # noqa: BLE001 - reported, not fatal
    version = f"? ({exc})"
print("\n==== device_check_sglang summary ====")
print(f"sglang {version}; xccl backend: {backend}; {seconds}s; pytest exit code {rc}")
try:
    cases = ET.parse(f"{out}/junit.xml").getroot().iter("testcase")
except (OSError, ET.ParseError):
    cases = []
for case in cases:
    failed = case.find("failure") is not None or case.find("error") is not None
    verdict = "FAIL" if failed else "skip" if case.find("skipped") is not None else "ok"
    print(f"  {verdict:4}  {float(case.get('time', 0)):6.1f}s  {case.get('name')}")
for log in sorted({os.path.realpath(p) for p in glob.glob(f"{out}/tmp/**/logs/sglang_server*.log", recursive=True)}):
    print(f"server log: {log}")
print("PASS" if rc == 0 else "FAIL (see the pytest log and the server log above)")
EOF
exit "$rc"
