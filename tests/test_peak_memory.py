"""A stage's peak memory is its own: the second model a ``lock`` searched was reported at the first one's peak (a 1.2M
parameter CNN's search said 2.9 GB, a RegNet's before it having taken that), since the peak read was the process's
since it started."""
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
