"""``recipe: auto``: a manifest model's INT8/FP8 settings chosen by a search on held-out calibration data, within a
time budget, cached, and recorded with every candidate's score."""
import fnmatch
import textwrap
from pathlib import Path

import pytest

from quantverdict.errors import CalibrationError
from quantverdict.models.data import batches_key
from quantverdict.judge.recipe_search import CALIBRATORS, TECHNIQUES, auto_settings, better, literal
from quantverdict.run.cases import Case
from quantverdict.run.held_out import HeldOutStore, split
from quantverdict.run.manifest import load_manifest
from quantverdict.run.pipeline import Pipeline

NETS = textwrap.dedent("""\
    from quantverdict.models.synthetic import build


    def block():
        return build("TransformerBlock")


    def dw():
        return build("dwblock")
    """)
MANIFEST = textwrap.dedent("""\
    models:
      - name: dw
        build: searchnets:dw
        inputs: [{name: input, shape: [4, 3, 32, 32], range: [0, 1]}]
        outputs: [logits]
        task: classification
        calibration: synthetic
        build_files: []
      - name: block
        build: searchnets:block
        inputs: [{name: tokens, shape: [4, 16, 64], range: [-3, 3]}]
        outputs: [hidden]
        calibration: synthetic
        build_files: []
        recipe: {int8: {auto: true, budget_s: 0}, fp8: {calibration: percentile}}
    """)


@pytest.fixture
def repo(tmp_path, monkeypatch) -> Path:
    (tmp_path / "searchnets.py").write_text(NETS)
    (tmp_path / "models.yaml").write_text(MANIFEST)
    monkeypatch.syspath_prepend(str(tmp_path))
    return tmp_path


def test_auto_is_a_manifest_models_default_for_int8_and_fp8_unless_it_names_a_recipe(repo):
    specs = {spec.name: spec for spec in load_manifest(repo / "models.yaml").specs}
    assert specs["dw"].recipe == {"int8": {"auto": True}, "fp8": {"auto": True}}
    assert specs["block"].recipe == {"int8": {"auto": True, "budget_s": 0}, "fp8": {"calibration": "percentile"}}


def test_auto_refuses_a_setting_beside_it_naming_it():
    with pytest.raises(CalibrationError, match="gptq cannot be set beside it"):
        auto_settings({"auto": True, "gptq": True})
    assert auto_settings({"calibration": "mse"}) is None


def test_the_held_out_part_is_never_calibrated_on_and_the_evaluation_set_is_never_seen(repo, qv_pipeline):
    pipeline = Pipeline(qv_pipeline.cache.root, manifest=repo / "models.yaml")
    whole = pipeline.store.calibration_batches("dw")
    fit, held = split(whole, "dw")
    assert len(fit) + len(held) == len(whole) and held and fit
    view = HeldOutStore(pipeline.store)
    key = pipeline.store.data_key
    assert view.data_key("dw", "calibration") == batches_key(fit) and view.data_key("dw", "evaluation") == batches_key(held)
    assert key("dw", "calibration") == batches_key(whole) and key("dw", "evaluation") not in (batches_key(fit),
                                                                                                batches_key(held))
    with pytest.raises(CalibrationError, match="needs at least 2 calibration batches"):
        split(whole[:1], "dw")


@pytest.mark.int8
def test_the_search_records_every_candidate_and_takes_what_held_out_data_favours(repo, qv_pipeline):
    pipeline = Pipeline(qv_pipeline.cache.root, manifest=repo / "models.yaml")
    result = pipeline.run(Case("dw", "int8", "onnxruntime"))
    assert result.status == "passed", result.message
    search = result.metrics["recipe"]["search"]
    tried = [c for c in search["candidates"] if c["score"] is not None]
    assert len(search["candidates"]) >= len(CALIBRATORS) + sum(map(len, TECHNIQUES)) and not search["not_tried"]
    chosen = next(c for c in tried if c["settings"] == search["chosen"])
    assert not any(better(c["score"], chosen["score"]) for c in tried)  # nothing tried beats the choice
    for key, value in search["chosen"].items():  # the case ran the chosen settings
        recorded = result.metrics["recipe"]["settings"][key]
        assert recorded == value or recorded == {"method": value}
    assert search["held_out_samples"] == 4  # one synthetic batch of four held out of four
    again = Pipeline(qv_pipeline.cache.root, manifest=repo / "models.yaml").store.recipe_search("dw", "int8")
    assert again is not None and again.to_dict() == search  # cached: read, not searched again


def test_a_spent_budget_keeps_the_first_candidate_and_lists_the_rest(repo, qv_pipeline):
    search = Pipeline(qv_pipeline.cache.root, manifest=repo / "models.yaml").store.recipe_search("block", "int8")
    assert search is not None and len(search.candidates) == 1 and search.chosen == CALIBRATORS[0]
    assert len(search.not_tried) == len(CALIBRATORS) - 1 + sum(map(len, TECHNIQUES))
    assert "time budget of 0 s spent" in search.note


def test_run_settings_and_named_recipes_are_not_searched(repo, qv_pipeline):
    manifest = repo / "models.yaml"
    assert Pipeline(qv_pipeline.cache.root, manifest=manifest).store.recipe_search("block", "fp8") is None
    overridden = Pipeline(qv_pipeline.cache.root, manifest=manifest, calibration="percentile")
    assert overridden.store.recipe_search("dw", "int8") is None
    assert overridden.store.recipe("dw", "int8", "emulated").params()["calibration"]["method"] == "percentile"


@pytest.mark.parametrize("name", ["/layer1/Conv", "/blocks.0/conv[dw]/Conv", "a*b?c"])
def test_a_layer_kept_in_float_is_excluded_by_its_name_alone(name):
    pattern = literal(name)
    assert fnmatch.fnmatchcase(name, pattern)
    assert not fnmatch.fnmatchcase(name + "x", pattern) and not fnmatch.fnmatchcase("x" + name, pattern)
