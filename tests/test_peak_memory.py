"""A stage's peak memory is its own: the second model a ``lock`` searched was reported at the first one's peak (a
MobileNetV3-small's search said 2.9 GB, a RegNet's before it having taken that), since the peak read was the process's
since it started; and a case and a run say their CPU-seconds and peak memory beside their time."""
import re
import subprocess
import sys

import pytest

PROBE = """
import numpy as np
from quantverdict.resources import peak_memory_mb, peak_within

mb = 2 ** 20
with peak_within() as outer:
    big = np.ones(400 * mb // 8)  # touched: resident
    del big
    with peak_within() as inner:
        small = np.ones(50 * mb // 8)
        print(inner(), outer(), peak_memory_mb(), small.size)
"""


@pytest.mark.skipif(not sys.platform.startswith("linux"),
                    reason="sets back Linux's high-water mark (/proc/self/clear_refs)")
def test_a_block_reads_its_own_peak_and_the_blocks_around_it_and_the_process_keep_theirs():
    """400 MB touched and freed, then 50 MB inside an inner block: the inner block's peak holds the 50 MB and not the
    400 (bounds: the resident memory it began with, a Python and numpy, is under 300 MB); the outer block and the
    process still hold the 400 MB the inner block's start set the kernel's mark back from."""
    inner, outer, process, _ = map(float, subprocess.run([sys.executable, "-c", PROBE], capture_output=True, text=True,
                                                         check=True).stdout.split())
    assert 50 <= inner < 350, inner
    assert outer >= 400 and process >= 400 and outer - inner >= 100, (outer, inner)


def test_each_case_and_the_run_say_what_they_cost(tmp_path):
    """A case's record keeps its CPU-seconds and its peak memory (the process's while it ran), the summary's first
    line their sum and largest; `run`'s last line the run's own (a record said its wall time only)."""
    from quantverdict.report.load import load_record
    from quantverdict.report.render import markdown
    from quantverdict.run.pipeline import Case, Pipeline

    result = Pipeline(tmp_path / "cache").run(Case("mlp", "fp32", "onnxruntime"))
    assert result.status == "passed" and result.cost["cpu_s"] > 0 and result.cost["peak_mb"] > 50, result.cost
    assert result.record().cost.model_dump() == result.cost
    proc = subprocess.run([sys.executable, "-m", "quantverdict", "run", "--models", "mlp", "--precisions", "fp32",
                           "--backends", "onnxruntime", "--cache-dir", str(tmp_path / "cache"), "--report-dir",
                           str(tmp_path / "reports")], capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr
    assert re.search(r"\n1 passed in \d+ s \(\d+ CPU-s, peak memory \d+\.\d GB\); record: ", proc.stdout), proc.stdout
    record = load_record(next((tmp_path / "reports").glob("run-*.json")))
    assert re.search(r"^1 passed in \d+ s \(\d+ CPU-s in its cases, peak memory \d+\.\d GB\) on ",
                     markdown(record).splitlines()[2]), markdown(record)
