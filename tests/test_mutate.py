"""Detection power, measured: planted defects caught by the tolerance table and the baseline rules,
and no false alarm on clean reruns from a cold cache."""
import pytest

from quantverdict.judge.mutations import Mutation, NotApplicable, load_catalogue
from quantverdict.run.mutate import mutated, run_campaign

MODELS = ["cnn", "digits-cnn", "resblock"]


@pytest.fixture(scope="module")
def campaign(qv_pipeline):
    return run_campaign(qv_pipeline, MODELS, load_catalogue(), reruns=1)


def test_every_kind_of_the_catalogue_is_planted(campaign):
    kinds = {m.kind for m in load_catalogue()}
    assert {p.kind for p in campaign.planted} == kinds


def test_significant_defects_are_caught(campaign):
    missed = [f"{p.defect} on {p.model}-{p.precision} ({p.snr_cost_db:.1f} dB)"
              for p in campaign.planted if p.significant and "any" not in p.caught_by]
    assert campaign.power() >= 0.95, missed


def test_the_baseline_rules_add_power_over_the_tolerance_table(campaign):
    assert campaign.power("tolerance") < campaign.power("baseline")


def test_no_false_alarm_on_clean_reruns_from_a_cold_cache(campaign):
    assert campaign.clean_reruns == 1 and campaign.false_alarms == []


def test_a_layer_left_in_float_is_caught_though_it_costs_no_accuracy(campaign):
    unquantized = [p for p in campaign.planted if p.kind == "layer_unquantized"]
    assert unquantized and all("baseline" in p.caught_by for p in unquantized)


def test_an_fp32_equivalent_rescale_overflows_fp16_only(qv_pipeline):
    from quantverdict.run.cases import Case

    defect = Mutation("fp16_overflow_rescale", "first", {"exponent": 16}, ("fp16",))
    fp16 = mutated(qv_pipeline, defect).run(Case("cnn", "fp16", "onnxruntime"))
    assert fp16.status == "failed" and "nonfinite" in fp16.message


def test_a_kind_with_no_site_in_a_model_is_named():
    import onnx

    with pytest.raises(NotApplicable):
        Mutation("bias_dropped", "first").graph(onnx.ModelProto())
