#!/usr/bin/env bash
# The GPU suite: one pytest process per test file, so a kernel fault (which poisons
# the whole CUDA context) fails only its own file. Logs go to $OUT (device machine)
# or gpu-logs/. Usage: bash tests/gpu/run_suite.sh [python]
set -u
PY=${1:-python3}
cd "$(dirname "$0")/../.."
LOGS=${OUT:-gpu-logs}
mkdir -p "$LOGS"
status=0
summary=""
for f in tests/gpu/test_*.py; do
  name=$(basename "$f" .py)
  PYTHONPATH=$PWD${PYTHONPATH:+:$PYTHONPATH} "$PY" -m pytest "$f" -m gpu -q -p no:cacheprovider \
      --junitxml="$LOGS/$name.xml" >"$LOGS/$name.log" 2>&1
  rc=$?
  summary+="$name: $(tail -n 1 "$LOGS/$name.log") (exit $rc)"$'\n'
  # exit 5: nothing collected, i.e. the file skipped itself at module level (test_multi_gpu on a
  # one-GPU machine); its skip reason is in its log
  [ $rc -eq 0 ] || [ $rc -eq 5 ] || status=1
done
printf '%s' "$summary" | tee "$LOGS/gpu-summary.txt"
exit $status
