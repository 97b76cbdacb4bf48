#!/usr/bin/env bash
# Run the suite on a lent GPU machine (not CI): prints the capability matrix, runs the tests,
# and leaves the env report, the run record and a JUnit file in $OUT.
set -u
python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl/*.whl && export PYTHONPATH=/tmp/site
nvidia-smi --query-gpu=name,compute_cap,driver_version --format=csv
python3 -m quantverdict env | tee "$OUT/env.json"
python3 -m pytest -q -rs -p no:cacheprovider --rootdir=. -c pytest.ini --report-dir="$OUT" --junitxml="$OUT/junit.xml" "$@" 2>&1 | tail -60
