"""Bad input fails with one line naming the problem, and leaves nothing half-written."""
import subprocess
import sys
from dataclasses import replace
from pathlib import Path

import pytest

from quantverdict.cache import Cache
from quantverdict.errors import CalibrationError, InputSpecError, ModelFileError, UnknownNameError
from quantverdict.export import export_onnx, load_onnx
from quantverdict.models import InputSpec
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
