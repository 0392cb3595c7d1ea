"""tests/gpu/run_suite.sh without a GPU: a stand-in python that passes every file's tests but hangs in one (as a
kernel that never returns does) shows that the hung file ends at AOTC_GPU_FILE_TIMEOUT, that the summary names the
test it hung in, and that the other files still run and the suite fails."""
import os
import subprocess
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
HUNG = "test_decode"

FAKE_PYTHON = f"""#!/usr/bin/env bash
# called as: fake -m pytest tests/gpu/NAME.py ...
file=$3
if [ "$(basename "$file" .py)" = "{HUNG}" ]; then
  echo "$file::test_passes PASSED"
  printf '%s' "$file::test_hangs "
  exec sleep 60
fi
echo "$file::test_passes PASSED"
echo "1 passed in 0.01s"
"""


def test_a_hung_file_times_out_and_the_rest_still_run(tmp_path):
    fake = tmp_path / "python"
    fake.write_text(FAKE_PYTHON)
    fake.chmod(0o755)
    logs = tmp_path / "logs"
    env = dict(os.environ, OUT=str(logs), AOTC_GPU_FILE_TIMEOUT="2")
    run = subprocess.run(["bash", str(REPO / "tests/gpu/run_suite.sh"), str(fake)], capture_output=True, text=True,
                         env=env, timeout=120)
    assert run.returncode == 1, run.stdout + run.stderr
    lines = (logs / "gpu-summary.txt").read_text().splitlines()
    files = sorted(p.stem for p in (REPO / "tests/gpu").glob("test_*.py"))
    assert [line.split(":")[0] for line in lines] == files
    for name, line in zip(files, lines):
        if name == HUNG:
            assert line == (f"{HUNG}: TIMED OUT after 2 s (a hung kernel?), in: tests/gpu/{HUNG}.py::test_hangs "
                            "(exit 124)")
        else:
            assert line == f"{name}: 1 passed in 0.01s (exit 0)"
