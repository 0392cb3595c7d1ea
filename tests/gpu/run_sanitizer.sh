#!/usr/bin/env bash
# compute-sanitizer over the edge-shape launches: memcheck on all of them, racecheck and
# synccheck on one variant per family. Logs to $OUT (or gpu-logs/). Exit 1 on any finding.
# API errors are not reported (--report-api-errors no): torch and cuda-bindings probe driver
# symbols with cuGetProcAddress, which fails by design; aotc itself raises on every failed call.
set -u
cd "$(dirname "$0")/../.."
LOGS=${OUT:-gpu-logs}
mkdir -p "$LOGS"
export PYTORCH_NO_CUDA_MEMORY_CACHING=1 PYTHONPATH=$PWD${PYTHONPATH:+:$PYTHONPATH}
CS=${COMPUTE_SANITIZER:-compute-sanitizer}
status=0
for run in "memcheck all" "racecheck one" "synccheck one" "racecheck hopper" "synccheck hopper"; do
  set -- $run
  log="$LOGS/sanitizer-$1-$2.log"
  # a kernel that never returns (a deadlock) ends the run at AOTC_GPU_FILE_TIMEOUT seconds (default 600), exit 124
  timeout --kill-after=10 "${AOTC_GPU_FILE_TIMEOUT:-600}" \
      $CS --tool "$1" --error-exitcode 3 --report-api-errors no python3 tests/gpu/sanitizer_cases.py "$2" >"$log" 2>&1
  rc=$?
  echo "$1 ($2): exit $rc; $(grep -E 'ERROR SUMMARY|RACECHECK SUMMARY|sanitizer cases' "$log" | tr '\n' ' ')"
  [ $rc -eq 0 ] || status=1
done
exit $status
