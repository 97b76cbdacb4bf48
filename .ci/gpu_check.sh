#!/usr/bin/env bash
# Run the suite on a lent GPU machine (not CI): prints the capability matrix, runs the tests, and leaves
# the env report, the run record, the log and a JUnit file in $OUT. Carry .whl/ (the dependencies the
# machine lacks, and in .whl/qv/ this tree's own wheel, whose entry point loads the pytest plugin).
set -u
python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl/*.whl &&
  python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/qv .whl/qv/*.whl &&
  export PYTHONPATH=/tmp/site:/tmp/qv PYTHONUNBUFFERED=1 || exit 1
nvidia-smi --query-gpu=name,compute_cap,driver_version --format=csv
python3 -m quantverdict env > "$OUT/env.json"
set -o pipefail
# -v: each test's outcome is a line of the log as it ends, so a run cut at the device's time limit still names its
# failures (pytest's summary comes only at the end); the tail shows the summary lines and the failures.
python3 -m pytest -v -rfEs -p no:cacheprovider --qv-report-dir="$OUT" --junitxml="$OUT/junit.xml" "$@" 2>&1 |
  tee "$OUT/log" | grep -E "FAILED|ERROR|XPASS|^(SKIPPED|=)" | tail -70
