"""Freed memory is reused within the harness's work instead of being faulted in again (glibc only)."""
import subprocess
import sys

import pytest

from quantverdict import freed_memory

PROGRAM = """
import resource, sys
import numpy as np
from quantverdict import freed_memory

def faults_of_second_round():
    arrays = [np.ones(2 << 20) for _ in range(4)]  # four 16 MiB blocks, freed together: 64 MiB at the heap's top
    del arrays
    before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
    arrays = [np.ones(2 << 20) for _ in range(4)]
    return resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before

if sys.argv[1] == "kept":
    with freed_memory.kept():
        print(faults_of_second_round())
else:
    print(faults_of_second_round())
"""
PAGES = 4 * (16 << 20) // 4096  # the second round's pages, each a fault where the first round's were returned


@pytest.mark.skipif(freed_memory._glibc() is None, reason="freed memory is kept only under glibc (Linux)")
def test_within_the_work_a_second_round_of_buffers_reuses_the_first_ones_pages():
    def faults(mode: str) -> int:
        return int(subprocess.run([sys.executable, "-c", PROGRAM, mode], capture_output=True, text=True,
                                  check=True).stdout)

    kept = faults("kept")
    assert kept < PAGES / 100, f"{kept} page faults for {PAGES} pages used again (glibc's own policy: {faults('')})"


GIVEN_BACK = """
import numpy as np
from quantverdict import freed_memory

def resident_mib():
    with open("/proc/self/statm") as statm:
        return int(statm.read().split()[1]) * 4096 / 2**20

with freed_memory.kept():
    arrays = [np.ones(2 << 20) for _ in range(16)]  # 256 MiB, freed within the work: kept for reuse
    del arrays
    kept = resident_mib()
print(kept, resident_mib())
"""


@pytest.mark.skipif(freed_memory._glibc() is None, reason="freed memory is kept only under glibc (Linux)")
def test_what_the_work_kept_is_given_back_when_it_ends():
    out = subprocess.run([sys.executable, "-c", GIVEN_BACK], capture_output=True, text=True, check=True).stdout
    kept, after = map(float, out.split())
    assert kept - after > 200, f"resident {kept:.0f} MiB within the work, {after:.0f} MiB after it"
