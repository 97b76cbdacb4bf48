"""Run records, the rendered report, the release gate, and the record under pytest-xdist."""
import html
import json
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from quantverdict.run.pipeline import Case, Pipeline
from quantverdict.report.record import build_record, write_record

REPO = Path(__file__).resolve().parent.parent
CHROMIUM = shutil.which("chromium")


@pytest.fixture(scope="module")
def record_path(tmp_path_factory, qv_pipeline):
    """A real, timed run of the digits task and the CNN in FP32 and INT8."""
    pipeline = Pipeline(qv_pipeline.cache.root, timing=True)
    cases = [Case(m, p, "onnxruntime") for m in ("digits-cnn", "cnn") for p in ("fp32", "int8", "fp8")]
    cases.append(Case("cnn", "tf32", "onnxruntime"))  # skipped on a CPU: its reason is reported
    import time

    record = build_record([pipeline.run(c).to_dict() for c in cases], pipeline.caps, time.time())
    return write_record(record, tmp_path_factory.mktemp("runs"))


def harness(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "quantverdict", *args], capture_output=True, text=True, cwd=REPO)


def test_record_holds_environment_and_every_case(record_path):
    record = json.loads(record_path.read_text())
    assert record["schema_version"] == 1 and record["summary"] == {"passed": 6, "skipped": 1}
    assert {"gpu", "packages", "python", "git_commit"} <= set(record["environment"])
    digits = next(c for c in record["cases"] if c["id"] == "digits-cnn-int8-onnxruntime")
    assert digits["metrics"]["task"]["reference_accuracy"] >= 0.93 and "latency" in digits["metrics"]  # 2x its error
    skipped = next(c for c in record["cases"] if c["status"] == "skipped")
    assert "CUDA execution provider" in skipped["message"]


def test_gate_passes_identical_runs(record_path):
    proc = harness("gate", "--baseline", str(record_path), "--current", str(record_path))
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert proc.stdout.strip().endswith("0 regression(s), 0 improvement(s)")


def _variant(record_path: Path, tmp_path: Path, change) -> Path:
    record = json.loads(record_path.read_text())
    change(record)
    path = tmp_path / f"current-{len(list(tmp_path.glob('current-*')))}.json"
    path.write_text(json.dumps(record))
    return path


def _skip_all(record: dict) -> None:
    for case in record["cases"]:
        case.update(status="skipped", message="int8 on onnxruntime: not installed here", metrics={})


def test_the_gate_never_passes_what_did_not_run(record_path, tmp_path):
    """Every case skipped, one case missing, one errored, a passed case without metrics: each its own line, exit 1;
    a run with no cases is bad input, exit 2."""
    skipped = harness("gate", "--baseline", str(record_path), "--current", str(_variant(record_path, tmp_path, _skip_all)))
    assert skipped.returncode == 1, skipped.stdout + skipped.stderr
    assert "REGRESSION: cnn-int8-onnxruntime: judged in the baseline (passed), skipped now: int8 on onnxruntime: " \
           "not installed here" in skipped.stdout
    assert "REGRESSION: the current run judged none of its 7 case(s): nothing passed the gate" in skipped.stdout
    assert "skipped: cnn-tf32-onnxruntime: " in skipped.stdout

    def mixed(record: dict) -> None:
        record["cases"] = [c for c in record["cases"] if c["id"] != "cnn-fp8-onnxruntime"]
        by_id = {c["id"]: c for c in record["cases"]}
        by_id["digits-cnn-fp8-onnxruntime"].update(status="error", message="worker 'gw1' crashed")
        by_id["cnn-fp32-onnxruntime"]["metrics"] = {}

    proc = harness("gate", "--baseline", str(record_path), "--current", str(_variant(record_path, tmp_path, mixed)))
    assert proc.returncode == 1
    for line in ("cnn-fp8-onnxruntime: judged in the baseline (passed), missing from the current run",
                 "cnn-fp32-onnxruntime: passed with no metrics: nothing was judged"):
        assert f"REGRESSION: {line}" in proc.stdout, proc.stdout
    assert "REGRESSION: digits-cnn-fp8-onnxruntime: was passed, now error" in proc.stdout

    empty = harness("gate", "--baseline", str(record_path), "--current",
                    str(_variant(record_path, tmp_path, lambda record: record.update(cases=[]))))
    assert empty.returncode == 2 and "holds no cases" in empty.stderr, empty.stdout + empty.stderr


def test_a_gate_policy_names_the_cases_a_runner_may_leave_unjudged(record_path, tmp_path):
    """--gate-policy (it crashed on every file): allow_unjudged lets named cases be skipped, and only those."""
    policy = tmp_path / "gate.yaml"
    policy.write_text('allow_unjudged: ["*-fp8-*"]\n')

    def fp8_skipped(record: dict) -> None:
        for case in record["cases"]:
            if case["precision"] == "fp8":
                case.update(status="skipped", message="fp8 needs a GPU of compute capability ≥ 8.9", metrics={})

    current = str(_variant(record_path, tmp_path, fp8_skipped))
    allowed = harness("gate", "--baseline", str(record_path), "--current", current, "--gate-policy", str(policy))
    assert allowed.returncode == 0, allowed.stdout + allowed.stderr
    assert "skipped: cnn-fp8-onnxruntime: fp8 needs a GPU" in allowed.stdout
    strict = harness("gate", "--baseline", str(record_path), "--current", current)
    assert strict.returncode == 1 and "cnn-fp8-onnxruntime: judged in the baseline (passed), skipped now" in strict.stdout


def test_gate_fails_on_two_points_lost_and_names_the_case(record_path, tmp_path):
    current = json.loads(record_path.read_text())
    case = next(c for c in current["cases"] if c["id"] == "digits-cnn-int8-onnxruntime")
    case["metrics"]["task"]["accuracy"] -= 0.02
    case["metrics"]["task"]["accuracy_drop_points"] += 2.0
    current["cases"] = [c for c in current["cases"] if c["id"] != "cnn-fp8-onnxruntime"]
    path = tmp_path / "current.json"
    path.write_text(json.dumps(current))
    proc = harness("gate", "--baseline", str(record_path), "--current", str(path))
    assert proc.returncode == 1
    assert "REGRESSION: digits-cnn-int8-onnxruntime: task accuracy" in proc.stdout
    assert "(-2.00 points), limit −1" in proc.stdout
    assert "only in baseline: cnn-fp8-onnxruntime" in proc.stdout  # listed, never dropped


def test_gate_fails_on_a_case_that_stopped_passing(record_path, tmp_path):
    current = json.loads(record_path.read_text())
    case = next(c for c in current["cases"] if c["id"] == "cnn-fp8-onnxruntime")
    case["status"], case["message"] = "failed", "cnn-fp8-onnxruntime vs FP32 reference:\nlogits: cosine = 0.9"
    path = tmp_path / "current.json"
    path.write_text(json.dumps(current))
    proc = harness("gate", "--baseline", str(record_path), "--current", str(path))
    assert proc.returncode == 1 and "REGRESSION: cnn-fp8-onnxruntime: was passed, now failed" in proc.stdout


@pytest.mark.int8
def test_gate_names_a_layer_left_in_float_though_another_came_back(qv_pipeline, tmp_path):
    """Two real runs of resblock's INT8 case, each keeping a different weighted layer in float (as a
    fallback that chose differently would): the counts agree, but a layer quantized in the baseline is
    float now, and the gate names it."""
    import time

    from quantverdict.judge.sensitivity import weighted_layers

    store = qv_pipeline.store
    recipe = qv_pipeline.recipes.recipe("resblock", "int8", "emulated")
    first, second = [node.name for node in weighted_layers(store, "resblock", recipe)][:2]
    paths = []
    for run, kept in (("baseline", first), ("current", second)):
        pipeline = Pipeline(qv_pipeline.cache.root, recipe_settings={"int8": {"exclude": [kept]}})
        result = pipeline.run(Case("resblock", "int8", "onnxruntime"))
        assert result.metrics["recipe"]["coverage"]["float_layers"] == [kept]
        (tmp_path / run).mkdir()
        paths.append(write_record(build_record([result.to_dict()], pipeline.caps, time.time()), tmp_path / run))
    proc = harness("gate", "--baseline", str(paths[0]), "--current", str(paths[1]))
    assert proc.returncode == 1
    assert f"1 layer(s) quantized in the baseline left in float: {second}" in proc.stdout


@pytest.mark.parametrize("content, message", [
    ('{"schema_version": 1, "cases": [', "is not valid JSON"),
    ('{"schema_version": 99, "cases": []}', "has schema_version 99; this harness reads schema_version 1"),
    ('{"cases": []}', "is not a run record (no schema_version)"),
])
def test_gate_bad_input_exits_2_with_the_file_named(record_path, tmp_path, content, message):
    bad = tmp_path / "bad.json"
    bad.write_text(content)
    proc = harness("gate", "--baseline", str(record_path), "--current", str(bad))
    assert proc.returncode == 2
    assert proc.stderr.startswith(f"error: run record {bad} " if "JSON" in message else f"error: {bad} ")
    assert message in proc.stderr and len(proc.stderr.strip().splitlines()) == 1
    missing = harness("gate", "--baseline", str(tmp_path / "nope.json"), "--current", str(record_path))
    assert missing.returncode == 2 and "run record not found" in missing.stderr


def _edited(record_path, tmp_path, edit) -> Path:
    record = json.loads(record_path.read_text())
    edit(record)
    path = tmp_path / "edited.json"
    path.write_text(json.dumps(record))
    return path


def _int8(record):
    return next(c for c in record["cases"] if c["id"] == "digits-cnn-int8-onnxruntime")


@pytest.mark.parametrize("edit, path", [
    (lambda r: r["cases"].__setitem__(0, 7), "cases[0]: Input should be a valid dictionary"),
    (lambda r: _int8(r).__setitem__("metrics", [1, 2]), "case 'digits-cnn-int8-onnxruntime': cases[1].metrics:"),
    (lambda r: _int8(r)["metrics"]["metrics"]["logits"].__setitem__("cosine", "0.99"),
     "cases[1].metrics.metrics.logits.cosine: Input should be a valid number"),
    (lambda r: r.pop("environment"), "environment: required field missing"),
    (lambda r: r.__setitem__("environment", None), "environment: Input should be a valid dictionary"),
    (lambda r: _int8(r).__setitem__("status", "exploded"), "cases[1].status: 'exploded' is not one of passed"),
    (lambda r: r.__setitem__("cases", {"a": 1}), "cases: Input should be a valid list"),
])
def test_a_record_of_the_wrong_shape_is_bad_input_named_by_field(record_path, tmp_path, edit, path):
    """Malformed records end as exit 2 (bad input) with the field's path, never as a traceback with the gate's
    regression code 1."""
    proc = harness("gate", "--baseline", str(record_path), "--current", str(_edited(record_path, tmp_path, edit)))
    assert proc.returncode == 2 and "Traceback" not in proc.stderr, proc.stderr
    assert path in proc.stderr, proc.stderr


@pytest.mark.parametrize("edit, words", [
    (lambda r: [_int8(r)["metrics"]["metrics"]["logits"].__setitem__("cosine", float("nan")),
                _int8(r)["metrics"]["task"].__setitem__("accuracy", float("nan"))], "logits cosine is nan, not a number"),
    (lambda r: _int8(r)["metrics"]["recipe"]["metrics"]["logits"].__setitem__("snr_db", float("-inf")),
     "recipe logits snr_db is -inf"),
    (lambda r: r["cases"].append({**_int8(r), "status": "failed"}), "2 copies in the current run (passed, failed)"),
])
def test_the_gate_fails_a_run_whose_metrics_are_not_numbers_or_whose_cases_repeat(record_path, tmp_path, edit,
                                                                                   words):
    proc = harness("gate", "--baseline", str(record_path), "--current", str(_edited(record_path, tmp_path, edit)))
    assert proc.returncode == 1 and words in proc.stdout, proc.stdout + proc.stderr


def test_markdown_and_page_are_written(record_path, tmp_path):
    history = tmp_path / "history"
    history.mkdir()
    for i in range(2):
        older = json.loads(record_path.read_text())
        older["started"] = f"2026-11-0{i + 1}T00:00:00+0000"
        (history / f"run-old{i}.json").write_text(json.dumps(older))
    proc = harness("report", str(record_path), "--history", str(history), "--out-dir", str(tmp_path))
    assert proc.returncode == 0, proc.stderr
    markdown = (tmp_path / f"{record_path.stem}.md").read_text()
    assert "| digits-cnn | int8 | onnxruntime |" in markdown and "## Skipped" in markdown
    page = (tmp_path / f"{record_path.stem}.html").read_text()
    for title in ("Accuracy matrix", "Task-accuracy change vs FP32", "Speedup over FP32", "Trend over the history"):
        assert title in page
    assert page.count("data:image/png;base64,") == 5


@pytest.mark.skipif(CHROMIUM is None, reason="Debian's chromium not installed (apt-get install chromium; .ci/run does)")
def test_page_renders_in_headless_chromium(record_path, tmp_path):
    assert harness("report", str(record_path), "--out-dir", str(tmp_path)).returncode == 0
    page = tmp_path / f"{record_path.stem}.html"
    flags = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
             "--disable-background-networking", "--disable-component-update", "--disable-sync",
             f"--user-data-dir={tmp_path / 'profile'}"]
    dom = subprocess.run([CHROMIUM, *flags, "--dump-dom", page.as_uri()], capture_output=True, text=True, timeout=120)
    assert 'class="matrix"' in dom.stdout and dom.stdout.count("<img") == 4  # no history: no trend chart
    shot = tmp_path / "page.png"
    subprocess.run([CHROMIUM, *flags, f"--screenshot={shot}", "--window-size=1400,2400", page.as_uri()],
                   capture_output=True, timeout=120, check=True)
    import matplotlib.image

    pixels = matplotlib.image.imread(str(shot))[..., :3]
    assert pixels.shape[:2] == (2400, 1400)
    colours = np.unique((pixels.reshape(-1, 3) * 255).astype(np.uint8), axis=0)
    assert len(colours) > 50  # charts and a coloured matrix, not a blank or single-colour page
    assert (pixels.mean(axis=2) < 0.5).mean() > 0.005  # some dark ink (text, axes) on the page


def test_record_merges_cases_from_xdist_workers(tmp_path):
    proc = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-n", "2", "-p", "no:cacheprovider", "fixtures/models.yaml",
         "--qv-models", "mlp,cnn", "--qv-precisions", "fp32,int8", "--qv-backends", "onnxruntime",
         f"--qv-report-dir={tmp_path}"], capture_output=True, text=True, cwd=REPO, timeout=600)
    assert proc.returncode == 0, proc.stdout[-2000:]
    [record] = [json.loads(p.read_text()) for p in tmp_path.glob("run-*.json")]
    assert sorted(c["id"] for c in record["cases"]) == [
        "cnn-fp32-onnxruntime", "cnn-int8-onnxruntime", "mlp-fp32-onnxruntime", "mlp-int8-onnxruntime"]


def test_a_crashed_xdist_workers_case_is_an_error_in_the_record(tmp_path):
    """A worker killed while running a case (a factory that SIGKILLs its process): xdist reports the crash, and the
    record holds that case as an error naming it, beside the cases that ran, so no gate can pass without it."""
    (tmp_path / "crashing.py").write_text(
        "import os\nimport signal\nfrom torch import nn\n\n\ndef net():\n    os.kill(os.getpid(), signal.SIGKILL)\n\n\n"
        "def fine():\n    return nn.Sequential(nn.Flatten(), nn.Linear(12, 4)).eval()\n")
    entry = ("  - name: {0}\n    build: crashing:{1}\n    build_files: []\n    inputs: [{{name: x, shape: [2, 3, 4]}}]\n"
             "    outputs: [y]\n    calibration: synthetic\n")
    (tmp_path / "models.yaml").write_text("models:\n" + entry.format("dies", "net") + entry.format("lives", "fine"))
    (tmp_path / "pyproject.toml").write_text('[tool.quantverdict]\nmanifest = "models.yaml"\ncache-dir = "cache"\n')
    proc = subprocess.run([sys.executable, "-m", "pytest", "-q", "-n", "2", "-p", "no:cacheprovider", "-m", "fp32 and onnxruntime",
                           f"--qv-report-dir={tmp_path / 'out'}"], capture_output=True, text=True, cwd=tmp_path, timeout=600)
    assert proc.returncode == 1 and "crashed" in proc.stdout, proc.stdout[-2000:]
    [record] = [json.loads(p.read_text()) for p in (tmp_path / "out").glob("run-*.json")]
    statuses = {case["id"]: (case["status"], case["message"]) for case in record["cases"]}
    assert statuses["lives-fp32-onnxruntime"][0] == "passed"
    assert statuses["dies-fp32-onnxruntime"][0] == "error" and "crashed while running" in statuses["dies-fp32-onnxruntime"][1]


PAYLOAD = "<script>document.documentElement.setAttribute('data-pwned','script')</script>" \
          "<img src=x onerror=\"document.documentElement.setAttribute('data-pwned','img')\">\"'"


def _poisoned(node, key=""):
    """Every string of a record with markup appended (statuses kept: they steer the renderer's logic)."""
    if isinstance(node, dict):
        return {k: _poisoned(v, k) for k, v in node.items()}
    if isinstance(node, list):
        return [_poisoned(v, key) for v in node]
    return node + PAYLOAD if isinstance(node, str) and key not in ("status", "schema_version") else node


@pytest.mark.skipif(CHROMIUM is None, reason="Debian's chromium not installed (apt-get install chromium; .ci/run does)")
def test_no_field_of_a_record_renders_as_markup_in_chromium(record_path, tmp_path):
    """An ONNX file from a pull request names its nodes and ops; a record can carry anything. Markup in any
    string of a record (case ids, messages, first diverging node and op, runner class, skip reasons…) is
    shown as text: the page has no script of its own, and headless Chromium runs none of the record's."""
    from quantverdict.report.load import check_record
    from quantverdict.report.render import html_page

    record = json.loads(record_path.read_text())
    failing = next(c for c in record["cases"] if c["status"] == "passed" and c["precision"] == "int8")
    failing.update(status="failed", message="the recipe regressed")
    failing["metrics"]["first_divergence"] = {"node": "conv", "op": "Conv", "tensor": "t", "summary": "cosine 0.5"}
    record = _poisoned(record)
    page = tmp_path / "hostile.html"
    page.write_text(html_page(check_record(record, "hostile"), []))
    import re
    from html.parser import HTMLParser

    class Tags(HTMLParser):
        found: list[tuple[str, list[str]]] = []

        def handle_starttag(self, tag, attrs):
            self.found.append((tag, [name for name, _ in attrs]))

    parser = Tags()
    parser.feed(page.read_text())
    assert parser.found and not [(tag, names) for tag, names in parser.found
                                 if tag in ("script", "iframe", "object") or any(n.startswith("on") for n in names)]
    flags = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
             "--disable-background-networking", "--disable-component-update", "--disable-sync",
             f"--user-data-dir={tmp_path / 'profile'}"]
    dom = subprocess.run([CHROMIUM, *flags, "--dump-dom", page.as_uri()], capture_output=True, text=True, timeout=120)
    assert "Accuracy run" in dom.stdout and "first diverging layer" in dom.stdout
    assert not re.search(r"<html[^>]*data-pwned", dom.stdout)  # the attribute the markup would set: nothing ran


def test_a_page_of_thousands_of_cases_draws_the_most_telling_ones(record_path):
    """A bar per case is unreadable (and matplotlib's tick layout did not finish in 10 minutes for 100,000):
    each per-case chart keeps the 60 of lowest SNR, accuracy change or speedup, and says so."""
    import copy

    from quantverdict.report.charts import MAX_BARS, most_telling
    from quantverdict.report.load import check_record
    from quantverdict.report.render import html_page

    record = json.loads(record_path.read_text())
    ran = [c for c in record["cases"] if c["status"] == "passed" and c["precision"] != "fp32"]
    record["cases"] = [dict(copy.deepcopy(case), id=f"{case['id']}-{i}") for i in range(400) for case in ran]
    kept, note = most_telling(record["cases"], lambda c: c["metrics"]["metrics"]["logits"]["snr_db"])
    assert len(kept) == MAX_BARS and note == f" ({MAX_BARS} lowest of {len(record['cases'])})"
    worst = min(c["metrics"]["metrics"]["logits"]["snr_db"] for c in record["cases"])
    assert min(c["metrics"]["metrics"]["logits"]["snr_db"] for c in kept) == worst
    assert html_page(check_record(record, "many"), []).count("data:image/png;base64,") >= 3


def test_a_record_round_trips_through_its_types(record_path):
    """Results are data: a record's cases read back as CaseResult and its whole as the schema's RunRecord,
    and both write back what they read."""
    from quantverdict.report.schema import RunRecord
    from quantverdict.run.cases import CaseResult

    record = json.loads(record_path.read_text())
    assert [CaseResult.from_dict(case).to_dict() for case in record["cases"]] == record["cases"]
    typed = RunRecord.model_validate(record)
    assert typed.cases[1].metrics.recipe is not None and typed.cases[1].metrics.recipe.coverage.quantized == 4
    assert typed.model_dump(exclude_unset=True) == record


def test_records_that_are_no_regular_file_or_carry_nulls_or_dollars_are_read_without_a_crash(record_path, tmp_path):
    """A FIFO (it blocked the gate forever) and a link to /dev/zero (it skipped the size check) are refused with
    one line, exit 2; null cosine/SNR, which the schema accepts, no longer crash the gate; a '$' in a case id
    (reachable through the fixture's name=) is drawn as text, not parsed as TeX, on the page."""
    import os

    os.mkfifo(tmp_path / "fifo.json")
    os.symlink("/dev/zero", tmp_path / "zero.json")
    for name in ("fifo.json", "zero.json"):
        proc = subprocess.run([sys.executable, "-m", "quantverdict", "gate", "--baseline", str(record_path), "--current",
                               str(tmp_path / name)], capture_output=True, text=True, cwd=REPO, timeout=60)
        assert proc.returncode == 2 and proc.stderr.strip() == f"error: run record {tmp_path / name} is not a regular file"

    def nulls_and_dollars(record: dict) -> None:
        for case in record["cases"]:
            case["id"] = case["id"].replace("-", "$x^{", 1) if case["status"] == "passed" else case["id"]
            for values in (case.get("metrics") or {}).get("metrics", {}).values():
                values.update(cosine=None, snr_db=None)

    current = _variant(record_path, tmp_path, nulls_and_dollars)
    gate = harness("gate", "--baseline", str(record_path), "--current", str(current))
    assert gate.returncode in (0, 1) and "Traceback" not in gate.stderr, gate.stderr
    report = harness("report", str(current), "--out-dir", str(tmp_path / "page"))
    assert report.returncode == 0 and "Traceback" not in report.stderr, report.stderr[-2000:]


def test_shards_that_break_the_schema_and_destinations_that_cannot_be_written_are_bad_input(record_path, tmp_path):
    """merge of a shard without its count, or with shard "2/2" (KeyError, TypeError before); report, merge and
    history --page into a folder that cannot be made (a traceback, history's read as 'regression'), or onto a pipe or
    a device (replaced by a regular file where the process had the rights): exit 2, one line, and the pipe left as it
    was."""
    no_count = _variant(record_path, tmp_path, lambda record: record.update(shard={"index": 2}))
    as_text = _variant(record_path, tmp_path, lambda record: record.update(shard="2/2"))
    one = _variant(record_path, tmp_path, lambda record: record.update(shard={"index": 1, "count": 2}))
    two = _variant(record_path, tmp_path, lambda record: record.update(shard={"index": 2, "count": 2}, cases=[]))
    unwritable = Path("/proc/quantverdict-test/out")
    for command, expected in (
            (("merge", str(one), str(no_count), "--out", str(tmp_path / "m.json")), f"{no_count}: shard.count: "),
            (("merge", str(one), str(as_text), "--out", str(tmp_path / "m.json")), f"{as_text}: shard: "),
            (("report", str(record_path), "--out-dir", str(unwritable)), f"cannot write the report to {unwritable}"),
            (("merge", str(one), "--out", str(unwritable / "m.json")), f"cannot write the merged record to {unwritable}"),
            (("history", "--history-db", str(tmp_path / "none.sqlite"), "--page", str(unwritable / "h.html")),
             f"cannot write the history page to {unwritable}")):
        proc = harness(*command)
        assert proc.returncode == 2 and "Traceback" not in proc.stderr, (command, proc.stderr[-1500:])
        [line] = proc.stderr.strip().splitlines()
        assert expected in line, line
    import os
    import stat

    from quantverdict.report.history import open_history

    pipe = tmp_path / "pipe"  # as /dev/full is: a file that is no regular file, renamed over by a root process before
    os.mkfifo(pipe)
    open_history(tmp_path / "empty.sqlite").close()
    for command in (("merge", str(one), str(two), "--out", str(pipe)),
                    ("history", "--history-db", str(tmp_path / "empty.sqlite"), "--page", str(pipe))):
        proc = harness(*command)
        assert proc.returncode == 2 and "Traceback" not in proc.stderr, (command, proc.stderr[-1500:])
        [line] = proc.stderr.strip().splitlines()
        assert f"{pipe}: not a regular file" in line and stat.S_ISFIFO(pipe.stat().st_mode), line


def test_near_valid_records_are_judged_or_refused_by_every_reader_never_crash_them(record_path, tmp_path):
    """Hypothesis replaces values anywhere in a real record (nulls, strings, NaN, nested values): every record the
    schema accepts is read by the gate, the Markdown and the page, merged as a shard, and judged by --qv-baseline's
    rules without an exception; every other one is refused as bad input (RecordError)."""
    from hypothesis import given, settings

    from near_valid import changes, mutated
    from quantverdict.report.gate import gate, judge_case, load_policy, rules_for
    from quantverdict.report.load import RecordError, check_record
    from quantverdict.report.merge import merge_records
    from quantverdict.report.render import html_page, markdown

    document = json.loads(record_path.read_text())
    original, policy = check_record(document, "original"), load_policy(None)

    @settings(max_examples=100, deadline=None, derandomize=True)
    @given(changes())
    def check(edits):
        edited = mutated(document, edits)
        try:
            record = check_record(edited, "mutated")
        except RecordError:
            return
        gate(original, record, policy).report()
        gate(record, original, policy).report()
        markdown(record)
        html_page(record, [original], [])
        for case in record.cases:
            old = next((c for c in original.cases if c.id == case.id), None)
            if old is not None:
                judge_case(case.id, old, case, rules_for(policy, case.precision), True)
        try:
            merge_records([check_record({**edited, "shard": {"index": 1, "count": 1}}, "shard")], ["shard.json"])
        except RecordError:
            pass

    check()


def test_text_from_a_record_reads_as_text_in_the_markdown(record_path):
    """A case id and a message full of Markdown (emphasis, a link, a code span, a pipe, HTML), parsed by a CommonMark
    parser: the same text comes back, in the table's own columns, with no element the record's text made."""
    from markdown_it import MarkdownIt

    from quantverdict.report.load import check_record
    from quantverdict.report.render import markdown

    record = json.loads(record_path.read_text())
    hostile = "*a*_b_ [l](http://x) `c` | <b>d</b> ~~e~~ \\"
    case = _int8(record)
    case.update(id=f"{hostile}-int8-onnxruntime", model=hostile, status="failed", message=f"worse: {hostile}")
    html_text = MarkdownIt("commonmark").enable("table").enable("strikethrough").render(
        markdown(check_record(record, "hostile")))
    for tag in ("<em>", "<a ", "<code>", "<b>", "<s>"):  # (the verdict of a failed row is bold on purpose)
        assert tag not in html_text, tag
    assert html_text.count("*a*_b_ [l](http://x) `c` | &lt;b&gt;d&lt;/b&gt; ~~e~~ \\") == 3  # row, id, message
    table = html_text[:html_text.index("</table>")]
    row = next(line for line in table.split("<tr>") if "*a*" in line)
    assert row.count("<td>") == table[:table.index("</thead>")].count("<th>")


def _null_metrics(record: dict) -> None:
    for case in record["cases"]:
        for output in case["metrics"].get("metrics", {}).values():
            output.update(cosine=None, snr_db=None, max_norm_err=None, top1_agreement=None)


def _nan_baseline(record: dict) -> None:
    for case in record["cases"]:
        for output in case["metrics"].get("metrics", {}).values():
            output.update(cosine=float("nan"))


def test_the_gate_refuses_to_pass_metrics_it_cannot_compare(record_path, tmp_path):
    """A current run whose metrics are all null (schema-valid) passed with "0 regression(s)"; a baseline whose
    cosines are NaN compared nothing and said nothing. Each is a regression naming the case and the metric."""
    proc = harness("gate", "--baseline", str(record_path), "--current", str(_variant(record_path, tmp_path,
                                                                                      _null_metrics)))
    assert proc.returncode == 1 and "cosine is not recorded now (baseline" in proc.stdout, proc.stdout
    proc = harness("gate", "--baseline", str(_variant(record_path, tmp_path, _nan_baseline)), "--current",
                   str(record_path))
    assert proc.returncode == 1 and "the baseline's cosine is nan: it cannot be compared" in proc.stdout, proc.stdout


def _drop_recipe(record: dict) -> dict:
    """The INT8 digits case 10 dB worse in its recipe's semantics (what the gate compares across runner classes)."""
    case = _int8(record)
    for output in case["metrics"]["recipe"]["metrics"].values():
        output["snr_db"] -= 10
    return case


def _drop_cosine(record: dict) -> dict:
    """The INT8 digits case 3 points of cosine worse in its runtime's outputs (a regression by the gate's rules)."""
    case = _int8(record)
    for output in case["metrics"]["metrics"].values():
        output["cosine"] -= 0.03
        output["snr_db"] -= 10
    return case


def _another_runner_class(record: dict) -> str:
    """A runner class other than the one that wrote ``record``, whichever kind of CPU that was (an AVX2-only runner
    writes "x86_64 avx2; no GPU" itself)."""
    avx2 = "x86_64 avx2; no GPU"
    return "x86_64 avx512_vnni; no GPU" if record["environment"]["runner_class"] == avx2 else avx2


def _moved_line(record_path, tmp_path, edit) -> str:
    proc = harness("gate", "--baseline", str(record_path), "--current", str(_edited(record_path, tmp_path, edit)))
    assert proc.returncode == 1, proc.stdout + proc.stderr
    return next(line for line in proc.stdout.splitlines() if line.startswith("why: digits-cnn-int8-onnxruntime: "))


def test_a_record_holds_each_cases_fingerprint(record_path):
    cases = {case["id"]: case for case in json.loads(record_path.read_text())["cases"]}
    int8, fp32 = cases["digits-cnn-int8-onnxruntime"]["metrics"]["fingerprint"], cases["digits-cnn-fp32-onnxruntime"][
        "metrics"]["fingerprint"]
    assert set(int8) == {"graph", "evaluation", "calibration", "recipe", "qdq", "tolerance"}
    assert set(fp32) == {"graph", "evaluation", "recipe", "tolerance"} and fp32["graph"] == int8["graph"]
    assert fp32["recipe"] != int8["recipe"] and len(int8["graph"]) == 64


@pytest.mark.parametrize("edit, said", [
    (lambda r: _drop_cosine(r)["metrics"]["fingerprint"].__setitem__("graph", "0" * 64), "moved: the FP32 graph"),
    (lambda r: _drop_cosine(r)["metrics"]["fingerprint"].__setitem__("calibration", "1" * 64),
     "moved: the calibration data"),
    (lambda r: [_drop_cosine(r)["metrics"]["fingerprint"].__setitem__("recipe", "2" * 64),
                _int8(r)["metrics"]["fingerprint"].__setitem__("qdq", "3" * 64)],
     "moved: the recipe settings, the precision graph"),
    (lambda r: [_drop_cosine(r), r["environment"]["packages"].__setitem__("onnxruntime", "9.9.9")],
     "moved: onnxruntime "),
    (lambda r: _drop_cosine(r)["metrics"]["fingerprint"].__setitem__("tolerance", "6" * 64), "moved: the tolerance"),
    (lambda r: [_drop_recipe(r), r["environment"].__setitem__("runner_class", _another_runner_class(r))],
     "moved: the runner class ("),  # across runner classes the gate compares recipe semantics only
    (lambda r: _drop_cosine(r), "moved: nothing the records hold (graph, data, recipe, tolerance, packages and runner)"),
])
def test_the_gate_says_what_moved_beside_a_regression(record_path, tmp_path, edit, said):
    """Pairs of runs that differ in one component (or two): the gate names each that moved, and where the recipe's
    graph and semantics are the same in both, that the runtime moved."""
    line = _moved_line(record_path, tmp_path, edit)
    assert said in line, line
    same_recipe = "the runtime moved, not the recipe" in line
    assert same_recipe == ("precision graph" not in said and "runner class" not in said), line  # (its semantics moved)


def test_the_gate_names_an_engine_built_with_other_options(record_path, tmp_path):
    """Two runs of a case whose engines were built with other TensorRT options (the runner's description keys them):
    the engine moved, said beside the regression (engines are built on GPU runners only; the records are edited)."""
    def engine(key: str):
        return lambda r: _int8(r)["metrics"]["fingerprint"].__setitem__("engine", key * 64)

    (tmp_path / "base").mkdir()
    base = _edited(record_path, tmp_path / "base", engine("5"))
    proc = harness("gate", "--baseline", str(base), "--current",
                   str(_edited(record_path, tmp_path, lambda r: [engine("4")(r), _drop_cosine(r)])))
    assert proc.returncode == 1, proc.stdout + proc.stderr
    assert "moved: the engine's build options (TensorRT's flags, shapes, GPU)" in proc.stdout, proc.stdout


def test_the_gate_names_an_engine_whose_build_chose_other_tactics(record_path, tmp_path):
    """Two runs whose engines were built with the same options but are other bytes (TensorRT's builder is not
    deterministic; its timing cache decides its tactics): the engine moved, its options did not (records edited)."""
    def plan(key: str):
        return lambda r: [_int8(r)["metrics"]["fingerprint"].__setitem__("engine", "5" * 64),
                          _int8(r)["metrics"]["fingerprint"].__setitem__("plan", key * 64)]

    (tmp_path / "base").mkdir()
    base = _edited(record_path, tmp_path / "base", plan("7"))
    proc = harness("gate", "--baseline", str(base), "--current",
                   str(_edited(record_path, tmp_path, lambda r: [plan("8")(r), _drop_cosine(r)])))
    assert proc.returncode == 1, proc.stdout + proc.stderr
    assert "moved: the engine (the tactics its build chose: TensorRT's timing cache and builder)" in proc.stdout
    assert "build options" not in proc.stdout, proc.stdout


def test_a_record_without_its_summary_still_makes_its_page(record_path, tmp_path):
    """A probe that once raised KeyError: the summary is derived from the cases where a record lacks it."""
    proc = harness("report", str(_variant(record_path, tmp_path, lambda record: record.pop("summary"))), "--out",
                   str(tmp_path / "page"))
    assert proc.returncode == 0 and "Traceback" not in proc.stderr, proc.stderr[-2000:]
    assert list((tmp_path / "page").glob("*.html"))


@pytest.mark.skipif(CHROMIUM is None, reason="Debian's chromium not installed (apt-get install chromium; .ci/run does)")
def test_the_pages_first_screen_says_what_failed_by_which_bound_and_what_to_do_next(record_path, tmp_path):
    """A case whose recipe broke its max_norm_err bound while its SNR is high, its recipe from a lock whose search said
    what the bounds would take: rendered in Chromium, the text above the matrix names the case, the bound and whose
    outputs broke it, and the lock's word as the next step; the matrix cell shows the broken bound, not the SNR; no
    chart label is raw mathtext."""
    note = "keeping 21 of the 51 weighted layers in FP16/FP32 (41%) meets them (18.81 dB), the fewest found"

    def broken(record: dict) -> None:
        case = next(c for c in record["cases"] if c["id"] == "cnn-int8-onnxruntime")
        recipe = case["metrics"]["recipe"]
        output = next(iter(recipe["metrics"]))
        recipe["checks"] = [{"output": output, "metric": "max_norm_err", "observed": 0.4321, "bound": 0.25,
                             "higher_is_better": False, "passed": False}]
        recipe["passed"] = False
        recipe["lock"] = {"path": "quantverdict.lock", "search_note": note}
        case.update(status="failed", message="cnn-int8-onnxruntime: the recipe regressed: max_norm_err 0.4321")

    current = _variant(record_path, tmp_path, broken)
    assert harness("report", str(current), "--out-dir", str(tmp_path)).returncode == 0
    flags = ["--headless", "--no-sandbox", "--disable-gpu", "--no-first-run", "--disable-background-networking",
             "--disable-component-update", "--disable-sync", f"--user-data-dir={tmp_path / 'profile'}"]
    dom = subprocess.run([CHROMIUM, *flags, "--dump-dom", (tmp_path / f"{current.stem}.html").as_uri()],
                         capture_output=True, text=True, timeout=120).stdout
    import re

    text = html.unescape(re.sub(r"<[^>]+>", " ", dom.split("<body>", 1)[1]))
    first_screen = text[:text.index("Accuracy matrix")]
    assert "What failed" in first_screen and "cnn-int8-onnxruntime" in first_screen
    assert "max_norm_err 0.4321, must be ≤ 0.25 (the recipe's outputs against FP32)" in first_screen
    assert f"Next: {note}" in first_screen
    cell = re.search(r'<th>cnn</th>(.*?)</tr>', dom).group(1)
    assert "max_norm_err 0.432" in cell
    assert "$" not in text and "mathdefault" not in text


def test_no_chart_label_is_raw_mathtext(record_path, monkeypatch):
    """Charts draw a record's text as text (``text.parse_math`` off), so a log axis's default labels showed as raw
    ``$\\mathdefault{10^{-7}}$``: every label of every chart on the page, as drawn, is plain text."""
    import matplotlib.text

    from quantverdict.report import charts
    from quantverdict.report.load import load_record
    from quantverdict.report.render import html_page

    drawn: list[str] = []
    original = charts.figure

    def reading(draw, *args, **kwargs):
        def drawing(ax) -> bool:
            made = draw(ax)
            ax.figure.canvas.draw()
            drawn.extend(text.get_text() for text in ax.figure.findobj(matplotlib.text.Text))
            return made
        return original(drawing, *args, **kwargs)

    monkeypatch.setattr(charts, "figure", reading)
    record = load_record(record_path)
    html_page(record, [record])  # a history of one more run: the trend chart is drawn too
    assert any(text.startswith("1e-") for text in drawn)  # the error histograms' log axis is among them
    assert not [text for text in drawn if "$" in text or "mathdefault" in text]


def test_the_notes_a_comparison_kept_reach_the_markdown_and_the_page_once_each_with_their_cases(record_path):
    """A note a case's comparison kept (here: FP32 outputs the input barely moves, in the runtime's view and the
    recipe's) was said only in the run's warnings: the summary and the page list it once, with the case."""
    from quantverdict.report.load import check_record
    from quantverdict.report.render import html_page, markdown

    record = json.loads(record_path.read_text())
    note = "the FP32 outputs (logits) barely depend on the inputs"
    case = _int8(record)
    case["metrics"]["notes"] = [note]
    case["metrics"].setdefault("recipe", {})["notes"] = [note]
    checked = check_record(record, "noted")
    text = markdown(checked)
    assert "\n## Notes\n" in text and f"\n- {note} ({case['id']})\n" in text and text.count(note) == 1
    page = html_page(checked, [])
    assert "<h2>Notes</h2>" in page and page.count(note) == 1 and case["id"] in page
