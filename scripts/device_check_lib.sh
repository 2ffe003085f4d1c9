# Shared by scripts/device_check_*.sh (sourced from the repository root, with the script's "$@"):
# the options, a log folder, step()/skip(), a whole-check deadline and the summary.
#   --help     print the calling script's header comment and exit
#   --dry-run  list each step (PLAN, with its command) or SKIP (with the reason); run nothing
# Every step prints one summary line: PASS, FAIL or SKIP (or PLAN in a dry run).
OUT="${AREAL_CHECK_DIR:-/tmp/areal-device-check}"
BUDGET_S="${AREAL_CHECK_BUDGET_S:-480}"  # the whole check stops starting steps after this many seconds
DRY_RUN=0
case "${1:-}" in
  -h|--help) sed -n '2,/^set /{/^set /d;s/^# \{0,1\}//;p}' "scripts/$(basename "$0")"; exit 0 ;;
  --dry-run) DRY_RUN=1 ;;
  "") ;;
  *) echo "usage: bash scripts/$(basename "$0") [--dry-run | --help]" >&2; exit 2 ;;
esac
mkdir -p "$OUT"
declare -a SUMMARY=()
FAILED=0
CHECK_START=$(date +%s)

step() {  # step NAME TIMEOUT_S CMD...: run (within what is left of the budget), log, record the result
  local name="$1" limit="$2"; shift 2
  if [ "$DRY_RUN" -eq 1 ]; then SUMMARY+=("PLAN  ${name}  (<= ${limit}s): $*"); return 0; fi
  local left=$(( BUDGET_S - ($(date +%s) - CHECK_START) ))
  if [ "$left" -lt 30 ]; then SUMMARY+=("FAIL  ${name}  (not run: the ${BUDGET_S}s budget is spent)"); FAILED=1; return 0; fi
  [ "$limit" -gt "$left" ] && limit="$left"
  local log="$OUT/${name}.log" start rc
  start=$(date +%s)
  echo "== ${name}: $*"
  timeout --kill-after=10 "$limit" "$@" >"$log" 2>&1
  rc=$?
  local took=$(( $(date +%s) - start ))
  if [ "$rc" -eq 0 ]; then SUMMARY+=("PASS  ${name}  (${took}s)")
  else SUMMARY+=("FAIL  ${name}  (rc ${rc}, ${took}s; see ${log})"); FAILED=1; tail -n 15 "$log"; fi
}

skip() {  # skip NAME REASON: record a step that cannot run on this host, and why
  SUMMARY+=("SKIP  $1  ($2)")
}

summary() {  # summary TITLE GREP_PATTERN: the step results, then matching lines of every log
  echo
  echo "================ device check ($1) summary ================"
  printf '%s\n' "${SUMMARY[@]}"
  [ "$DRY_RUN" -eq 1 ] || grep -h "$2" "$OUT"/*.log 2>/dev/null
}
