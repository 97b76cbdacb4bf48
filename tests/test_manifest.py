"""User models from a manifest: loading, errors that name the entry, and a run through the pipeline."""
import pytest

from harness.errors import HarnessError
from harness.models.manifest import load_manifest
from harness.run.pipeline import Case, Pipeline


def test_example_manifest_model_runs_int8(harness_pipeline):
    spec = harness_pipeline.models.get("user-convnet")
    assert [i.name for i in spec.inputs] == ["image"] and spec.tolerances["int8"]["min_cosine"] == 0.995
    result = harness_pipeline.run(Case("user-convnet", "int8", "onnxruntime"))
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
    manifest.write_text("models:\n  - name: cnn\n    build: harness.models.synthetic:ResidualBlock\n"
                        "    inputs: [{name: input, shape: [1, 3, 8, 8]}]\n    outputs: [y]\n")
    with pytest.raises(HarnessError, match="model .cnn. is registered twice"):
        Pipeline(tmp_path / "cache", manifest=manifest)
