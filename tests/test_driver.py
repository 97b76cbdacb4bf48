"""The GPU read from the driver's listing (no CUDA context, torch not imported) is the GPU torch's ``cuda:0`` is, or
the driver's listing leaves the answer to torch. The parsing is checked on nvidia-smi's own output format; on a host
with an NVIDIA driver, against torch itself, in fresh processes under several ``CUDA_VISIBLE_DEVICES``."""
import json
import os
import subprocess
import sys

import pytest

from quantverdict.capabilities import nvidia_driver_present
from quantverdict.driver import ListedGPU, parse_cuda_version, parse_listing, torch_cuda_version, visible

LISTING = """\
0, GPU-8e3554f4-9cc5-a381-8d4f-59dec2389b97, NVIDIA H200, 9.0, Disabled
1, GPU-811520f4-239a-e343-42c3-e5cdf2f9381a, NVIDIA H200, 9.0, Disabled
"""
HEADER = """\
+-----------------------------------------------------------------------------------------+
| NVIDIA-SMI 580.95.05              Driver Version: 580.95.05      CUDA Version: 13.0     |
"""


def test_the_listing_is_read_field_by_field_and_an_old_drivers_is_left_to_torch():
    first, second = parse_listing(LISTING)
    assert first == ListedGPU(0, "GPU-8e3554f4-9cc5-a381-8d4f-59dec2389b97", "NVIDIA H200", (9, 0), False)
    assert second.index == 1 and not second.mig
    assert parse_listing("0, GPU-1, Tesla K80, [N/A], [N/A]\n") is None  # no compute capability reported
    assert parse_listing("0, GPU-1, NVIDIA A100-SXM4-80GB, 8.0, Enabled\n")[0].mig
    assert parse_cuda_version(HEADER) == (13, 0) and parse_cuda_version("No devices were found") is None


def test_cuda_visible_devices_is_read_as_cuda_reads_it_or_left_to_cuda():
    gpus = parse_listing(LISTING)
    assert visible(gpus, None) == gpus
    assert visible(gpus, "1") == [gpus[1]] and visible(gpus, "1,0") == [gpus[1], gpus[0]]
    assert visible(gpus, "GPU-811520f4") == [gpus[1]]  # a unique prefix of the UUID
    assert visible(gpus, "") == [] and visible(gpus, "-1") == []
    assert visible(gpus, "0,7,1") == [gpus[0]]  # the list ends at the first entry that names no GPU
    assert visible(gpus, "GPU-8") is None and visible(gpus, "0,0") is None  # a prefix of both, one named twice
    assert visible(gpus, "MIG-5c0a2f7e-94ac-5b8b-b0f6-7aa2d8a2a1b2") is None


def test_the_cuda_torch_was_built_for_is_read_without_importing_it():
    torch = pytest.importorskip("torch")
    built = torch.version.cuda
    assert torch_cuda_version() == (None if built is None else tuple(int(part) for part in built.split(".")[:2]))


PROBE = """\
import json, sys
from quantverdict.capabilities import first_gpu
from quantverdict.driver import torch_first_gpu
import os
answered, _ = torch_first_gpu(os.environ.get("CUDA_VISIBLE_DEVICES"))
fast = first_gpu()
imported = "torch" in sys.modules
import torch
truth = (torch.cuda.get_device_name(0), list(torch.cuda.get_device_capability(0))) if torch.cuda.is_available() \\
    else None
print(json.dumps({"answered": answered, "imported": imported, "truth": truth,
                  "fast": None if fast is None else [fast.name, list(fast.compute_capability)]}))
"""


@pytest.mark.gpu
@pytest.mark.skipif(not nvidia_driver_present(), reason="comparing the driver's listing with torch's needs an NVIDIA "
                                                         "driver (no /proc/driver/nvidia/version, no nvidia-smi here)")
@pytest.mark.parametrize("devices", [None, "0", "-1", ""])
def test_the_gpu_read_from_the_driver_is_the_one_torch_sees(devices):
    env = {key: value for key, value in os.environ.items() if key != "CUDA_VISIBLE_DEVICES"}
    if devices is not None:
        env["CUDA_VISIBLE_DEVICES"] = devices
    probe = json.loads(subprocess.run([sys.executable, "-c", PROBE], env=env, capture_output=True, text=True,
                                      check=True, timeout=300).stdout)
    assert probe["fast"] == probe["truth"]
    if probe["answered"]:
        assert not probe["imported"]  # the driver answered: torch was not imported to ask it
