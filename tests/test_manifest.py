"""User models from a manifest: loading, errors that name the entry, and a run through the pipeline."""
import json

import pytest

from quantverdict.errors import HarnessError
from quantverdict.run.manifest import load_manifest
from quantverdict.run.pipeline import Case, Pipeline

VALID = """\
models:
  - name: tiny
    build: example_models:make_convnet
    inputs:
      - {name: image, shape: [4, 3, 24, 24], range: [0, 1]}
    outputs: [scores]
    task: classification
    calibration: example_models:calibration_batches
    tolerances:
      int8: {min_cosine: 0.995}
    recipe:
      int8: {calibration: percentile}
"""


def test_example_manifest_model_runs_int8(qv_pipeline):
    spec = qv_pipeline.models.get("user-convnet")
    assert [i.name for i in spec.inputs] == ["image"] and spec.tolerances["int8"]["min_cosine"] == 0.995
    result = qv_pipeline.run(Case("user-convnet", "int8", "onnxruntime"))
    assert result.status == "passed", result.message
    assert result.tolerance["min_cosine"] == 0.995  # the manifest's own bound was applied


def _manifest_error(tmp_path, text: str) -> str:
    import shutil
    from pathlib import Path

    shutil.copy(Path(__file__).resolve().parents[1] / "fixtures" / "example_models.py", tmp_path)
    (tmp_path / "models.yaml").write_text(text)
    with pytest.raises(HarnessError) as caught:
        load_manifest(tmp_path / "models.yaml")
    return str(caught.value)


def test_the_valid_example_loads(tmp_path):
    import shutil
    from pathlib import Path

    shutil.copy(Path(__file__).resolve().parents[1] / "fixtures" / "example_models.py", tmp_path)
    (tmp_path / "models.yaml").write_text(VALID)
    [spec] = load_manifest(tmp_path / "models.yaml").specs
    assert spec.inputs[0].value_range == (0.0, 1.0) and spec.tolerances == {"int8": {"min_cosine": 0.995}}


@pytest.mark.parametrize("typo, path, closest", [
    ("    rnage: [0, 1]", "models[0].inputs[0].rnage", "range"),  # nested in an input
    ("    biuld: x:y", "models[0].biuld", "build"),
    ("  int8: {min_cosin: 0.9}", "models[0].tolerances.int8.min_cosin", "min_cosine"),
])
def test_a_misspelled_field_at_any_depth_is_one_line_with_file_model_path_and_closest_name(tmp_path, typo, path,
                                                                                            closest):
    lines = VALID.splitlines()
    anchor = {"rnage": "      - {name: image", "biuld": "    outputs:", "min_cosin": "    tolerances:"}
    key = next(k for k in anchor if k in typo)
    index = next(i for i, line in enumerate(lines) if line.startswith(anchor[key]))
    if key == "rnage":
        lines[index] = "      - name: image\n        shape: [4, 3, 24, 24]\n    " + typo
    elif key == "min_cosin":
        lines[index + 1] = "    " + typo
    else:
        lines.insert(index, typo)
    message = _manifest_error(tmp_path, "\n".join(lines) + "\n")
    assert len(message.splitlines()) == 1, message
    assert message.startswith(f"{tmp_path / 'models.yaml'}: model 'tiny': {path}: unknown field"), message
    assert f"did you mean {closest!r}?" in message


def test_a_misspelled_top_level_field_and_precision_get_the_closest_name(tmp_path):
    assert "(top level)" not in _manifest_error(tmp_path, "modles: []\n")
    assert "modles: unknown field 'modles'; did you mean 'models'?" in _manifest_error(tmp_path, "modles: []\n")
    text = VALID.replace("      int8: {min_cosine: 0.995}", "      in8: {min_cosine: 0.995}")
    assert "models[0].tolerances.in8: 'in8' is not one of fp32" in _manifest_error(tmp_path, text)
    assert "did you mean 'int8'?" in _manifest_error(tmp_path, text)


def test_wrong_values_and_missing_fields_are_named(tmp_path):
    assert "models[0].inputs[0].shape[1]: Input should be greater than 0" in \
        _manifest_error(tmp_path, VALID.replace("[4, 3, 24, 24]", "[4, -3, 24, 24]"))
    assert "models[0].outputs: required field missing" in _manifest_error(tmp_path, VALID.replace(
        "    outputs: [scores]\n", ""))
    assert "models[0].task: 'clasification' is not one of classification, regression, embedding; did you mean " \
           "'classification'?" in _manifest_error(tmp_path, VALID.replace("task: classification",
                                                                          "task: clasification"))
    assert "give exactly one of build:" in _manifest_error(tmp_path, VALID.replace(
        "    build: example_models:make_convnet\n", ""))


def test_recipe_settings_are_checked_by_the_recipe_at_load(tmp_path):
    message = _manifest_error(tmp_path, VALID.replace("{calibration: percentile}", "{gptqq: true}"))
    assert "model 'tiny': models[0].recipe.int8: unknown int8 recipe setting" in message and "gptq" in message


def test_unimportable_factory_names_the_entry_and_field(tmp_path):
    message = _manifest_error(tmp_path, VALID.replace("example_models:make_convnet", "no_such_module:make"))
    assert "model 'tiny': models[0].build: cannot find module 'no_such_module'" in message


def test_a_yaml_alias_bomb_is_refused_before_it_expands(tmp_path):
    bomb = "a: &a [x, x, x, x, x, x, x, x, x, x]\n" + "".join(
        f"{chr(98 + i)}: &{chr(98 + i)} [*{chr(97 + i)}, *{chr(97 + i)}, *{chr(97 + i)}, *{chr(97 + i)}, "
        f"*{chr(97 + i)}, *{chr(97 + i)}, *{chr(97 + i)}, *{chr(97 + i)}, *{chr(97 + i)}, *{chr(97 + i)}]\n"
        for i in range(8))
    assert len(bomb) < 1024
    assert "expands to more than 16 times its own size (aliases counted as expanded)" in _manifest_error(tmp_path, bomb)


def test_a_1kb_manifest_cannot_make_more_than_1mb_of_record(tmp_path):
    """Recipe settings are echoed into every quantized case of the record. The most a manifest under 1 KB
    can get accepted, an anchored list of long exclude patterns reused by INT8 and FP8, makes a record of
    its cases far under 1 MB; reusing the anchor beyond 16× the file's size is refused before anything runs."""
    import json
    import shutil
    import time
    from pathlib import Path

    from quantverdict.report.record import build_record

    shutil.copy(Path(__file__).resolve().parents[1] / "fixtures" / "example_models.py", tmp_path)
    patterns = ", ".join(["'" + "n" * 100 + f"{i}*'" for i in range(5)])  # match no node: the graphs are unchanged

    def manifest(uses: int) -> str:
        recipe = "      int8: {exclude: &many [" + patterns + "]}\n      fp8: {exclude: *many}\n"
        more = "" if uses <= 2 else "    unsupported_ops: {onnxruntime: [" + ", ".join(["*many"] * (uses - 2)) + "]}\n"
        return VALID.replace("      int8: {calibration: percentile}\n", recipe) + more

    text = manifest(2)
    assert len(text) < 1024, len(text)
    (tmp_path / "models.yaml").write_text(text)
    pipeline = Pipeline(tmp_path / "cache", manifest=tmp_path / "models.yaml")
    results = [pipeline.run(case).to_dict() for case in pipeline.cases(["tiny"])]
    record = json.dumps(build_record(results, pipeline.caps, time.time()), default=str)
    assert 0 < len(record) < 1 << 20, len(record)
    (tmp_path / "models.yaml").write_text(manifest(100))  # ~2 KB of text expanding to ~50 KB
    with pytest.raises(HarnessError, match="expands to more than 16 times its own size"):
        load_manifest(tmp_path / "models.yaml")


def test_near_valid_yaml_files_are_read_or_refused_in_one_line_never_crash_a_reader(tmp_path):
    """Hypothesis replaces values anywhere in a valid manifest and in the packaged tolerance table, gate policy and
    history policy (nulls, NaN, numbers of 400 digits, strings, nested values) and writes them as YAML: each reader
    either takes the file or refuses it with a HarnessError whose every line names the file; nothing else escapes."""
    import shutil
    from pathlib import Path

    import yaml
    from hypothesis import given, settings

    from near_valid import changes, mutated
    from quantverdict.documents import packaged
    from quantverdict.judge.tolerances import ToleranceTable
    from quantverdict.report.gate import load_policy
    from quantverdict.report.history import load_policies

    shutil.copy(Path(__file__).resolve().parents[1] / "fixtures" / "example_models.py", tmp_path)
    readers = {"models.yaml": (yaml.safe_load(VALID), load_manifest),
               "tolerances.yaml": (yaml.safe_load(packaged("tolerances.yaml").read_text()), ToleranceTable.load),
               "gate.yaml": (yaml.safe_load(packaged("gate.yaml").read_text()), load_policy),
               "history.yaml": (yaml.safe_load(packaged("history.yaml").read_text()),
                                lambda path: load_policies(path, "nightly"))}
    for name, (original, read) in readers.items():
        path = tmp_path / name

        @settings(max_examples=60, deadline=None, derandomize=True)
        @given(changes())
        def check(edits):
            path.write_text(yaml.safe_dump(mutated(original, edits)))
            try:
                read(path)
            except HarnessError as exc:
                lines = str(exc).splitlines()
                assert lines and all(name in line for line in lines), str(exc)

        check()


def test_a_field_name_that_breaks_lines_is_quoted_in_its_one_line_message(tmp_path):
    """A key holding U+0085 (a line break to Python's splitlines) or nothing at all is named quoted, so the message
    stays one line per problem (the fuzz test's Hypothesis on the GPU host found it)."""
    import yaml

    from quantverdict.report.gate import load_policy

    path = tmp_path / "gate.yaml"
    path.write_text(yaml.safe_dump({"defaults": {"\x85": 0, "": 1}}))
    with pytest.raises(HarnessError) as raised:
        load_policy(path)
    lines = str(raised.value).splitlines()
    assert len(lines) == 2 and all(line.startswith(f"{path}: defaults[") for line in lines), lines


def _toml(value: object) -> str:
    """``value`` as an inline TOML value (None has none: the caller leaves its key out)."""
    import json
    import math

    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, float) and not math.isfinite(value):
        return "nan" if math.isnan(value) else ("inf" if value > 0 else "-inf")
    if isinstance(value, (int, float)):
        return repr(value)
    if isinstance(value, str):
        return json.dumps(value)  # JSON's escapes are TOML basic-string escapes
    if isinstance(value, list):
        return "[" + ", ".join(_toml(item) for item in value if item is not None) + "]"
    assert isinstance(value, dict)
    pairs = [f"{json.dumps(key)} = {_toml(item)}" for key, item in value.items() if item is not None]
    return "{" + ", ".join(pairs) + "}"


def test_near_valid_project_settings_are_taken_or_refused_in_one_line_never_crash_a_run(tmp_path):
    """Hypothesis replaces values anywhere in a ``[tool.quantverdict]`` table that sets every setting (and the
    packaged speedup floors): resolving the settings as a run does (paths, recipe options, precisions, the shard)
    either takes them or refuses with a HarnessError whose every line names the file or the setting; nothing else
    escapes."""
    import yaml
    from hypothesis import given, settings

    from near_valid import changes, mutated
    from quantverdict.documents import packaged
    from quantverdict.perf.speedup import load_floors
    from quantverdict.precision import get_recipe
    from quantverdict.run.settings import Settings
    from quantverdict.run.shards import Shard

    table = {"manifest": "models.yaml", "models": "cnn,mlp", "precisions": ["int8", "fp16"], "backends": "onnxruntime",
             "tolerances": "tol.yaml", "calibration": "mse", "recipe-option": ["int8:smoothquant=0.5", "fallback=0.1"],
             "lock": "quantverdict.lock", "relock": "all", "baseline": "base.json", "gate-policy": "gate.yaml",
             "report-dir": "reports", "history-db": "h.sqlite", "cache-dir": "c", "shard": "1/2",
             "balance-by": "last.json", "time": True}
    pyproject = tmp_path / "pyproject.toml"

    def resolve() -> None:
        resolved = Settings.resolve({}, tmp_path)
        resolved.recipe_settings()
        if resolved["shard"]:
            Shard.parse(resolved["shard"])
        for name in resolved["precisions"] or []:
            get_recipe(name)

    floors = tmp_path / "speedups.yaml"
    for path, original, read in ((pyproject, {"tool": {"quantverdict": table}}, resolve),
                                 (floors, yaml.safe_load(packaged("speedups.yaml").read_text()),
                                  lambda: load_floors(floors))):

        @settings(max_examples=60, deadline=None, derandomize=True)
        @given(changes())
        def check(edits):
            document = mutated(original, edits)
            if path == pyproject:
                tool = document.get("tool") if isinstance(document, dict) else None
                body = tool.get("quantverdict") if isinstance(tool, dict) else None
                lines = [f"{json.dumps(key)} = {_toml(value)}" for key, value in (body or {}).items()
                         if value is not None] if isinstance(body, dict) else []
                path.write_text("[tool.quantverdict]\n" + "\n".join(lines) + "\n")
            else:
                path.write_text(yaml.safe_dump(document))
            try:
                read()
            except HarnessError as exc:
                said = str(exc).splitlines()
                assert said and all(str(path) in line or "--" in line or "setting" in line for line in said), str(exc)

        check()


def test_the_starter_manifest_declares_none_and_its_example_uncommented_is_read_as_an_entry(tmp_path, monkeypatch):
    """``quantverdict init``'s manifest declares no model of its own; uncommenting its example under ``models:`` gives
    an entry the manifest reads (its factory, a placeholder, is then named as not found), not a YAML error."""
    import re

    from quantverdict.run.cli import main

    monkeypatch.chdir(tmp_path)
    assert main(["init"]) == 0
    path = tmp_path / "models.yaml"
    assert load_manifest(path).specs == []
    head, example = path.read_text().split("\nmodels:", 1)
    path.write_text(head + "\nmodels:" + re.sub(r"^#(  .*)$", r"\1", example, flags=re.MULTILINE))
    with pytest.raises(HarnessError, match=r"my_package") as error:
        load_manifest(path)
    assert "YAML" not in str(error.value)
