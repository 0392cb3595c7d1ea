#!/usr/bin/env bash
# The GPU suite: one pytest process per test file, so a kernel fault (which poisons
# the whole CUDA context) fails only its own file, and a kernel that never returns (a
# deadlock: the 32 / 240 register split in benchmarks/experiments/README.md) costs only
# its file's AOTC_GPU_FILE_TIMEOUT seconds (default 600). Logs go to $OUT (device machine)
# or gpu-logs/; -v writes each test's name before it runs, so a hung file's log ends with
# the test that hung. Usage: bash tests/gpu/run_suite.sh [python]
set -u
PY=${1:-python3}
cd "$(dirname "$0")/../.."
LOGS=${OUT:-gpu-logs}
LIMIT=${AOTC_GPU_FILE_TIMEOUT:-600}
mkdir -p "$LOGS"
status=0
summary=""
for f in tests/gpu/test_*.py; do
  name=$(basename "$f" .py)
  PYTHONPATH=$PWD${PYTHONPATH:+:$PYTHONPATH} timeout --kill-after=10 "$LIMIT" "$PY" -m pytest "$f" -m gpu -v \
      -p no:cacheprovider --junitxml="$LOGS/$name.xml" >"$LOGS/$name.log" 2>&1
  rc=$?
  if [ $rc -eq 124 ] || [ $rc -eq 137 ]; then
    last=$(grep -E '::' "$LOGS/$name.log" | tail -n 1 | sed 's/[[:space:]]*$//')
    summary+="$name: TIMED OUT after $LIMIT s (a hung kernel?), in: ${last:-its first test} (exit $rc)"$'\n'
  else
    summary+="$name: $(tail -n 1 "$LOGS/$name.log") (exit $rc)"$'\n'
  fi
  # exit 5: nothing collected, i.e. the file skipped itself at module level (test_multi_gpu on a
  # one-GPU machine); its skip reason is in its log
  [ $rc -eq 0 ] || [ $rc -eq 5 ] || status=1
done
printf '%s' "$summary" | tee "$LOGS/gpu-summary.txt"
exit $status
