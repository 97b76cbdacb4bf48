"""``recipe: auto``: a manifest model's INT8/FP8 settings chosen by a search on held-out calibration data, within a
fixed amount of work, cached, and recorded with every candidate's score."""
import json
import math
import textwrap
from pathlib import Path

import numpy as np
import pytest

from quantverdict.errors import CalibrationError
from quantverdict.models.data import batches_key
from quantverdict.precision.settings import RecipeSettings
from quantverdict.tune.auto import AutoSettings, auto_settings
from quantverdict.tune import rules
from quantverdict.tune.rules import (MAX_DB, MIN_GAIN_DB, better, out_of_reach, paired_gains, pooled_snr_db,
                                     sample_noise)
from quantverdict.tune.stages import CALIBRATORS, stages
from quantverdict.judge.sensitivity import evaluate_recipe, weighted_layers
from quantverdict.judge.tolerances import Tolerance
from quantverdict.precision import get_recipe
from quantverdict.run.cases import Case
from quantverdict.tune.folds import HeldOut, folds, split
from quantverdict.run.manifest import load_manifest
from quantverdict.run.pipeline import Pipeline

NETS = textwrap.dedent("""\
    from quantverdict.models.synthetic import build


    def block():
        return build("TransformerBlock")


    def dw():
        return build("dwblock")


    def tiny():  # every activation after the input far below FP16's smallest subnormal (6e-8), as FP32 holds it
        import torch

        torch.manual_seed(0)
        net = torch.nn.Sequential(torch.nn.Linear(16, 32, bias=False), torch.nn.ReLU(),
                                  torch.nn.Linear(32, 32, bias=False), torch.nn.ReLU(), torch.nn.Linear(32, 8, bias=False))
        with torch.no_grad():
            for parameter in net.parameters():
                parameter.mul_(1e-8)
        return net.eval()
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
    view = pipeline.store.on_batches(HeldOut(pipeline.store.calibration_batches))
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
    tried = [c for c in search["candidates"] if c["score_db"] is not None]
    # the last stage tries the calibrators again on top of the rest: the one already there is not tried twice
    assert not search["not_tried"] and len(search["candidates"]) == sum(map(len, stages(AutoSettings(), 5))) - 1
    assert len({json.dumps(c["settings"], sort_keys=True) for c in search["candidates"]}) == len(search["candidates"])
    assert all(isinstance(c["score_db"], float) for c in tried)
    chosen = next(c for c in tried if c["settings"] == search["chosen"])
    for ancestor in (c for c in tried if c["settings"].items() < search["chosen"].items()):  # each step gained
        assert chosen["score_db"] > ancestor["score_db"] + MIN_GAIN_DB
    for key, value in search["chosen"].items():  # the case ran the chosen settings
        recorded = result.metrics["recipe"]["settings"][key]
        assert recorded == value or recorded == {"method": value}
    calibration = pipeline.store.calibration_batches("dw")  # every calibration sample judged once
    assert search["held_out_samples"] == sum(len(b["input"]) for b in calibration) and search["folds"] == 4
    again = Pipeline(qv_pipeline.cache.root, manifest=repo / "models.yaml").recipes.search("dw", "int8")
    assert again is not None and again.to_dict() == search  # cached: read, not searched again


def test_a_candidate_stops_after_the_fold_that_puts_it_out_of_reach_and_only_then():
    rng = np.random.default_rng(0)
    rival = rng.gamma(4.0, 1.0, 32)  # the stage's best so far: each of its 32 held-out samples' error energy
    assert out_of_reach(rival[:8], rival)  # the same SNR: it can never gain MIN_GAIN_DB
    assert out_of_reach(rival[:8] * 3 * rng.uniform(0.8, 1.2, 8), rival)  # 5 dB behind
    assert not out_of_reach(rival[:8] * 0.8, rival)  # 1 dB ahead
    assert not out_of_reach(rival[:1] * 3, rival)  # one sample: no spread to judge by
    assert not out_of_reach(rival[:8] * 1.25 * rng.uniform(0.1, 1.9, 8), rival)  # behind by less than the spread


@pytest.mark.int8
def test_racing_chooses_what_judging_every_candidate_on_every_fold_chooses(repo, qv_pipeline, tmp_path, monkeypatch):
    raced = Pipeline(qv_pipeline.cache.root, manifest=repo / "models.yaml").recipes.search("dw", "int8")
    monkeypatch.setattr(rules, "REACH_SE", math.inf)  # never out of reach: every candidate judged to the end
    full = Pipeline(tmp_path / "full", manifest=repo / "models.yaml").recipes.search("dw", "int8")
    assert raced is not None and full is not None and raced.chosen == full.chosen
    assert all(candidate.folds is None for candidate in full.candidates)
    scores = {candidate.settings: candidate for candidate in full.candidates}
    for candidate in raced.candidates:
        if candidate.folds is None:  # judged to the end: as judged by the full search
            assert (candidate.score_db, candidate.passed) == (scores[candidate.settings].score_db,
                                                           scores[candidate.settings].passed)
        else:  # stopped: not judged against the bounds, and not the choice
            assert 1 <= candidate.folds < raced.folds and candidate.passed is None
            assert candidate.settings != raced.chosen


@pytest.mark.int8
def test_where_no_candidate_can_meet_the_bounds_they_race_on_the_snr_and_choose_as_judged_in_full(repo, tmp_path,
                                                                                                  monkeypatch):
    """Every INT8 graph misses ``max_norm_err: 0`` on its first held-out sample: the bounds cannot decide, the SNR
    does, and candidates race on it as they do where the best so far meets the bounds."""
    (repo / "models.yaml").write_text(MANIFEST.replace(
        "    task: classification\n", "    task: classification\n    tolerances: {int8: {max_norm_err: 0.0}}\n", 1))
    raced = Pipeline(tmp_path / "raced", manifest=repo / "models.yaml").recipes.search("dw", "int8")
    monkeypatch.setattr(rules, "REACH_SE", math.inf)
    full = Pipeline(tmp_path / "full", manifest=repo / "models.yaml").recipes.search("dw", "int8")
    assert raced is not None and full is not None and raced.chosen == full.chosen and raced.kept == full.kept
    assert not any(candidate.passed for candidate in full.candidates)
    stopped = [candidate for candidate in raced.candidates if candidate.folds is not None]
    assert stopped and all(candidate.settings != raced.chosen and candidate.passed is None for candidate in stopped)
    judged = {candidate.settings: candidate.score_db for candidate in full.candidates}
    assert all(candidate.score_db == judged[candidate.settings] for candidate in raced.candidates
               if candidate.folds is None)


def test_the_wall_time_stop_keeps_the_first_candidate_lists_the_rest_and_marks_the_search_incomplete(repo, qv_pipeline):
    pipeline = Pipeline(qv_pipeline.cache.root, manifest=repo / "models.yaml")
    store, search = pipeline.store, pipeline.recipes.search("block", "int8")
    layers = len(weighted_layers(store, "block", get_recipe("int8").for_target("emulated")))
    assert search is not None and len(search.candidates) == 1 and search.chosen == CALIBRATORS[0]
    assert len(search.not_tried) == sum(map(len, stages(AutoSettings(), layers))) - 1 - len(CALIBRATORS)  # once each
    assert "stopped at the wall-time limit of 0 s: " in search.note and not search.complete
    assert not search.to_dict()["complete"]


def test_run_settings_and_named_recipes_are_not_searched(repo, qv_pipeline):
    manifest = repo / "models.yaml"
    assert Pipeline(qv_pipeline.cache.root, manifest=manifest).recipes.search("block", "fp8") is None
    overridden = Pipeline(qv_pipeline.cache.root, manifest=manifest, calibration="percentile")
    assert overridden.recipes.search("dw", "int8") is None
    assert overridden.recipes.recipe("dw", "int8", "emulated").params()["calibration"]["method"] == "percentile"


@pytest.mark.parametrize("count", [2, 3, 5, 8, 9])
def test_each_calibration_batch_is_held_out_once_and_never_calibrated_on_in_its_fold(count):
    batches = [{"x": np.full((2, 1), i)} for i in range(count)]
    parts = [split(batches, "m", fold) for fold in range(folds(batches))]
    held = [int(b["x"][0, 0]) for _, out in parts for b in out]
    assert sorted(held) == list(range(count)) and folds(batches) == min(4, count)
    for fit, out in parts:
        assert out and len(fit) + len(out) == count
        assert not {int(b["x"][0, 0]) for b in fit} & {int(b["x"][0, 0]) for b in out}
    if count == 8:
        assert all(len(fit) == 6 for fit, _ in parts)


def test_a_candidates_score_is_the_verdicts_snr_of_the_samples_pooled():
    """The lock's score and the case's verdict say the same thing: a text detector's map of an image without text (an
    FP32 output of exactly 0) counts by its error energy, not at -1000 dB, and a saturated softmax's nearly exact
    samples do not lift the score (a mean of per-sample SNRs put PaddleOCR's text-direction classifier at 115 dB,
    its verdict at 31)."""
    from quantverdict.judge.compare import compare
    from quantverdict.judge.tolerances import Tolerance

    rng = np.random.default_rng(0)
    saturated = np.tile([1.0, 1e-12], (30, 1))
    reference = np.concatenate([saturated, [[0.6, 0.4], [0.0, 0.0]]])
    candidate = reference + np.concatenate([rng.normal(0, 1e-12, (30, 2)), [[-0.05, 0.05], [0.01, 0.0]]])
    noise = sample_noise(reference, candidate)
    verdict = compare({"p": reference}, {"p": candidate}, Tolerance(), False).metrics["p"]["snr_db"]
    assert pooled_snr_db(reference, noise) == pytest.approx(verdict, abs=1e-9)
    assert pooled_snr_db(reference, noise) < 40 < float(np.mean(10 * np.log10(np.sum(reference ** 2, 1)[:30] /
                                                                               noise[:30])))
    assert pooled_snr_db(reference, sample_noise(reference, reference)) == MAX_DB
    assert pooled_snr_db(reference, sample_noise(reference, candidate + [[np.nan, 0]] + 0 * reference)) == -MAX_DB


def test_each_samples_gain_is_its_error_ratio_and_an_exact_sample_counts_as_the_best_inexact_one():
    """The signal cancels (an FP32 output of 0 counts by its error; a saturated softmax's 1e-24 against 1e-22 is its
    20 dB, the same ratio its logits' noise has), an exact sample counts as the least inexact error of either graph,
    not at ±1000 dB, and a non-finite sample is its graph's worst; 0 dB where both reproduce a sample exactly."""
    than = np.array([1.0, 4.0, 1e-22, 2.0, 0.0, 3.0, np.inf, 0.5])
    noise = np.array([0.5, 1.0, 1e-24, np.inf, 0.0, 0.0, np.inf, 0.5])
    gains = paired_gains(noise, than)
    assert gains[[0, 1, 2]] == pytest.approx(10 * np.log10([2.0, 4.0, 100.0]))
    assert gains[5] == pytest.approx(10 * np.log10(3.0 / 1e-24))  # exact: as good as the best inexact sample
    assert gains[4] == 0.0 and gains[6] == 0.0 and gains[7] == 0.0
    assert gains[3] == -MAX_DB and paired_gains(than[:4], noise[:4])[3] == MAX_DB
    assert np.all(paired_gains(np.zeros(3), np.zeros(3)) == 0.0)


def test_fallback_is_a_stage_only_where_the_share_keeps_a_layer():
    assert [RecipeSettings(fallback=0.1, fallback_format=("fp16", "fp32"))] in stages(
        AutoSettings(max_fallback=0.1), layers=10)  # FP16, else FP32, per layer
    assert not any(option.fallback for stage in stages(AutoSettings(max_fallback=0.1), layers=9) for option in stage)


def test_a_gain_is_taken_only_where_it_stands_out_of_the_paired_spread():
    rng = np.random.default_rng(0)
    incumbent = rng.gamma(2.0, 1.0, 64)  # each sample's error energy
    assert better(incumbent * 10 ** (-0.1 + rng.normal(0, 0.05, 64)), incumbent)  # 1 dB on every sample
    assert not better(incumbent * 10 ** (-MIN_GAIN_DB / 20), incumbent)  # consistent, but too small to matter
    assert not better(incumbent * 10 ** rng.normal(-0.03, 0.3, 64), incumbent)  # 0.3 dB within ±3 dB a sample
    assert out_of_reach(incumbent[:16] * 2, incumbent) and not out_of_reach(incumbent[:16] * 0.5, incumbent)




@pytest.mark.int8
def test_fallback_is_ranked_for_each_fold_without_the_samples_it_is_judged_on(repo, qv_pipeline):
    """The indices a fold holds out are its view's held-out samples; a fold's fallback layers are the most sensitive
    on the rest of the calibration set (pooled SNR of each layer quantized alone), and with nothing held out they
    are the run's own choice."""
    from quantverdict.judge.compare import compare
    from quantverdict.tune.fallback import choose_fallback, fallback_per_part
    from quantverdict.judge.tolerances import Tolerance
    from quantverdict.tune.folds import held_out_samples

    store = Pipeline(qv_pipeline.cache.root, manifest=repo / "models.yaml").store
    whole = store.calibration_batches("dw")
    reference = store.fp32_outputs("dw", "calibration")["logits"]
    parts = [held_out_samples(whole, fold) for fold in range(folds(whole))]
    for fold, part in enumerate(parts):
        view = store.on_batches(HeldOut(store.calibration_batches, fold))
        held = view.fp32_outputs("dw", "evaluation")["logits"]  # the same samples, up to float32 kernels' last bits
        np.testing.assert_allclose(reference[part], held, rtol=1e-5, atol=1e-6 * np.abs(held).max())
    recipe = get_recipe("int8").for_target("emulated").configured({"fallback": 0.4})
    base = recipe.with_options(fallback_layers=())
    layers = weighted_layers(store, "dw", base)
    chosen = fallback_per_part(store, "dw", recipe, [np.zeros(0, np.int64), *parts])
    assert chosen[0] == choose_fallback(store, "dw", recipe) and len(chosen[0]) == int(0.4 * len(layers)) > 0
    for part, kept in zip(parts, chosen[1:]):
        rest = np.setdiff1d(np.arange(len(reference)), part)
        snr = {node.name: compare({"logits": reference[rest]}, {"logits": store.graph_semantics(
            "dw", store.precision_onnx("dw", base.with_options(only=(node.name,))), "calibration")["logits"][rest]},
            Tolerance(), True).metrics["logits"]["snr_db"] for node in layers}
        assert list(kept) == sorted(snr, key=snr.get)[:len(kept)]


@pytest.mark.int8
def test_a_search_ranks_the_layers_once_for_each_preparation_not_again_for_gptq_or_a_later_calibrator(repo,
                                                                                                     monkeypatch):
    """Fallback ranks the layers with their weights rounded to nearest and kept in FP32: a candidate that adds GPTQ
    to one already ranked, or keeps its layers in another format, reads that ranking, and the calibrators tried after
    fallback are judged at its layers, so a search evaluates each layer quantized alone once per preparation, and the
    chosen recipe keeps the layers the fallback stage's ranking chose."""
    from quantverdict.tune.fallback import choose_fallback
    from quantverdict.run import artifacts

    (repo / "models.yaml").write_text(MANIFEST.replace("build_files: []\n  - name: block",
                                                       "build_files: []\n    recipe: {int8: {auto: true, max_fallback: "
                                                       "0.4}}\n  - name: block", 1))
    evaluated: list[str] = []
    each_alone = artifacts.each_alone

    def counted(graphs, layers, *args):
        if graphs.kept_in is None:  # quantized alone (a ranking), not kept alone in a wider format (their formats)
            evaluated.extend(layers)
        return each_alone(graphs, layers, *args)

    monkeypatch.setattr(artifacts, "each_alone", counted)
    pipeline = Pipeline(repo / "cache", manifest=repo / "models.yaml")  # nothing evaluated yet
    store, search = pipeline.store, pipeline.recipes.search("dw", "int8")
    assert search is not None and search.complete
    with_fallback = [c.settings for c in search.candidates if c.settings.fallback]
    assert any(settings.gptq for settings in with_fallback)
    rankings = {settings.unset("gptq", "fallback_format", "calibration") for settings in with_fallback}
    assert len({settings.calibration for settings in with_fallback}) > 1  # a later calibrator judged at its layers
    layers = weighted_layers(store, "dw", get_recipe("int8").for_target("emulated"))
    assert len(evaluated) == len(rankings) * len(layers) < len(with_fallback) * len(layers)
    recipe = pipeline.recipes.recipe("dw", "int8", "emulated")
    if search.chosen.fallback:
        ranked = {**search.chosen.to_dict(), "calibration": with_fallback[0].to_dict()["calibration"]}
        unrounded = get_recipe("int8").for_target("emulated").configured({**ranked, "gptq": False,
                                                                          "fallback_format": "fp32"})
        assert list(recipe.options.fallback_layers) == list(choose_fallback(store, "dw", unrounded))
    assert len(evaluated) == len(rankings) * len(layers)  # the chosen recipe's ranking read, not made


@pytest.mark.int8
def test_the_search_judges_the_cases_task_metric_bounds_a_worst_samples_among_them(repo):
    """A bound on a task metric (here the worst held-out sample's cosine, as an embedding's worst sentence) is one of
    the case's bounds the search judges each candidate by, with no labels (the calibration set has none): a bound no
    candidate meets leaves each one judged to the end failed (the others raced on their SNR and stopped), and the
    search then says what more layers in FP32 would take."""
    (repo / "worst.py").write_text(textwrap.dedent("""\
        import numpy as np

        CALLS = []


        def worst(reference, candidate, labels):
            CALLS.append(labels)
            r, c = (np.asarray(d["logits"], np.float64) for d in (reference, candidate))
            rows = np.sum(r * c, 1) / np.linalg.norm(r, axis=1) / np.linalg.norm(c, axis=1)
            return {"worst_sample_cosine": float(rows.min())}
        """))
    (repo / "models.yaml").write_text(MANIFEST.replace(
        "    task: classification\n", "    task: classification\n    metric: worst:worst\n"
        "    tolerances: {int8: {task_min: {worst_sample_cosine: 1.5}}}\n", 1))
    import worst

    search = Pipeline(repo / "cache", manifest=repo / "models.yaml").recipes.search("dw", "int8")
    assert search is not None and search.candidates
    assert all(c.passed is False if c.folds is None else c.passed is None for c in search.candidates)
    assert worst.CALLS and all(labels is None for labels in worst.CALLS)
    assert search.note.startswith("the choice misses the case's bounds on held-out calibration samples")


def test_a_candidate_that_meets_the_cases_bounds_beats_one_that_misses_them_whatever_its_snr():
    rng = np.random.default_rng(0)
    than = rng.gamma(4.0, 1.0, 64)  # each held-out sample's error energy
    barely, much = than * 10 ** -0.001, than * 10 ** -0.5  # 0.01 dB and 5 dB more SNR
    assert better(barely, than, meets=True, than_meets=False)  # no SNR gain to speak of: the bounds decide
    assert not better(much, than, meets=False, than_meets=True)  # a higher SNR that misses a bound
    assert better(much, than, meets=True, than_meets=True) and not better(barely, than, True, True)
    assert better(much, than, meets=None, than_meets=True)  # a candidate not judged on the bounds: SNR alone


@pytest.mark.int8
def test_compare_recipes_judges_the_searched_settings_as_the_harness_row(repo, qv_pipeline, tmp_path, monkeypatch):
    """A manifest model's default recipe is ``auto``: compare-recipes' harness row is what its run uses, the
    search's choice, not a failure on the setting ``auto``."""
    from quantverdict.run.cli import main

    monkeypatch.delenv("QUANTVERDICT_MODELOPT_PYTHON", raising=False)
    out = tmp_path / "comparison.json"
    assert main(["compare-recipes", "block", "--manifest", str(repo / "models.yaml"), "--json", str(out),
                 "--cache-dir", str(qv_pipeline.cache.root)]) == 0
    harness = json.loads(out.read_text())["quantizers"][0]
    assert harness["label"] == "harness" and not harness["error"] and harness["settings"] == CALIBRATORS[0].to_dict()


@pytest.mark.int8
def test_ranking_layers_for_fallback_keeps_their_evaluations_not_their_graphs(tmp_path):
    """Each layer quantized alone is a copy of the whole model: ranking them keeps each one's errors against FP32 in the
    cache (three floats per sample; a second ranking reads them), neither its outputs nor its graph."""
    from quantverdict.tune.fallback import choose_fallback

    store = Pipeline(tmp_path / "cache").store
    recipe = get_recipe("int8").for_target("emulated").configured({"fallback": 0.5})
    kept = choose_fallback(store, "resblock", recipe)
    cache = tmp_path / "cache"
    assert kept and not list((cache / "precision").rglob("*.onnx"))
    evaluations = sorted(p.name for p in (cache / "layer-errors").rglob("*") if p.is_file())
    assert len(evaluations) >= len(weighted_layers(store, "resblock", recipe))
    samples = sum(len(batch["input"]) for batch in store.batches("resblock", "calibration"))
    for path in (cache / "layer-errors").rglob("*.npz"):
        with np.load(path) as stored:
            assert all(stored[key].shape == (samples,) for key in stored.files if key != "__meta__")
    assert choose_fallback(Pipeline(cache).store, "resblock", recipe) == kept
    assert sorted(p.name for p in (cache / "layer-errors").rglob("*") if p.is_file()) == evaluations  # read, not made


def test_a_choice_that_misses_the_cases_bounds_says_how_many_float_layers_they_would_take(repo, qv_pipeline):
    """Bounds no recipe meets (no error at all on the held-out samples): past max_fallback the search tries the choice
    with more layers kept wider (half of dw's in the widest format offered first: where that misses, nothing else),
    chooses none of them, and says so; a bound the choice meets tries nothing more."""
    from quantverdict.tune.beyond import Candidate, beyond_note

    manifest = repo / "tight.yaml"
    manifest.write_text(MANIFEST.replace("    task: classification\n",
                                         "    task: classification\n    tolerances: {int8: {max_norm_err: 0.0}}\n", 1))
    pipeline = Pipeline(qv_pipeline.cache.root, manifest=manifest)
    store, search = pipeline.store, pipeline.recipes.search("dw", "int8")
    assert search is not None and search.complete and not search.chosen.fallback
    layers = len(weighted_layers(store, "dw", get_recipe("int8").for_target("emulated")))
    assert [int(c.settings.fallback * layers) for c in search.beyond] == [layers // 2]  # half missed: no fewer tried
    assert all(c.passed is False and c.settings.unset("fallback", "fallback_format") == search.chosen
               for c in search.beyond)
    assert (f"so does keeping {layers // 2} of the {layers} weighted layers in FP32 ({layers // 2 / layers:.0%}); "
            "max_fallback is 10%") in search.note
    easy = Pipeline(qv_pipeline.cache.root, manifest=repo / "models.yaml").recipes.search("dw", "int8")
    assert easy is not None and not easy.beyond
    met = [Candidate(settings=RecipeSettings(fallback=0.35), score_db=31.5, passed=True),
           Candidate(settings=RecipeSettings(fallback=0.25), score_db=20.0, passed=False)]
    assert beyond_note(met, 10, 0.1).endswith(
        "keeping 3 of the 10 weighted layers in FP32 (30%) meets them (31.50 dB), the fewest found; max_fallback is 10%")


def test_the_fewest_layers_in_fp32_that_meet_the_bounds_are_found_by_bisection():
    """Half the layers first (where that misses, nothing fewer is tried), then bisection down to the fewest that meet
    the bounds, each count tried once, as a share whose floor keeps exactly that many; none past the user's share."""
    from quantverdict.tune.beyond import Candidate, fewest_in_float

    def judged(needs: int, tried: list[int]):
        def judge(share: float) -> Candidate:
            tried.append(int(share * 48))
            return Candidate(settings=RecipeSettings(fallback=share), score_db=0.0, passed=tried[-1] >= needs)
        return judge

    for needs, expected in [(13, [24, 14, 9, 11, 12, 13]), (5, [24, 14, 9, 6, 5]), (25, [24]), (24, [24, 14, 19, 21,
                                                                                                       22, 23])]:
        tried: list[int] = []
        found = fewest_in_float(judged(needs, tried), 48, 0.1, lambda: True)
        assert tried == expected, needs
        met = [int(c.settings.fallback * 48) for c in found if c.passed]
        assert (min(met) if met else None) == (needs if needs <= 24 else None)
    assert fewest_in_float(judged(1, []), 4, 0.5, lambda: True) == []  # the user's share is already half
    for needs, widest_needs, expected in [(13, 13, [24, 24, 14, 9, 11, 12, 13]), (13, 49, [24]),
                                          (25, 24, [24, 24])]:  # the widest format first, where several are offered
        tried = []
        found = fewest_in_float(judged(needs, tried), 48, 0.1, lambda: True, judged(widest_needs, tried))
        assert tried == expected and found[0].passed is (widest_needs <= 24), (needs, widest_needs)
    from quantverdict.tune.beyond import share_of
    for layers in range(1, 400):
        shares = [share_of(count, layers) for count in range(layers + 1)]
        assert [math.floor(share * layers) for share in shares] == list(range(layers + 1)), layers
        assert all(share - count / layers < 2e-4 for count, share in enumerate(shares)), layers
    assert fewest_in_float(judged(1, []), 48, 0.1, lambda: False) == []  # the wall-time stop
    from quantverdict.tune.auto import AutoSettings
    from quantverdict.tune.beyond import beyond_plan

    for layers, share in [(48, 0.1), (51, 0.1), (7, 0.0), (4, 0.5), (300, 0.02)]:  # the time left counts the most
        most = 0
        for needs in range(1, layers + 2):
            def judge(tried: float) -> Candidate:
                return Candidate(settings=RecipeSettings(fallback=tried), score_db=0.0,
                                 passed=math.floor(tried * layers) >= needs)

            tries = fewest_in_float(judge, layers, share, lambda: True, judge)
            most = max(most, len(tries))
        assert len(beyond_plan(RecipeSettings(gptq=True), layers, AutoSettings(max_fallback=share))) == most, layers


def test_time_left_counts_each_candidate_as_those_of_its_kind_took():
    """A candidate that keeps layers in FP32 with a preparation not ranked before ranks every layer alone: the
    estimate times it as those did, says where none has run yet rather than pricing it as a calibrator's, and prices
    one that only adds GPTQ or another calibrator to a ranked one as the others; a new preparation and GPTQ's first
    rounding of one, before one is timed, as a plain candidate and the passes they add."""
    from quantverdict.tune.result import Candidate
    from quantverdict.tune.progress import time_left, upcoming

    timed = [Candidate(settings=RecipeSettings(calibration="max"), seconds=4.0),
             Candidate(settings=RecipeSettings(calibration="mse"), seconds=6.0)]
    plan = [RecipeSettings(calibration="mse", smoothquant=0.8), RecipeSettings(fallback=0.1),
            RecipeSettings(fallback=0.1, gptq=True)]
    assert time_left(plan, timed) == "about 10 s left, and 1 candidate that ranks layers, not timed yet"
    timed.append(Candidate(settings=RecipeSettings(fallback=0.1), seconds=40.0))
    assert time_left(plan, timed) == "about 15 s left"  # ranked already: they read its ranking
    assert time_left([RecipeSettings(calibration="max", fallback=0.1)], timed) == "about 5 s left"  # at its layers
    assert time_left([RecipeSettings(equalize=True, fallback=0.1)], timed) == "about 40 s left"  # another preparation
    assert time_left([], timed) == "about 0 s left"
    later = upcoming(RecipeSettings(calibration="mse"), [RecipeSettings(smoothquant=0.8), RecipeSettings(fallback=0.1),
                                                         RecipeSettings(gptq=True), RecipeSettings(calibration="max")])
    assert [bool(each.fallback) for each in later] == [False, True, True, True]
    assert upcoming(RecipeSettings(calibration="mse"), [RecipeSettings(fallback=0.1), RecipeSettings(calibration="max"),
                                                        RecipeSettings(calibration="mse")],
                    seen=[RecipeSettings(calibration="mse", fallback=0.1)]) == \
        [RecipeSettings(calibration="max", fallback=0.1)]  # tried already: a search does not judge it again
    assert time_left(later, timed[:2]) == "about 15 s left, and 1 candidate that ranks layers, not timed yet"
    from quantverdict.tune.progress import ranking_seconds

    # MobileNetV2's 52 layers on a 2-core runner, a pass of its graph 5 s: each layer's from its cut, half of one
    assert ranking_seconds(layers=52, workers=2, pass_s=5.0) == 65.0
    asked: list[bool] = []

    def ranking() -> float:
        asked.append(True)
        return 65.0

    assert time_left(plan, timed[:2], ranking) == ("about 80 s left, with 1 candidate that ranks layers, estimated "
                                                   "from one pass of the graph")  # 5 + (5 + 65) + 5
    assert time_left(plan, timed, ranking) == "about 15 s left"  # timed once: the measured time, not the estimate
    assert time_left(plan[:1], timed[:2], ranking) == "about 5 s left" and len(asked) == 1  # none ranks: not asked
    first = [Candidate(settings=RecipeSettings(calibration="max"), seconds=12.0),  # the search's one-time work
             *(Candidate(settings=RecipeSettings(calibration=name), seconds=2.0 + index) for index, name in
               enumerate(["percentile", "mse"]))]
    assert time_left([RecipeSettings(calibration="max")], first) == "about 3 s left"  # a plain one: their median
    # a preparation not timed yet: a plain candidate and the first's one-time work (about a pass), 3 + 9; GPTQ's first
    # rounding of a preparation: one and a half such passes, 3 + 1.5 × 9
    migrations = [RecipeSettings(smoothquant=0.5), RecipeSettings(equalize=True)]
    assert time_left(migrations, first) == "about 24 s left"
    # where the first's calibration pass measured 6 s of what later candidates ask (their channel ranges, GPTQ's H),
    # those seconds are not its one-time work: the pass is 3, each preparation 3 + 3
    assert time_left(migrations, first, ridden=6.0) == "about 12 s left"
    assert time_left([RecipeSettings(gptq=True), RecipeSettings(calibration="mse", gptq=True)], first) == \
        "about 20 s left"  # the second rounds alike: priced as a plain one (16.5 + 3)
    locked = [Candidate(settings=RecipeSettings(fallback=0.1, gptq=True), seconds=12.0)]  # a check's first: the lock's
    assert time_left([RecipeSettings(calibration="mse", fallback=0.1, gptq=True)], locked) == \
        "about 0 s left, and 1 candidate of a kind not timed yet"  # nothing plain timed to price it by: said so
    prepared = [*first, Candidate(settings=migrations[0], seconds=5.0)]
    assert time_left(migrations[1:], prepared) == "about 5 s left"  # one timed: its time
    # the search past max_fallback: its first try is sure, the bisection after it only where that one meets the bounds
    ranked, beyond = [*first, Candidate(settings=RecipeSettings(fallback=0.1), seconds=40.0)], \
        [RecipeSettings(fallback=0.5)] * 4  # at the choice's ranking: plain ones
    assert time_left([RecipeSettings(calibration="mse", fallback=0.1), *beyond], ranked, maybe=3) == (
        "about 6 s left, up to 9 s more if more layers kept wider meet the case's bounds")
    assert time_left(beyond[1:], ranked) == "about 9 s left"  # it did: the rest are sure


def test_the_trade_off_it_found_is_in_the_record_and_on_the_page(repo, monkeypatch, tmp_path):
    """The best candidate judged at each share of layers kept in FP32 (none, max_fallback, and the shares past it the
    search tried because the bounds were missed), by share, each naming its settings; the record that holds it reads
    under the schema, and the page shows it as a chart and a table."""
    from quantverdict.report.load import load_record
    from quantverdict.run.cli import main

    (repo / "tight.yaml").write_text(MANIFEST.replace(
        "    task: classification\n", "    task: classification\n    tolerances: {int8: {max_norm_err: 0.0}}\n", 1))
    monkeypatch.chdir(repo)
    code = main(["run", "--manifest", "tight.yaml", "--models", "dw", "--precisions", "int8", "--backends",
                 "onnxruntime", "--cache-dir", str(tmp_path / "cache"), "--report-dir", "reports"])
    assert code == 1  # no recipe meets a bound of no error at all
    record_path = next((repo / "reports").glob("*.json"))
    load_record(record_path)  # the record reads under the schema
    search = json.loads(record_path.read_text())["cases"][0]["metrics"]["recipe"]["search"]
    points, layers = search["tradeoff"], search["layers"]
    counts = {int((c["settings"].get("fallback") or 0.0) * layers) for c in search["candidates"] + search["beyond"]}
    assert [point["layers_in_float"] for point in points] == sorted(counts) and len(points) >= 2
    assert [point["share"] for point in points] == [round(point["layers_in_float"] / layers, 4) for point in points]
    assert sum(point["chosen"] for point in points) == 1 and points[0]["chosen"]  # the choice keeps none wider
    assert [point["format"] for point in points] == [None] + ["fp16/fp32"] * (len(points) - 2) + ["fp32"]  # past the
    # user's share, half the layers in the widest format offered missed the bounds: nothing narrower or fewer tried
    scored = {json.dumps(c["settings"], sort_keys=True): c["score_db"] for c in search["candidates"] + search["beyond"]
              if c["folds"] is None}  # judged on every fold
    for point in points:  # the best of its share
        same = [score for settings, score in scored.items() if int((json.loads(settings).get("fallback") or 0.0)
                                                                       * layers) == point["layers_in_float"]]
        assert point["score_db"] == max(same) and point["passed"] is False
    cost = search["cost"]  # what the search took, beside what it found
    assert cost["wall_s"] > 0 and cost["cpu_s"] > 0 and cost["peak_mb"] > 0
    assert main(["report", str(record_path), "--out-dir", str(tmp_path / "page")]) == 0
    summary = (tmp_path / "page" / f"{record_path.stem}.md").read_text()
    assert "## Recipe searches\n\n- dw int8: the choice misses the case's bounds on held-out calibration samples" in summary
    took = f"the search took {cost['wall_s']:.0f} s, {cost['cpu_s']:.0f} CPU-s, peak memory {cost['peak_mb'] / 1024:.1f} GB"
    assert took in summary
    page = (tmp_path / "page" / f"{record_path.stem}.html").read_text()
    assert took.replace("the search took ", "<li>dw int8: ") in page
    assert "Recipe search: layers kept wider against held-out accuracy" in page
    assert 'alt="recipe search trade-off" src="data:image/png;base64,' in page and "<td>dw</td><td>int8</td><td>50%" in page
    assert "<td>FP32</td>" in page  # the widest format offered, tried first past the user's share


def test_a_lower_bound_is_met_in_a_search_only_by_the_evaluations_standard_error():
    """A held-out estimate that meets ``min_cosine`` or ``min_top1`` by less than one standard error of the same metric
    on the evaluation's sample count is short of the margin; by two, it clears it. The margin is the held-out 95%
    interval's, narrowed by the square root of the sample counts' ratio."""
    from quantverdict.judge.compare import compare
    from quantverdict.tune.margin import evaluation_error, short_of_margin
    from quantverdict.judge.tolerances import Tolerance

    rng = np.random.default_rng(0)
    reference = rng.normal(size=(64, 10))
    metrics = compare({"y": reference}, {"y": reference + 0.4 * rng.normal(size=reference.shape)}, Tolerance(),
                      classification=True).metrics
    held_out = metrics["y"]
    for metric, bound in [("cosine", "min_cosine"), ("top1_agreement", "min_top1")]:
        interval = held_out["intervals"][metric]
        error = evaluation_error(interval, 64, 512)
        assert error == pytest.approx(evaluation_error(interval, 64, 128) / 2)  # 4× the samples: half the error
        assert 0 < error < (interval["high"] - interval["low"]) / 2
        within = Tolerance(**{bound: held_out[metric] - error / 2})
        assert short_of_margin(metrics, within, 512) and not short_of_margin(metrics, within, 0)  # no count: no margin
        assert not short_of_margin(metrics, Tolerance(**{bound: held_out[metric] - 2 * error}), 512)


def test_fallback_keeps_its_layers_in_fp32_only_where_fp16_is_worse(repo):
    """A network whose activations FP16 flushes to zero: every layer the search's fallback keeps stays FP32 (each in FP16
    alone costs the output more than any INT8 layer left), and the choice scores far above the same layers all in
    FP16 (0 dB: zero outputs)."""
    (repo / "models.yaml").write_text(MANIFEST + textwrap.indent(textwrap.dedent("""\
        - name: tiny
          build: searchnets:tiny
          inputs: [{name: x, shape: [8, 16], range: [-1, 1]}]
          outputs: [y]
          calibration: synthetic
          build_files: []
          recipe: {int8: {auto: true, max_fallback: 0.4}}
        """), "  "))
    pipeline = Pipeline(repo / "cache", manifest=repo / "models.yaml")
    search = pipeline.recipes.search("tiny", "int8")
    assert search.chosen.fallback and search.chosen.fallback_format == ("fp16", "fp32")
    kept = pipeline.recipes.recipe("tiny", "int8", "emulated").options.kept()
    assert kept and set(kept.values()) == {"fp32"}
    assert all(c.score_db > 20 for c in search.candidates if c.settings.fallback and c.score_db is not None)
    in_fp16 = Pipeline(repo / "cache", manifest=repo / "models.yaml", recipe_settings={"int8": {
        **search.chosen.to_dict(), "fallback_format": "fp16"}})
    recipe = in_fp16.recipes.recipe("tiny", "int8", "emulated")
    assert recipe.options.fallback_layers == tuple(kept)
    assert evaluate_recipe(in_fp16.store, "tiny", recipe, Tolerance(), "calibration").metrics["y"]["snr_db"] < 1.0



def test_a_long_candidate_says_it_is_still_working_until_it_ends():
    """A candidate that ranks every layer quantized alone takes minutes: the search says so at least every
    ``HEARTBEAT_S`` of it (here a twentieth of a second), and nothing once the candidate has ended."""
    import threading

    from quantverdict.heartbeat import heartbeat

    said: list[float] = []
    twice = threading.Event()

    def say(seconds: float) -> None:
        said.append(seconds)
        if len(said) >= 2:
            twice.set()

    with heartbeat(say, every=0.05):
        assert twice.wait(10), said  # the work goes on: it is heard of
    heard = len(said)
    assert said == sorted(said) and said[0] > 0
    threading.Event().wait(0.2)
    assert len(said) == heard  # the work ended: silence


def test_a_search_runs_gptq_with_small_thread_pools_and_gives_them_back(repo, tmp_path, monkeypatch):
    """numpy's BLAS and the OpenMP pools (torch's) at one thread inside the search's GPTQ (the limit made smaller than
    this machine's cores, so that it shows), torch's own count too, and as before once the search ends. The pools
    loaded before the search: one loaded inside (SciPy's BLAS, where its intervals load it) is past the limit."""
    import torch
    from threadpoolctl import threadpool_info

    from quantverdict.precision import pools
    from quantverdict.precision import gptq

    def sizes() -> dict[str, int]:
        return {info["filepath"]: info["num_threads"] for info in threadpool_info()}

    monkeypatch.setattr(pools, "SEARCH_THREADS", 1)
    before, torch_before = sizes(), torch.get_num_threads()
    seen: list[tuple[dict[str, int], int]] = []
    rounding = gptq.round_weights

    def watched(*args, **kwargs):
        seen.append((sizes(), torch.get_num_threads()))
        return rounding(*args, **kwargs)

    monkeypatch.setattr(gptq, "round_weights", watched)
    found = Pipeline(tmp_path / "cache", manifest=repo / "models.yaml").recipes.search("dw", "int8")
    assert found is not None and seen, "no GPTQ candidate ran"
    apis = {info["internal_api"] for info in threadpool_info() if info["filepath"] in before}
    assert {"openblas", "openmp"} <= apis  # numpy's BLAS and torch's OpenMP are there to limit
    assert all(all(inside[pool] == 1 for pool in before) and threads == 1 for inside, threads in seen), seen
    after = sizes()
    assert {pool: after[pool] for pool in before} == before and torch.get_num_threads() == torch_before


def _declared_by_its_onnx_file(repo: Path, tmp_path: Path) -> None:
    """``onnx.yaml`` in ``tmp_path``: the repository's ``dw`` declared by its exported ONNX file (``dw.onnx``), so that
    nothing but a search's GPTQ loads torch."""
    exported = Pipeline(tmp_path / "export", manifest=repo / "models.yaml").store.fp32_onnx("dw")
    (tmp_path / "dw.onnx").write_bytes(exported.read_bytes())
    (tmp_path / "onnx.yaml").write_text(MANIFEST.split("  - name: block")[0].replace(
        "build: searchnets:dw", "onnx: dw.onnx").replace("        build_files: []\n", ""))


def test_a_nightly_check_that_finds_every_judgement_cached_loads_no_torch(repo, tmp_path):
    """With nothing changed since the lock, the check reads every judgement from the cache: torch, which only GPTQ's
    H and rounding use, is not loaded (0.6 s and 440 MB of a 2.3 s check), where the lock's own search loaded it; a
    search's plan of its first pass loads it (in a thread) only as a pass that measures H starts. Each command in a
    process of its own, as a nightly runs them."""
    import subprocess
    import sys

    _declared_by_its_onnx_file(repo, tmp_path)
    watched = ("import atexit, runpy, sys\n"
               "atexit.register(lambda: print('torch loaded:', 'torch' in sys.modules))\n"
               "sys.argv = ['quantverdict', *sys.argv[1:]]\n"
               "runpy.run_module('quantverdict', run_name='__main__')\n")

    def lock(*extra: str) -> str:
        done = subprocess.run([sys.executable, "-c", watched, "lock", "--manifest", "onnx.yaml", "--models", "dw",
                               "--precisions", "int8", "--cache-dir", "cache", *extra], cwd=tmp_path,
                              capture_output=True, text=True)
        assert done.returncode == 0, done.stderr[-2000:]
        return done.stdout.splitlines()[-1]

    assert lock() == "torch loaded: True"  # its search's GPTQ candidates
    assert lock("--check") == "torch loaded: False"
    # where the check's candidates round with GPTQ, torch begins to load as a pass that measures H starts, not before
    planned = ("import json, sys, threading\n"
               "from pathlib import Path\n"
               "from quantverdict.precision import first_pass\n"
               "from quantverdict.precision.settings import RecipeSettings\n"
               "def loading():\n"
               "    return [t for t in threading.enumerate() if t.name == 'quantverdict-torch-import']\n"
               "plan = first_pass.planned([RecipeSettings(), RecipeSettings(gptq=True)])\n"
               "before = bool(loading()) or 'torch' in sys.modules\n"
               "riders = plan(Path('dw.onnx').read_bytes(), 5)\n"
               "started = loading()\n"
               "[thread.join() for thread in started]\n"
               "names = [type(rider).__name__ for rider in riders]\n"
               "print(json.dumps([before, len(started), 'torch' in sys.modules, names]))\n")
    done = subprocess.run([sys.executable, "-c", planned], cwd=tmp_path, capture_output=True, text=True)
    assert done.returncode == 0, done.stderr[-2000:]
    before, started, loaded, riders = json.loads(done.stdout.splitlines()[-1])
    assert (before, started, loaded) == (False, 1, True) and "MomentSums" in riders, (before, started, loaded, riders)


def test_a_search_that_loads_torch_holds_its_pools_small_and_gives_them_back(repo, tmp_path):
    """A model declared by its ONNX file: nothing loads torch before the search, which begins to load it in a thread
    of its own as its first calibration pass starts (its GPTQ will ask for it) inside the limits it set (one thread
    here, where this machine has more: it shows), so torch's own are held there too, and after the search its threads
    are torch's default. A process of its own: this one has torch loaded."""
    import subprocess
    import sys

    _declared_by_its_onnx_file(repo, tmp_path)
    script = textwrap.dedent(f"""\
        import json, sys
        from pathlib import Path
        from quantverdict.precision import first_pass, gptq, pools
        from quantverdict.run.pipeline import Pipeline
        pools.SEARCH_THREADS = 1
        ahead, loading = [], first_pass.torch_ahead
        first_pass.torch_ahead = lambda: ahead.append("torch" in sys.modules) or loading()
        seen, rounding = [], gptq.round_weights
        def watched(*args, **kwargs):
            seen.append(sys.modules["torch"].get_num_threads())
            return rounding(*args, **kwargs)
        gptq.round_weights = watched
        before = "torch" in sys.modules
        Pipeline(Path({str(tmp_path / "cache")!r}), manifest=Path({str(tmp_path / "onnx.yaml")!r})).recipes.search(
            "dw", "int8")
        print(json.dumps({{"before": before, "ahead": ahead, "inside": seen,
                          "after": sys.modules["torch"].get_num_threads()}}))
        """)
    found = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, cwd=tmp_path)
    assert found.returncode == 0, found.stderr[-2000:]
    threads = json.loads(found.stdout.splitlines()[-1])
    default = subprocess.run([sys.executable, "-c", "import torch; print(torch.get_num_threads())"],
                             capture_output=True, text=True, check=True).stdout.strip()
    assert threads["before"] is False and threads["ahead"] == [False], threads  # the search's thread imported it
    assert threads["inside"] and set(threads["inside"]) == {1}, threads
    assert threads["after"] == int(default), (threads, default)


CONVS = textwrap.dedent("""\
    import torch


    def convs():  # convolutions only, none depthwise, a 1 × 1 convolution for its head: what a detector's trunk is
        torch.manual_seed(0)
        return torch.nn.Sequential(torch.nn.Conv2d(3, 8, 3), torch.nn.ReLU(), torch.nn.Conv2d(8, 8, 3),
                                   torch.nn.ReLU(), torch.nn.AdaptiveAvgPool2d(1), torch.nn.Conv2d(8, 5, 1),
                                   torch.nn.Flatten()).eval()
    """)


def test_a_preparation_that_changes_nothing_in_the_graph_is_not_judged_again(repo, qv_pipeline):
    """SmoothQuant on a graph without MatMul or Gemm, equalization without a depthwise convolution: each candidate
    would be its base's graph, so none is calibrated or judged; it is recorded with the reason. Where equalization
    has its pairs (a depthwise block), it is judged."""
    (repo / "convnets.py").write_text(CONVS)
    (repo / "convs.yaml").write_text(MANIFEST.replace("searchnets:dw", "convnets:convs").split("  - name: block")[0])
    searched = Pipeline(qv_pipeline.cache.root, manifest=repo / "convs.yaml").recipes.search("dw", "int8")
    assert searched is not None
    unjudged = {json.dumps(c.settings.to_dict(), sort_keys=True): c for c in searched.candidates
                if isinstance(c.settings.smoothquant, float) or c.settings.equalize is True}
    assert len(unjudged) == 3, list(unjudged)
    for candidate in unjudged.values():
        reason = "SmoothQuant finds no MatMul" if isinstance(candidate.settings.smoothquant, float) else \
            "equalization finds no convolution feeding a depthwise"
        assert candidate.score_db is None and candidate.error.startswith(f"changes nothing in this graph: {reason}")
    dw = Pipeline(qv_pipeline.cache.root, manifest=repo / "models.yaml").recipes.search("dw", "int8")
    equalized = next(c for c in dw.candidates if c.settings.equalize is True)
    assert equalized.error is None and equalized.score_db is not None
