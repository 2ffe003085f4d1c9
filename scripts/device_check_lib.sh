# Shared by scripts/device_check_*.sh (sourced): a log folder, step(), and the summary.
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

summary() {  # summary TITLE GREP_PATTERN: the step results, then matching lines of every log
  echo
  echo "================ device check ($1) summary ================"
  printf '%s\n' "${SUMMARY[@]}"
  grep -h "$2" "$OUT"/*.log 2>/dev/null
}
