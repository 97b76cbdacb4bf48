"""Ctrl-C on a real run: a real SIGINT to a real process, at moments that land in imports (where torch's
interrupted import once crashed the exit with a segfault), in export and calibration, and in a warm run.
Every time: exit code 130, one line, no traceback, no run record, and every cache entry whole."""
import hashlib
import json
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from quantverdict.run.interrupt import AFTER_RECORD, EXIT_CODE, MESSAGE

RUN = ["run", "--models", "cnn,resblock,digits-cnn", "--precisions", "fp32,int8,fp8", "--backends", "onnxruntime"]


def _interrupted(cache: Path, reports: Path, delay_s: float) -> tuple[subprocess.CompletedProcess, float]:
    process = subprocess.Popen([sys.executable, "-m", "quantverdict", *RUN, "--cache-dir", str(cache),
                                "--report-dir", str(reports)], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                               text=True)
    time.sleep(delay_s)
    sent = time.monotonic()
    process.send_signal(signal.SIGINT)
    out, err = process.communicate(timeout=60)
    return subprocess.CompletedProcess(process.args, process.returncode, out, err), time.monotonic() - sent


def _entries_whole(cache: Path) -> list[str]:
    """Artifacts (files beside a ``<name>.json`` sidecar) whose bytes do not match its checksum (none may)."""
    bad = []
    for artifact in cache.rglob("*"):
        sidecar = artifact.with_name(artifact.name + ".json")
        if artifact.is_file() and sidecar.is_file() and "locks" not in artifact.parts:
            if hashlib.sha256(artifact.read_bytes()).hexdigest() != json.loads(sidecar.read_text())["sha256"]:
                bad.append(str(artifact))
    return bad


@pytest.mark.parametrize("warm", [False, True], ids=["cold", "warm"])
def test_ctrl_c_ends_a_run_with_130_one_line_no_record_and_a_whole_cache(tmp_path, warm):
    cache = tmp_path / "cache"
    if warm:
        done = subprocess.run([sys.executable, "-m", "quantverdict", *RUN, "--cache-dir", str(cache),
                               "--report-dir", str(tmp_path / "first")], capture_output=True, text=True, timeout=900)
        assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    for delay_s in (0.3, 1.0, 2.5, 5.0):  # imports; torch's and Polygraphy's; export/calibration or cases
        reports = tmp_path / f"reports-{delay_s}"
        result, elapsed = _interrupted(cache, reports, delay_s)
        if list(reports.glob("run-*.json")):  # a run can finish before a late signal: then it is whole, and said so
            from quantverdict.report.load import load_record

            record = next(reports.glob("run-*.json"))
            assert len(load_record(record).cases) == 9 and f"record: {record}" in result.stdout
            assert result.returncode == 0 or (result.returncode == EXIT_CODE
                                              and result.stderr.strip().splitlines()[-1] == AFTER_RECORD)
            continue
        assert result.returncode == EXIT_CODE, (delay_s, result.returncode, result.stderr[-3000:])
        assert result.stderr.strip().splitlines()[-1] == MESSAGE and "Traceback" not in result.stderr
        assert elapsed < 5, elapsed  # the watchdog's 1.5 s grace, with room for a loaded machine
        assert not list(reports.glob("run-*.json"))  # no record claims a run that did not finish
        assert _entries_whole(cache) == []


STOPPER = """import os, signal, pytest


@pytest.hookimpl(tryfirst=True)
def pytest_sessionfinish(session):  # Ctrl-C at the terminal, as pytest-xdist begins to shut its workers down
    if not hasattr(session.config, "workerinput"):
        os.killpg(os.getpgrp(), signal.SIGINT)
"""


def test_ctrl_c_while_xdist_shuts_down_keeps_the_record_and_prints_no_traceback(tmp_path):
    """Every case had reported when the Ctrl-C came (SIGINT to the whole process group, workers too): the record holds
    them all, and pytest ends as interrupted (2) with one line instead of an 80-line traceback of the shutdown."""
    (tmp_path / "nets.py").write_text("from torch import nn\n\n\ndef net():\n"
                                      "    return nn.Sequential(nn.Flatten(), nn.Linear(12, 4)).eval()\n")
    (tmp_path / "models.yaml").write_text("models:\n  - name: small\n    build: nets:net\n    build_files: []\n"
                                          "    inputs: [{name: x, shape: [2, 3, 4]}]\n    outputs: [y]\n"
                                          "    calibration: synthetic\n")
    (tmp_path / "pyproject.toml").write_text('[tool.quantverdict]\nmanifest = "models.yaml"\ncache-dir = "cache"\n')
    (tmp_path / "conftest.py").write_text(STOPPER)
    proc = subprocess.run([sys.executable, "-m", "pytest", "-q", "-n", "2", "-p", "no:cacheprovider", "-m",
                           "(fp32 or fp16) and onnxruntime", f"--qv-report-dir={tmp_path / 'out'}"],
                          capture_output=True, text=True, cwd=tmp_path, timeout=600, start_new_session=True)
    output = proc.stdout + proc.stderr
    assert proc.returncode == pytest.ExitCode.INTERRUPTED, output[-3000:]
    assert "Traceback" not in output and "interrupted while pytest shut down" in output, output[-3000:]
    [record] = [json.loads(path.read_text()) for path in (tmp_path / "out").glob("run-*.json")]
    assert sorted(case["id"] for case in record["cases"]) == ["small-fp16-onnxruntime", "small-fp32-onnxruntime"]


HOLDER = """import os, signal, time
from quantverdict.run.interrupt import exit_within, held

with exit_within():
    with held():
        print("record: written", flush=True)
        os.kill(os.getpid(), signal.SIGINT)  # lands while the record is written: the block ends first
        time.sleep(0.2)
        print("path printed", flush=True)
    print("after the block", flush=True)
"""


def test_a_ctrl_c_while_the_record_is_written_ends_the_run_after_its_path_is_printed_and_says_so():
    result = subprocess.run([sys.executable, "-c", HOLDER], capture_output=True, text=True, timeout=60)
    assert result.returncode == EXIT_CODE, result.stderr
    assert result.stdout.splitlines() == ["record: written", "path printed"]
    assert result.stderr.strip().splitlines() == [AFTER_RECORD]


def test_a_ctrl_c_outside_the_held_block_ends_the_run_at_once_with_no_record_claimed():
    result = subprocess.run([sys.executable, "-c", HOLDER.replace("with held():", "if True:")], capture_output=True,
                            text=True, timeout=60)
    assert result.returncode == EXIT_CODE and result.stdout.splitlines() == ["record: written"]
    assert result.stderr.strip().splitlines() == [MESSAGE]


WORKING = """
import signal, sys, time
from quantverdict.run.interrupt import STOPPING, exit_within, on_sigint
from quantverdict.scratch import work_folder

for signum in STOPPING:
    signal.signal(signum, on_sigint)
with exit_within():
    with work_folder("layers") as folder:
        (folder / "work.pkl").write_bytes(bytes(1 << 20))  # what a search's layer workers read
        print(folder, flush=True)
        time.sleep(60)
"""


def test_cis_timeout_signal_to_the_process_alone_ends_it_as_ctrl_c_does_and_leaves_no_work_folder():
    """``timeout`` sends SIGTERM to the process, not its group: one line, exit 143 (128 + SIGTERM), and its work
    folder removed now, not by the next run (a killed ``lock`` left 141 MB there)."""
    process = subprocess.Popen([sys.executable, "-c", WORKING], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                               text=True)
    folder = Path(process.stdout.readline().strip())
    assert folder.is_dir()
    process.send_signal(signal.SIGTERM)
    out, err = process.communicate(timeout=60)
    assert process.returncode == 128 + signal.SIGTERM, err
    assert err.strip().splitlines() == [MESSAGE] and not folder.exists()
