"""User models from a manifest: loading, errors that name the entry, and a run through the pipeline."""
import pytest

from quantverdict.errors import HarnessError
from quantverdict.models.manifest import load_manifest
from quantverdict.run.pipeline import Case, Pipeline


def test_example_manifest_model_runs_int8(qv_pipeline):
    spec = qv_pipeline.models.get("user-convnet")
    assert [i.name for i in spec.inputs] == ["image"] and spec.tolerances["int8"]["min_cosine"] == 0.995
    result = qv_pipeline.run(Case("user-convnet", "int8", "onnxruntime"))
    assert result.status == "passed", result.message
    assert result.tolerance["min_cosine"] == 0.995  # the manifest's own bound was applied


def test_unknown_field_names_file_and_model(tmp_path):
    manifest = tmp_path / "models.yaml"
    manifest.write_text("models:\n  - name: x\n    biuld: a:b\n    inputs: []\n    outputs: [y]\n")
    with pytest.raises(HarnessError, match=r"models\.yaml: model 'x': unknown field\(s\) \['biuld'\]"):
        load_manifest(manifest)


def test_unimportable_factory_names_the_entry(tmp_path):
    manifest = tmp_path / "models.yaml"
    manifest.write_text("models:\n  - name: x\n    build: no_such_module:make\n"
                        "    inputs: [{name: a, shape: [1, 2]}]\n    outputs: [y]\n")
    with pytest.raises(HarnessError, match=r"model 'x': ModuleNotFoundError"):
        load_manifest(manifest)


def test_duplicate_model_name_is_refused(tmp_path):
    manifest = tmp_path / "models.yaml"
    manifest.write_text("models:\n  - name: cnn\n    build: quantverdict.models.synthetic:ResidualBlock\n"
                        "    inputs: [{name: input, shape: [1, 3, 8, 8]}]\n    outputs: [y]\n")
    with pytest.raises(HarnessError, match="model .cnn. is registered twice"):
        Pipeline(tmp_path / "cache", manifest=manifest)


def _user_quantized_manifest(qv_pipeline, tmp_path, ort_quantize_static, **options) -> Pipeline:
    """An ONNX-only model whose INT8 graph the user made with ONNX Runtime's own quantizer."""
    import shutil

    store = qv_pipeline.store
    shutil.copy(store.fp32_onnx("cnn"), tmp_path / "net.onnx")
    ort_quantize_static(tmp_path / "net.onnx", tmp_path / "net-int8.onnx", store.calibration_batches("cnn"),
                        per_channel=True, **options)
    (tmp_path / "models.yaml").write_text(
        "models:\n  - name: user-quantized\n    onnx: net.onnx\n    quantized: {int8: net-int8.onnx}\n"
        "    inputs: [{name: input, shape: [4, 3, 32, 32]}]\n    outputs: [logits]\n    task: classification\n")
    return Pipeline(tmp_path / "cache", manifest=tmp_path / "models.yaml")


@pytest.mark.int8
def test_a_users_own_quantized_onnx_is_judged_like_a_recipe(qv_pipeline, tmp_path, ort_quantize_static):
    pipeline = _user_quantized_manifest(qv_pipeline, tmp_path, ort_quantize_static)
    result = pipeline.run(Case("user-quantized", "int8", "onnxruntime"))
    assert result.status == "passed", result.message
    recipe = result.metrics["recipe"]
    assert recipe["user_graph"].endswith("net-int8.onnx") and recipe["passed"]
    assert recipe["coverage"]["quantized"] == recipe["coverage"]["layers"] == 3
    assert result.metrics["fidelity"]["passed"]
    ours = qv_pipeline.run(Case("cnn", "int8", "onnxruntime")).metrics["recipe"]["metrics"]["logits"]["snr_db"]
    theirs = recipe["metrics"]["logits"]["snr_db"]
    assert abs(ours - theirs) < 20  # both real INT8 graphs of one network: the same order of error


@pytest.mark.int8
def test_a_corrupt_user_quantized_onnx_is_named(qv_pipeline, tmp_path, ort_quantize_static):
    pipeline = _user_quantized_manifest(qv_pipeline, tmp_path, ort_quantize_static)
    (tmp_path / "net-int8.onnx").write_bytes(b"not a model")
    result = pipeline.run(Case("user-quantized", "int8", "onnxruntime"))
    assert result.status == "error" and "net-int8.onnx" in result.message


def test_evaluation_inputs_without_labels_are_judged_by_agreement_alone(tmp_path):
    """An `eval:` callable may return input batches alone: the case is judged on agreement with
    FP32 (top-1, cosine) on those inputs, with no task accuracy invented."""
    (tmp_path / "unlabelled.py").write_text(
        "import numpy as np\n\n\ndef inputs():\n"
        "    rng = np.random.default_rng(9)\n"
        "    return [{'image': rng.uniform(0, 1, (8, 3, 24, 24)).astype(np.float32)} for _ in range(5)]\n")
    (tmp_path / "models.yaml").write_text(
        "models:\n  - name: unlabelled\n    build: example_models:make_convnet\n    build_files: []\n"
        "    inputs: [{name: image, shape: [4, 3, 24, 24], range: [0, 1]}]\n    outputs: [scores]\n"
        "    task: classification\n    calibration: example_models:calibration_batches\n"
        "    eval: unlabelled:inputs\n")
    import sys
    from pathlib import Path

    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "fixtures"))
    pipeline = Pipeline(tmp_path / "cache", manifest=tmp_path / "models.yaml")
    assert sum(len(b["image"]) for b in pipeline.store.eval_batches("unlabelled")) == 40
    result = pipeline.run(Case("unlabelled", "int8", "onnxruntime"))
    assert result.status == "passed", result.message
    assert "task" not in result.metrics and "top1_agreement" in result.metrics["metrics"]["scores"]
