"""Bad input fails with one line naming the problem, and leaves nothing half-written."""
import subprocess
import sys
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest
import torch

from quantverdict.cache import Cache
from quantverdict.errors import CalibrationError, HarnessError, InputSpecError, ModelFileError, UnknownNameError
from quantverdict.export import export_onnx, load_onnx
from quantverdict.models import InputSpec
from quantverdict.models.spec import ModelSpec
from quantverdict.run.pipeline import Case, Pipeline

REPO = Path(__file__).resolve().parent.parent


def cache_files(root: Path) -> list[Path]:
    return [p for p in root.rglob("*") if p.is_file() and "locks" not in p.parts]


def test_missing_onnx_file_is_named(tmp_path):
    with pytest.raises(ModelFileError, match=r"ONNX file not found: .*nowhere\.onnx"):
        load_onnx(tmp_path / "nowhere.onnx")


def test_corrupt_onnx_file_is_named(tmp_path, qv_pipeline):
    good = qv_pipeline.store.fp32_onnx("cnn").read_bytes()
    broken = tmp_path / "truncated.onnx"
    broken.write_bytes(good[: len(good) // 3])
    with pytest.raises(ModelFileError, match=r"corrupt or invalid ONNX file .*truncated\.onnx"):
        load_onnx(broken)


def test_wrong_input_shape_names_model_and_input(tmp_path, qv_pipeline):
    spec = qv_pipeline.models.get("cnn")
    wrong = replace(spec, inputs=[InputSpec("input", (4, 5, 32, 32))])
    cache = Cache(tmp_path / "cache")
    with pytest.raises(InputSpecError, match=r"model 'cnn' rejects its declared inputs input\(4, 5, 32, 32\)"):
        export_onnx(wrong, spec.build(), cache)
    assert cache_files(tmp_path / "cache") == []


class _Refusing(torch.nn.Module):
    """Refuses any batch but 3, returns ``outputs`` tensors; counts its forwards."""

    def __init__(self, outputs: int = 1):
        super().__init__()
        self.linear, self.outputs, self.calls = torch.nn.Linear(8, 8), outputs, 0

    def forward(self, x):
        self.calls += 1
        y = self.linear(x.reshape(3, -1))
        return (y,) * self.outputs if self.outputs > 1 else y


def _spec(batch: int) -> ModelSpec:
    return ModelSpec(name="refusing", inputs=[InputSpec("x", (batch, 8))], outputs=["y"], build=_Refusing)


def test_a_forward_that_refuses_its_inputs_while_traced_is_one_line_and_the_users_trace(tmp_path):
    """The export checks the model on the forward it traces (one forward at the declared batch, not two): a failure
    there is the model refusing its inputs, its traceback from the user's forward down, not the tracer's frames."""
    with pytest.raises(InputSpecError, match=r"model 'refusing' rejects its declared inputs x\(4, 8\): shape") as error:
        export_onnx(_spec(4), _Refusing().eval(), Cache(tmp_path))
    trace = error.value.trace.splitlines()
    assert trace[1].endswith("in forward") and "test_errors.py" in trace[1], trace[:3]
    assert not any("torch/onnx" in line or "torch/jit" in line for line in trace)
    with pytest.raises(InputSpecError, match=r"model 'refusing' returns 2 outputs but its spec names 1: \['y'\]"):
        export_onnx(_spec(3), _Refusing(outputs=2).eval(), Cache(tmp_path))
    assert cache_files(tmp_path) == []  # nothing half-written
    accepted = _Refusing().eval()
    export_onnx(_spec(3), accepted, Cache(tmp_path))
    assert accepted.calls == 1


def test_an_operator_no_exporter_knows_stays_the_exporters_error(tmp_path):
    """After the traced forward ends, a failure is the exporter's (an operator it cannot write), not the inputs'."""
    class Eigenvalues(torch.nn.Module):
        def forward(self, x):
            return torch.linalg.eigh(x @ x.transpose(-1, -2))[0]

    spec = ModelSpec(name="eigh", inputs=[InputSpec("x", (2, 4, 4))], outputs=["y"], build=Eigenvalues)
    with pytest.raises(Exception, match="eigh") as error:
        export_onnx(spec, Eigenvalues().eval(), Cache(tmp_path))
    assert not isinstance(error.value, InputSpecError)


def test_unknown_precision_suggests_the_close_name(qv_pipeline):
    with pytest.raises(UnknownNameError, match=r"unknown precision 'int9'; did you mean 'int8'"):
        qv_pipeline.cases(models=["cnn"], precisions=["int9"])


def test_cli_reports_unknown_precision_in_one_line(tmp_path):
    proc = subprocess.run([sys.executable, "-m", "quantverdict", "run", "--models", "cnn", "--precisions", "int9",
                           "--report-dir", str(tmp_path), "--cache-dir", str(tmp_path / "c")],
                          capture_output=True, text=True, cwd=REPO)
    assert proc.returncode == 2
    assert proc.stderr.strip().splitlines() == [
        "error: unknown precision 'int9'; did you mean 'int8'? (known: bf16, fp16, fp32, fp4, fp8, int8, tf32)"]
    assert list(tmp_path.glob("*.json")) == []


def test_user_onnx_model_that_is_corrupt_errors_the_case(tmp_path):
    (tmp_path / "broken.onnx").write_bytes(b"\x08\x07garbage")
    (tmp_path / "models.yaml").write_text(
        "models:\n  - name: broken\n    onnx: broken.onnx\n    inputs: [{name: x, shape: [1, 4]}]\n"
        "    outputs: [y]\n    calibration: synthetic\n")
    pipeline = Pipeline(tmp_path / "cache", manifest=tmp_path / "models.yaml")
    result = pipeline.run(Case("broken", "int8", "onnxruntime"))
    assert result.status == "error"
    assert f"corrupt or invalid ONNX file {tmp_path / 'broken.onnx'}" in result.message
    assert cache_files(tmp_path / "cache") == []


def test_quantizing_without_calibration_set_is_refused(tmp_path):
    (tmp_path / "models.yaml").write_text(
        "models:\n  - name: uncalibrated\n    build: quantverdict.models.nets:ResidualBlock\n"
        "    inputs: [{name: input, shape: [2, 3, 16, 16]}]\n    outputs: [logits]\n")
    pipeline = Pipeline(tmp_path / "cache", manifest=tmp_path / "models.yaml")
    result = pipeline.run(Case("uncalibrated", "int8", "onnxruntime"))
    assert result.status == "error"
    assert "model 'uncalibrated' has no calibration set" in result.message
    with pytest.raises(CalibrationError):
        pipeline.store.calibration_batches("uncalibrated")
    assert pipeline.run(Case("uncalibrated", "fp16", "onnxruntime")).status == "passed"


def _manifest_with(tmp_path, calibration_body: str, **extra: str) -> Pipeline:
    """A tiny user model whose calibration callable returns what ``calibration_body`` builds (in a module of
    its own name: one process imports each module once)."""
    module = f"userdata_{tmp_path.name[-12:].replace('-', '_')}"
    (tmp_path / f"{module}.py").write_text(
        "import numpy as np\nfrom torch import nn\n\n\ndef net():\n"
        "    return nn.Sequential(nn.Conv2d(3, 4, 3), nn.Flatten(), nn.Linear(4 * 6 * 6, 3)).eval()\n\n\n"
        f"def calibration():\n    return {calibration_body}\n")
    lines = "".join(f"    {key}: {value}\n" for key, value in extra.items())
    (tmp_path / "models.yaml").write_text(
        f"models:\n  - name: tiny\n    build: {module}:net\n    inputs: [{{name: image, shape: [2, 3, 8, 8]}}]\n"
        f"    outputs: [scores]\n    task: classification\n    calibration: {module}:calibration\n{lines}")
    return Pipeline(tmp_path / "cache", manifest=tmp_path / "models.yaml")


@pytest.mark.parametrize("body, words", [
    ("[]", "returned an empty list; expected a non-empty list"),
    ("[{'image': np.zeros((0, 3, 8, 8), np.float32)}]", "batch 0, input 'image': shape (0, 3, 8, 8): no values"),
    ("[{'image': np.full((2, 3, 8, 8), np.nan, np.float32)}]", "384 of 384 values are NaN or infinite"),
    ("[{'image': np.zeros((2, 3, 8), np.float32)}]", "shape (2, 3, 8) where the input is declared [2, 3, 8, 8]"),
    ("[{'image': np.zeros((2, 3, 9, 8), np.float32)}]", "(axes 0 free): axis 2 differs"),
    ("[{'pixels': np.zeros((2, 3, 8, 8), np.float32)}]", "batch 0 has inputs ['pixels']; the model's are ['image']"),
])
def test_calibration_data_that_cannot_calibrate_is_named_with_its_callable(tmp_path, body, words):
    """Empty, non-finite or wrong-shaped calibration data is the data's fault, said so with the callable
    that returned it, not "the recipe regressed" or ONNX Runtime's raw INVALID_ARGUMENT."""
    result = _manifest_with(tmp_path, body).run(Case("tiny", "int8", "onnxruntime"))
    assert result.status == "error", result.message
    assert "model 'tiny': its calibration callable userdata_" in result.message and words in result.message


def test_a_classifier_output_without_its_batch_axis_is_refused(tmp_path):
    (tmp_path / "flat.py").write_text(
        "import torch\nfrom torch import nn\n\n\nclass Flat(nn.Module):\n"
        "    def forward(self, x):\n        return x.flatten().mean(0, keepdim=True).expand(5)\n\n\ndef net():\n"
        "    return Flat()\n")
    (tmp_path / "models.yaml").write_text(
        "models:\n  - name: flat\n    build: flat:net\n    inputs: [{name: x, shape: [2, 4]}]\n"
        "    outputs: [scores]\n    task: classification\n    calibration: synthetic\n")
    result = Pipeline(tmp_path / "cache", manifest=tmp_path / "models.yaml").run(Case("flat", "fp32", "onnxruntime"))
    assert result.status == "error" and "output 'scores' has shape (50,): a classifier's outputs are [batch, " \
                                      "classes]" in result.message, result.message


def test_an_unwritable_report_folder_or_a_corrupt_history_is_found_before_the_matrix_runs(tmp_path):
    from quantverdict.run.cli import main

    (tmp_path / "reports").mkdir()
    (tmp_path / "reports" / "history.sqlite").write_bytes(b"not a database, 40 bytes of something else")
    run = [sys.executable, "-m", "quantverdict", "run", "--models", "mlp", "--precisions", "fp32", "--backends",
           "onnxruntime", "--cache-dir", str(tmp_path / "cache")]
    proc = subprocess.run([*run, "--report-dir", str(tmp_path / "reports")], capture_output=True, text=True,
                          timeout=600)
    assert proc.returncode == 2 and proc.stdout == "", proc.stdout  # refused before any case ran
    assert f"error: cannot use the run history {tmp_path / 'reports' / 'history.sqlite'}" in proc.stderr
    (tmp_path / "a-file").write_text("")  # a folder that cannot be made, for root too (unlike a chmod)
    assert main(["run", "--models", "mlp", "--precisions", "fp32", "--backends", "onnxruntime",
                 "--cache-dir", str(tmp_path / "cache"), "--report-dir", str(tmp_path / "a-file" / "r")]) == 2


def test_the_command_prints_each_warning_as_one_line_naming_another_packages_code_where_it_warned(tmp_path):
    """Python's format prints a warning's source line under it: for the harness's own (GPTQ's, on each layer it
    leaves at nearest rounding) a call inside the harness, half of a lock's output. The command prints one line per
    warning, with the kind and place only where code outside the harness warned (a user's factory here)."""
    from quantverdict.run.cli import PACKAGE, one_line

    (tmp_path / "net.py").write_text("import warnings\nimport torch\n\n\ndef make():\n"
                                     "    warnings.warn('weights are seeded')\n    return torch.nn.Linear(4, 2)\n")
    (tmp_path / "models.yaml").write_text("models:\n  - name: net\n    build: net:make\n    inputs: [{name: x, "
                                          "shape: [8, 4]}]\n    outputs: [y]\n    calibration: synthetic\n")
    proc = subprocess.run([sys.executable, "-m", "quantverdict", "lock", "--manifest", str(tmp_path / "models.yaml"),
                           "--precisions", "int8", "--cache-dir", str(tmp_path / "cache")], capture_output=True,
                          text=True, timeout=600, cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    assert f"warning: weights are seeded (UserWarning, {tmp_path / 'net.py'}:6)\n" in proc.stderr, proc.stderr
    assert "warnings.warn(" not in proc.stderr, proc.stderr
    assert one_line(UserWarning("GPTQ: layer 'a' keeps nearest rounding"), UserWarning,
                    str(PACKAGE / "precision" / "qdq.py"), 222, "quantized = ...") == \
        "warning: GPTQ: layer 'a' keeps nearest rounding\n"


def test_a_history_that_breaks_after_the_run_keeps_the_record_and_the_summary(tmp_path, monkeypatch):
    import sqlite3

    from quantverdict.report import history
    from quantverdict.run.cli import main

    def broken(db, record):
        raise sqlite3.DatabaseError("database disk image is malformed")

    monkeypatch.setattr(history, "append", broken)  # a history corrupted while the matrix ran
    code = main(["run", "--models", "mlp", "--precisions", "fp32", "--backends", "onnxruntime",
                 "--cache-dir", str(tmp_path / "cache"), "--report-dir", str(tmp_path / "reports")])
    assert code == 2 and len(list((tmp_path / "reports").glob("run-*.json"))) == 1


@pytest.mark.parametrize("where, statement, raised", [("build", "sys.exit(0)", "SystemExit"),
                                                     ("calibration", "sys.exit(3)", "SystemExit"),
                                                     ("calibration", "raise KeyboardInterrupt", "KeyboardInterrupt")])
def test_a_user_callable_that_calls_sys_exit_is_its_cases_error_and_the_run_goes_on(tmp_path, where, statement,
                                                                                    raised):
    """``sys.exit(0)`` in a factory ended `quantverdict run` with exit 0, no output and no record: now it is the
    case's error, naming the callable, the other cases still run, the record is written and the run exits 1. So is
    a KeyboardInterrupt the user's code raised with no Ctrl-C, under the CLI and under pytest."""
    import json
    import subprocess
    import sys
    import textwrap

    (tmp_path / "exiting.py").write_text(textwrap.dedent(f"""\
        import sys
        import numpy as np
        from torch import nn


        def net():
            {statement if where == "build" else "pass"}
            return nn.Sequential(nn.Flatten(), nn.Linear(12, 4)).eval()


        def calibration():
            {statement if where == "calibration" else "pass"}
            return [{{"x": np.zeros((2, 3, 4), np.float32)}}]
        """))
    (tmp_path / "models.yaml").write_text(
        "models:\n  - name: quits\n    build: exiting:net\n    build_files: []\n    inputs: [{name: x, shape: [2, 3, 4]}]\n"
        "    outputs: [y]\n    calibration: exiting:calibration\n    recipe: {int8: {calibration: max}}\n")
    proc = subprocess.run([sys.executable, "-m", "quantverdict", "run", "--manifest", "models.yaml", "--models", "quits",
                           "--precisions", "fp32,int8", "--backends", "onnxruntime", "--report-dir", "out",
                           "--cache-dir", "cache"], cwd=tmp_path, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 1, proc.stdout + proc.stderr
    [record] = (tmp_path / "out").glob("run-*.json")
    cases = {case["id"]: case for case in json.loads(record.read_text())["cases"]}
    failing = "quits-int8-onnxruntime" if where == "calibration" else "quits-fp32-onnxruntime"
    assert cases[failing]["status"] == "error"
    callable_name = "exiting:net" if where == "build" else "exiting:calibration"
    assert callable_name in cases[failing]["message"] and raised in cases[failing]["message"]
    if where == "calibration":
        assert cases["quits-fp32-onnxruntime"]["status"] == "passed"
    if raised == "KeyboardInterrupt":
        proc = subprocess.run([sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-m", "int8 or fp32",
                               "--qv-manifest=models.yaml", "--qv-backends=onnxruntime", "--qv-report-dir=pytest-out",
                               "--qv-cache-dir=cache", "-rA"], cwd=tmp_path, capture_output=True, text=True, timeout=600)
        assert proc.returncode == 1 and "1 passed" in proc.stdout and "exiting:calibration" in proc.stdout, \
            proc.stdout[-3000:] + proc.stderr


@pytest.mark.parametrize("option, text, expected", [
    ("--manifest", "models:\n  - name: a\n    build: x:y\n    inputs: [{name: x, shape: [1, 2]}]\n    outputs: [y]\n"
                   "    outputs: [z]\n", "is not valid YAML: duplicate key 'outputs'"),
    ("--manifest", "x: " + "[" * 10000 + "]" * 10000 + "\n", "nests deeper than 32 levels: refused"),
    ("--tolerances", "defaults:\n  int8: {min_cosine: .nan}\n", "defaults.int8.min_cosine: a bound is a finite number ≥ 0, not nan"),
    ("--tolerances", "defaults:\n  int8: {max_norm_err: -1}\n", "defaults.int8.max_norm_err: a bound is a finite number ≥ 0"),
])
def test_yaml_that_would_mislead_or_crash_is_refused_in_one_line(tmp_path, option, text, expected):
    """Repeated keys (the last won silently), nesting 10,000 deep (a RecursionError), NaN or negative bounds (every
    case then failed 'must be ≥ nan'): one line naming the file, exit 2."""
    import subprocess
    import sys

    path = tmp_path / "document.yaml"
    path.write_text(text)
    proc = subprocess.run([sys.executable, "-m", "quantverdict", "run", option, str(path), "--models", "cnn",
                           "--precisions", "int8", "--backends", "onnxruntime", "--cache-dir", str(tmp_path / "cache")],
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 2, proc.stdout + proc.stderr
    [line] = proc.stderr.strip().splitlines()
    assert str(path) in line and expected in line


USER_MISTAKES = """\
from torch import nn


def nothing():
    return None


def net():
    return nn.Sequential(nn.Flatten(), nn.Linear(12, 4)).eval()


def score(reference, candidate, labels):
    return 0.5
"""


@pytest.mark.parametrize("entry, expected", [
    ("build: mistakes:nothing", "model 'm': its model factory mistakes:nothing failed: TypeError: returned NoneType; "
                                "expected a torch.nn.Module"),
    ("build: mistakes:net\n    metric: mistakes:score", "model 'm': its metric mistakes:score returned float 0.5; expected "
                                                        "a mapping of metric names to numbers"),
])
def test_a_user_callables_wrong_return_is_one_line_naming_it(tmp_path, entry, expected):
    import sys

    (tmp_path / "mistakes.py").write_text(USER_MISTAKES)
    (tmp_path / "models.yaml").write_text(f"models:\n  - name: m\n    {entry}\n    inputs: [{{name: x, shape: [2, 3, 4]}}]\n"
                                          "    outputs: [y]\n    calibration: synthetic\n")
    sys.path.insert(0, str(tmp_path))
    try:
        result = Pipeline(tmp_path / "cache", manifest=tmp_path / "models.yaml").run(Case("m", "fp32", "onnxruntime"))
    finally:
        sys.path.remove(str(tmp_path))
        sys.modules.pop("mistakes", None)
    assert result.status == "error" and result.message.splitlines()[0].startswith(f"m-fp32-onnxruntime: {expected}"), \
        result.message


@pytest.mark.parametrize("field, expected", [
    ("inputs: [{name: x, shape: [2, 3, 4], range: [1, 0]}]\n    recipe: {}",
     "models[0].inputs[0].range: expected [low, high] with finite low < high, got [1.0, 0.0]"),
    ("inputs: [{name: x, shape: [2, 3, 4]}]\n    recipe: {int8: {smoothquant: banana}}",
     "models[0].recipe.int8: smoothquant 'banana': expected a finite number"),
])
def test_a_manifest_value_of_the_wrong_kind_is_one_line_naming_its_field(tmp_path, field, expected):
    from quantverdict.errors import HarnessError

    (tmp_path / "models.yaml").write_text(f"models:\n  - name: m\n    build: x:y\n    {field}\n    outputs: [y]\n")
    with pytest.raises(HarnessError) as error:
        Pipeline(tmp_path / "cache", manifest=tmp_path / "models.yaml")
    lines = str(error.value).splitlines()  # one line per problem (the factory x:y is missing too)
    assert all(line.startswith(f"{tmp_path / 'models.yaml'}: model 'm': ") for line in lines)
    assert any(expected in line for line in lines), lines


def test_a_record_holding_an_integer_of_5000_digits_is_bad_input(tmp_path):
    from quantverdict.report.load import RecordError, load_record

    path = tmp_path / "run.json"
    path.write_text('{"schema_version": 1, "cases": [], "big": ' + "9" * 5000 + "}")
    with pytest.raises(RecordError, match="is not valid JSON: Exceeds the limit"):
        load_record(path)


def test_float64_and_torch_tensor_calibration_batches_are_read_as_the_declared_float32(tmp_path):
    """Batches of float64 NumPy arrays or CPU torch tensors for a float32 input (raw ONNX Runtime errors before,
    naming neither the callable nor the input): read as the declared dtype, and the INT8 case is judged."""
    import sys

    (tmp_path / "wide.py").write_text(
        "import numpy as np\nimport torch\nfrom torch import nn\n\n\ndef net():\n"
        "    torch.manual_seed(0)\n    return nn.Sequential(nn.Flatten(), nn.Linear(12, 4)).eval()\n\n\n"
        "def batches():\n    rng = np.random.default_rng(0)\n"
        "    return [{'x': rng.uniform(-1, 1, (4, 3, 4))}, {'x': torch.rand(4, 3, 4) * 2 - 1}]\n")
    (tmp_path / "models.yaml").write_text(
        "models:\n  - name: wide\n    build: wide:net\n    inputs: [{name: x, shape: [4, 3, 4]}]\n    outputs: [y]\n"
        "    calibration: wide:batches\n    recipe: {int8: {calibration: max}}\n")
    sys.path.insert(0, str(tmp_path))
    try:
        pipeline = Pipeline(tmp_path / "cache", manifest=tmp_path / "models.yaml")
        batches = pipeline.store.calibration_batches("wide")
        result = pipeline.run(Case("wide", "int8", "onnxruntime"))
    finally:
        sys.path.remove(str(tmp_path))
        sys.modules.pop("wide", None)
    assert [batch["x"].dtype for batch in batches] == [np.float32, np.float32]
    assert result.status in ("passed", "failed") and "cosine" in result.metrics["metrics"]["y"], result.message


def test_a_factory_that_returns_no_module_is_named_with_what_it_returned(tmp_path):
    """A probe that once gave ``FileNotFoundError: 'frozen'``: a factory (here ``os:getcwd``) that returns a string is
    the case's error, naming the factory and what it returned."""
    (tmp_path / "models.yaml").write_text(
        "models:\n  - name: m\n    build: os:getcwd\n    inputs: [{name: x, shape: [2, 3]}]\n    outputs: [y]\n")
    result = Pipeline(tmp_path / "cache", manifest=tmp_path / "models.yaml").run(Case("m", "fp32", "onnxruntime"))
    assert result.status == "error" and "its model factory os:getcwd failed: TypeError: returned str; expected a " \
        "torch.nn.Module" in result.message, result.message


def test_a_build_file_that_does_not_exist_is_named_with_its_field(tmp_path):
    from quantverdict.errors import HarnessError

    (tmp_path / "models.yaml").write_text(
        "models:\n  - name: m\n    build: os:getcwd\n    build_files: [weights/missing.pt]\n"
        "    inputs: [{name: x, shape: [2, 3]}]\n    outputs: [y]\n")
    with pytest.raises(HarnessError) as error:
        Pipeline(tmp_path / "cache", manifest=tmp_path / "models.yaml")
    assert str(error.value) == (f"{tmp_path / 'models.yaml'}: model 'm': models[0].build_files[0]: weights/missing.pt "
                                f"does not exist (beside the manifest: {tmp_path / 'weights/missing.pt'})")


def test_declared_inputs_too_large_for_the_machine_are_refused_before_anything_is_built(tmp_path):
    """[4, 3, 8192, 8192] float32 is 3 GiB a batch: on a 24 GiB machine (16 batches' worth of memory needed) the case
    is an error naming the shape at once (it ran 27 s to 9.5 GB and a MemoryError before); on 64 GiB it runs."""
    from quantverdict.models import ModelSpec

    spec = ModelSpec("huge", [InputSpec("x", (4, 3, 8192, 8192))], ["y"], onnx_path=tmp_path / "huge.onnx")
    assert spec.batch_bytes() == 3 * 2 ** 30
    assert spec.memory_problem(64 * 2 ** 30) is None
    assert spec.memory_problem(24 * 2 ** 30) == (
        "model 'huge': one batch of its declared inputs (x [4, 3, 8192, 8192] float32) is 3 GiB; this machine's 24 GiB "
        "hold at most 1.5 GiB a batch: declare a smaller batch or shape")


def test_a_run_that_judges_no_case_does_not_pass(tmp_path, capsys):
    """Every selected case skipped (a runner without the backend): the run lists why and exits 1, not 0."""
    from quantverdict.run.cli import main
    from quantverdict.run.pipeline import Case, Pipeline

    case = Case("mlp", "fp16", "tensorrt")
    if Pipeline(tmp_path / "cache").skip_reason(case) is None:
        pytest.skip("this runner has TensorRT: mlp's FP16 on it runs")
    code = main(["run", "--models", "mlp", "--precisions", "fp16", "--backends", "tensorrt", "--cache-dir",
                 str(tmp_path / "cache"), "--report-dir", str(tmp_path / "reports")])
    out = capsys.readouterr().out
    assert code == 1 and "no case was judged: 1 selected, every one skipped" in out


@pytest.mark.parametrize("command", [["lock", "--precisions", "int9"], ["lock", "--check", "--precisions", "int9"],
                                     ["lock", "--update", "nosuch"], ["run", "--relock", "nosuch"]])
def test_an_unknown_precision_or_model_is_refused_with_exit_2_by_lock_and_run(tmp_path, monkeypatch, capsys, command):
    """A nightly job's typo must not stay green: ``lock --precisions int9`` said "nothing to lock" and exited 0, and
    ``run --relock nosuch`` was accepted silently."""
    from quantverdict.run.cli import main

    monkeypatch.chdir(tmp_path)
    code = main([*command, "--models", "mlp", "--cache-dir", str(tmp_path / "cache"),
                 *(["--precisions", "fp32", "--backends", "onnxruntime", "--report-dir", "r"] if command[0] == "run"
                   else [])])
    assert code == 2
    error = capsys.readouterr().err.strip().splitlines()
    assert len(error) == 1 and (("unknown precision 'int9'; did you mean 'int8'?" in error[0])
                                or "unknown model 'nosuch'" in error[0]), error


@pytest.mark.parametrize("recipe, words", [
    ("{int8: {auto: true, budget_s: banana}}", "recipe.int8: recipe auto: budget_s 'banana': expected a finite number"),
    ("{int8: {auto: true, max_fallback: lots}}", "recipe auto: max_fallback 'lots': expected a finite number"),
    ("{int8: {auto: true, budget_s: .nan}}", "recipe auto: budget_s nan: expected a finite number"),
    ("{int8: {auto: 'false'}}", "recipe auto 'false': expected true or false"),
    ("{int8: {auto: false, budget_s: 5}}", "recipe auto is false, so budget_s (the search's own settings) cannot"),
    ("{int8: {equalize: 'false'}}", "equalize 'false': expected true or false"),
    ("{int8: {exclude: 5}}", "exclude 5: expected a node-name pattern or a list of them"),
    ("{fp16: auto}", "recipe.fp16: auto: a search chooses only INT8 and FP8 recipes"),
])
def test_a_recipe_setting_of_the_wrong_kind_is_one_line_up_front(tmp_path, recipe, words):
    """Each was a traceback (ValueError, INTERNALERROR under pytest), a string taken as true, a setting named unknown
    beside auto: false, or silently ignored."""
    from quantverdict.documents import DocumentError
    from quantverdict.run.manifest import load_manifest

    (tmp_path / "models.yaml").write_text("models:\n  - name: m\n    onnx: m.onnx\n    inputs: [{name: x, shape: [2, 8]}]"
                                          f"\n    outputs: [y]\n    calibration: synthetic\n    recipe: {recipe}\n")
    with pytest.raises(DocumentError) as raised:
        load_manifest(tmp_path / "models.yaml")
    assert words in str(raised.value) and str(raised.value).count("\n") == 0, str(raised.value)


def test_a_recipe_option_that_no_recipe_takes_is_refused_before_any_case(tmp_path):
    from quantverdict.run.cli import main

    assert main(["run", "--models", "mlp", "--precisions", "int8", "--backends", "onnxruntime", "--cache-dir",
                 str(tmp_path / "cache"), "--recipe-option", "smoothquant=banana"]) == 2


def test_a_report_written_where_a_file_cannot_go_is_one_line(tmp_path, capsys):
    """A folder given as ``--out``, a file given as ``--out-dir``: exit 2 and one line naming the path, where an
    IsADirectoryError traceback was."""
    from quantverdict.run.cli import main

    assert main(["run", "--models", "mlp", "--precisions", "fp32", "--backends", "onnxruntime", "--cache-dir",
                 str(tmp_path / "cache"), "--report-dir", str(tmp_path / "reports")]) == 0
    record = next((tmp_path / "reports").glob("run-*.json"))
    (tmp_path / "a-file").write_text("")
    capsys.readouterr()
    assert main(["report", str(record), "--out-dir", str(tmp_path / "a-file")]) == 2
    error = capsys.readouterr().err.strip().splitlines()
    assert len(error) == 1 and error[0].startswith("error: ") and "a-file" in error[0], error


def test_a_manifest_model_named_as_a_registered_one_names_the_file(tmp_path):
    from quantverdict.run.pipeline import Pipeline

    (tmp_path / "models.yaml").write_text("models:\n  - name: mlp\n    onnx: m.onnx\n    inputs: [{name: x, shape: [2, 8]}]"
                                          "\n    outputs: [y]\n    calibration: synthetic\n")
    with pytest.raises(HarnessError, match=f"model 'mlp' is registered .* and declared in {tmp_path / 'models.yaml'}"):
        Pipeline(tmp_path / "cache", manifest=tmp_path / "models.yaml")


def test_a_cache_dir_that_is_a_file_is_one_line_before_any_case(tmp_path, capsys):
    from quantverdict.run.cli import main

    (tmp_path / "a-file").write_text("")
    assert main(["run", "--models", "mlp", "--precisions", "fp32", "--backends", "onnxruntime", "--cache-dir",
                 str(tmp_path / "a-file"), "--report-dir", str(tmp_path / "reports")]) == 2
    out, err = capsys.readouterr()
    assert out == "" and err.strip().splitlines() == [f"error: cannot write the cache (exports, calibrations, engines) "
                                                      f"to {tmp_path / 'a-file'}: it is a file, not a folder"], err


def test_a_cpu_runners_run_counts_its_skips_by_reason_instead_of_a_line_each(tmp_path, capsys):
    """The cold main job printed a line per skipped case (73% of 286 lines on a CPU runner) in the log and the table:
    they are counted by reason, whichever the runner skips (a GPU runner's fewer)."""
    from collections import Counter

    from quantverdict.report.load import load_record
    from quantverdict.run.cli import main

    assert main(["run", "--models", "mlp,cnn", "--precisions", "fp32,tf32,fp4", "--backends", "torch,onnxruntime",
                 "--cache-dir", str(tmp_path / "cache"), "--report-dir", str(tmp_path / "r")]) == 0
    out, err = capsys.readouterr()
    assert "skipped (" not in err and ": skipped" not in out
    skipped = Counter(case.reason for case in load_record(next((tmp_path / "r").glob("run-*.json"))).cases
                      if case.status == "skipped")
    if not skipped:  # a runner that runs every one of them (a Blackwell GPU with onnxruntime-gpu)
        assert "skipped:" not in out
        return
    assert f"skipped: {sum(skipped.values())} case(s)" in out
    assert all(f"  {count} × {reason}" in out for reason, count in skipped.items()), out


def test_the_main_job_leaves_the_slow_built_ins_out_unless_named(tmp_path, monkeypatch, capsys):
    """The cold main job took 107 s on the 2-core runner, 80 of them in ResNet-50 and -101: they run where named."""
    from quantverdict.report.load import load_record
    from quantverdict.run.cli import main

    monkeypatch.chdir(tmp_path)
    assert main(["run", "--precisions", "fp32", "--backends", "onnxruntime", "--cache-dir", "cache",
                 "--report-dir", "r"]) == 0
    assert "left out, as slow: resnet50, resnet101 (name them with --models to run them)" in capsys.readouterr().err
    models = {case.model for case in load_record(next((tmp_path / "r").glob("run-*.json"))).cases}
    assert "resnet18" in models and not models & {"resnet50", "resnet101"}


def test_a_runs_warnings_are_said_once_each_under_the_table_not_amid_the_progress(tmp_path, monkeypatch, capsys):
    from quantverdict.run.cli import main

    (tmp_path / "noisy.py").write_text("import warnings\nfrom torch import nn\n\n\ndef net():\n"
                                       "    warnings.warn('the factory says so', UserWarning)\n"
                                       "    return nn.Sequential(nn.Flatten(), nn.Linear(12, 4)).eval()\n")
    (tmp_path / "models.yaml").write_text("models:\n  - name: noisy\n    build: noisy:net\n    inputs: [{name: x, shape: "
                                          "[2, 3, 4]}]\n    outputs: [y]\n    calibration: synthetic\n")
    monkeypatch.chdir(tmp_path)
    assert main(["run", "--manifest", "models.yaml", "--models", "noisy", "--precisions", "fp32,fp16", "--backends",
                 "onnxruntime", "--cache-dir", "cache", "--report-dir", "r"]) == 0
    out, err = capsys.readouterr()
    assert "the factory says so" not in err
    assert "warnings, each once" in out and "  UserWarning: the factory says so" in out
