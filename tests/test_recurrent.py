"""LSTMs in INT8 where a runtime runs them so: ``recurrent: dynamic`` writes ONNX Runtime's DynamicQuantizeLSTM (what
its ``quantize_dynamic`` writes), judged like any layer; TensorRT's graph keeps them in float with the reason."""
import numpy as np
import onnx
import onnxruntime as ort
import pytest

from quantverdict.errors import CalibrationError
from quantverdict.precision import get_recipe
from quantverdict.precision.recurrent import dynamic_lstms
from quantverdict.run.cases import Case
from quantverdict.run.pipeline import Pipeline
from user_repo import speaker_manifest, written

SPEAKER = """import torch
from torch import nn


class Speaker(nn.Module):
    def __init__(self):
        super().__init__()
        torch.manual_seed(0)
        self.lstm = nn.LSTM(16, 32, num_layers=2, batch_first=True, bidirectional=True)
        self.head = nn.Linear(64, 8)

    def forward(self, frames):
        return self.head(self.lstm(frames)[0][:, -1])


def net():
    return Speaker().eval()
"""


@pytest.fixture
def speaker(tmp_path, monkeypatch, qv_pipeline):
    """A torch-exported 2-layer bidirectional LSTM speaker embedder (two ``LSTM`` nodes, almost all of its weights)
    and its manifest, INT8 set to ``recurrent: dynamic``."""
    written(tmp_path, monkeypatch, {"bispeaker.py": SPEAKER, "models.yaml": speaker_manifest(
        "bispeaker", "{int8: {calibration: max, recurrent: dynamic}}")})
    return Pipeline(qv_pipeline.cache.root, manifest=tmp_path / "models.yaml")


def _run(model: onnx.ModelProto, feeds: dict) -> list[np.ndarray]:
    return ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, feeds)


@pytest.mark.int8
def test_the_lstm_is_written_as_onnx_runtimes_own_quantizer_writes_it(speaker, tmp_path):
    """The same outputs, to the bit, as the graph ONNX Runtime's ``quantize_dynamic`` writes for the LSTMs (per
    channel, INT8 weights): what an ONNX Runtime user deploys."""
    from onnxruntime.quantization import QuantType, quantize_dynamic

    fp32 = speaker.store.fp32_onnx("speaker")
    theirs = tmp_path / "theirs.onnx"
    quantize_dynamic(str(fp32), str(theirs), op_types_to_quantize=["LSTM"], per_channel=True,
                     weight_type=QuantType.QInt8)
    mine = onnx.load(str(fp32))
    lstms = [node for node in mine.graph.node if node.op_type == "LSTM"]
    assert len(lstms) == 2
    dynamic_lstms(mine, lstms)
    assert [node.op_type for node in mine.graph.node].count("DynamicQuantizeLSTM") == 2
    assert {node.name for node in mine.graph.node} >= {node.name for node in lstms}  # named as the layers were
    frames = {"frames": np.random.default_rng(0).standard_normal((4, 10, 16)).astype(np.float32)}
    theirs_out, mine_out, float_out = _run(onnx.load(str(theirs)), frames), _run(mine, frames), _run(
        onnx.load(str(fp32)), frames)
    assert np.array_equal(theirs_out[0], mine_out[0])
    assert not np.array_equal(float_out[0], mine_out[0])  # quantized: it moved


@pytest.mark.int8
def test_an_lstm_network_gets_an_int8_verdict_on_onnx_runtime_with_its_lstms_counted_in_int8(speaker):
    """Skipped before (1 of 3 layers in INT8); with ``recurrent: dynamic`` its LSTMs run in INT8 and the case is
    judged, by ONNX Runtime's kernels and labelled so, the setting recorded."""
    from quantverdict.judge.semantics import KERNELS

    result = speaker.run(Case("speaker", "int8", "onnxruntime"))
    assert result.status in ("passed", "failed"), result.message
    coverage = result.metrics["coverage"]
    assert coverage["quantized"] == coverage["layers"] == 3, coverage
    recipe = result.metrics["recipe"]
    assert recipe["evaluator"] == KERNELS and recipe["settings"]["recurrent"] == "dynamic"
    assert coverage["kinds"]["DynamicQuantizeLSTM"] == [2, 2], coverage


def test_tensorrts_graph_keeps_the_lstms_in_float_with_the_reason(speaker):
    recipe = speaker.recipes.recipe("speaker", "int8", "native")
    graph = onnx.load(str(speaker.store.fp32_onnx("speaker")))
    assert not [node for node in recipe.quantized_nodes(graph) if node.op_type == "LSTM"]
    reasons = recipe.float_reasons(graph)
    lstms = {node.name for node in graph.graph.node if node.op_type == "LSTM"}
    assert set(reasons) == lstms and all("TensorRT runs LSTM in float" in reasons[name] for name in lstms), reasons


def test_recurrent_takes_float_or_dynamic_and_int8_only():
    with pytest.raises(CalibrationError, match=r"recurrent 'int4': expected one of float, dynamic"):
        get_recipe("int8").configured({"recurrent": "int4"})
    with pytest.raises(CalibrationError, match=r"recurrent: dynamic .* fp8 has none"):
        get_recipe("fp8").configured({"recurrent": "dynamic"})
    assert "recurrent" not in get_recipe("int8").configured({"recurrent": "float"}).params()  # the default's hash


@pytest.mark.int8
def test_recurrent_is_fixed_beside_a_search_and_locked_with_its_choice(speaker, tmp_path, qv_pipeline):
    """``recipe: {int8: {auto: true, recurrent: dynamic}}``: every candidate and the chosen recipe take it, and the
    lock holds it; other settings beside ``auto`` are still refused."""
    from quantverdict.tune.auto import auto_settings

    manifest = tmp_path / "models.yaml"
    manifest.write_text(manifest.read_text().replace("{calibration: max, recurrent: dynamic}",
                                                     "{auto: true, recurrent: dynamic}"))
    pipeline = Pipeline(qv_pipeline.cache.root, manifest=manifest)
    resolved = pipeline.recipes.resolved("speaker", "int8")
    assert resolved.origin == "search" and resolved.search.chosen.recurrent == "dynamic"
    assert resolved.recipe.options.recurrent == "dynamic"
    assert pipeline.recipes.entry("speaker", "int8").settings.recurrent == "dynamic"
    from quantverdict.run.cli import main  # the command decides before searching too: on the recipe with it

    assert main(["lock", "--manifest", str(manifest), "--precisions", "int8", "--cache-dir",
                 str(qv_pipeline.cache.root)]) == 0
    assert "recurrent: dynamic" in (tmp_path / "quantverdict.lock").read_text()
    with pytest.raises(CalibrationError, match="gptq cannot be set beside it"):
        auto_settings({"auto": True, "recurrent": "dynamic", "gptq": True})
